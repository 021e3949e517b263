// The progress engine: one thread per communicator that runs collectives in submission order.
//
// A collective may drop the last reference to its communicator (its closure held it), so the
// engine can be destroyed on its own thread. That thread is then detached; it holds the queue's
// state until it has left its loop and touches nothing else of the engine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/work.h"

namespace pyring {

class ProgressEngine {
 public:
  // True on a progress thread (its collectives share the core with the caller's compute).
  static bool on_progress_thread();

  ProgressEngine();
  ~ProgressEngine();  // stop()s
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // Queues `fn`; the returned work completes after every earlier submission. Thread-safe.
  std::shared_ptr<Work> submit(const CollectiveDesc& desc, std::function<void()> fn);

  // Runs `fn` to completion in submission order and rethrows its error. When nothing is queued
  // or running it runs on the calling thread, which avoids a cross-thread wake-up.
  void run_sync(const CollectiveDesc& desc, const std::function<void()>& fn);

  // Completes queued work with `error` (a CommError naming why), joins the thread (detaches it
  // when called on it), waits for a collective running inline on another thread (run_sync),
  // then runs the callbacks still queued. Idempotent; the work already running finishes first,
  // and none runs after it returns (unless called on the progress thread).
  void stop(const std::string& why);

 private:
  // Shared by the engine and its thread, which holds it until it returns.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::shared_ptr<Work>> queue;  // guarded by mu
    bool busy = false;        // a collective is running (on the thread or inline); guarded by mu
    bool sleeping = false;    // the thread waits on cv; guarded by mu
    bool stopping = false;    // guarded by mu
    std::string stop_reason;  // guarded by mu
    std::atomic<size_t> queued{0};
  };
  static void loop(State& s);

  const std::shared_ptr<State> state_ = std::make_shared<State>();
  // Declared before thread_: the thread's last completions may still post to it.
  std::shared_ptr<CallbackRunner> runner_ = std::make_shared<CallbackRunner>();
  std::thread thread_;
};

}  // namespace pyring
