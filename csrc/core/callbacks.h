// Completion callbacks run here, never on a progress thread.
//
// User code attached to a work (a torch future's then(), a DDP hook's continuation) may launch
// collectives and wait on them. Those collectives need the progress thread, so callbacks run on
// a runner thread instead. Tasks start in the order they were posted; when every runner thread
// is busy (a callback blocked on a later collective, whose own callbacks must run meanwhile) a
// thread is added, up to kMaxThreads. Threads start on the first post.
//
// A task may drop the last reference to its runner (a callback that releases the communicator
// and its works): the runner is then destroyed on its own thread, which is detached and keeps
// the queue's state alive until it has left its loop.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pyring {

class CallbackRunner {
 public:
  static constexpr int kMaxThreads = 16;

  CallbackRunner() = default;
  ~CallbackRunner();  // stop()s
  CallbackRunner(const CallbackRunner&) = delete;
  CallbackRunner& operator=(const CallbackRunner&) = delete;

  // Queues `task`; after stop() it runs on the calling thread instead. Thread-safe.
  void post(std::function<void()> task);
  // Runs what is queued, then joins the threads (but never the calling one). Idempotent.
  void stop();

 private:
  // Shared by the runner and its threads, each of which holds it until it returns.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;  // guarded by mu
    std::vector<std::thread> threads;         // guarded by mu
    int idle = 0;                             // threads waiting for a task; guarded by mu
    bool stopping = false;                    // guarded by mu
  };
  static void loop(State& s);

  const std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace pyring
