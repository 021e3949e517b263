// The progress engine: one thread per communicator that runs collectives in submission order.
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

  // Completes queued work with `error` (a CommError naming why), joins the thread, then runs
  // the callbacks still queued. Idempotent; the work already running finishes first.
  void stop(const std::string& why);

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Work>> queue_;
  bool busy_ = false;      // a collective is running (on the thread or inline); guarded by mu_
  bool sleeping_ = false;  // the thread waits on cv_; guarded by mu_
  bool stopping_ = false;  // guarded by mu_
  std::string stop_reason_;
  std::atomic<size_t> queued_{0};
  // Declared before thread_: the thread's last completions may still post to it.
  std::shared_ptr<CallbackRunner> runner_ = std::make_shared<CallbackRunner>();
  std::thread thread_;
};

}  // namespace pyring
