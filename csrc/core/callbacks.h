// Completion callbacks run here, never on a progress thread.
//
// User code attached to a work (a torch future's then(), a DDP hook's continuation) may launch
// collectives and wait on them. Those collectives need the progress thread, so callbacks run on
// a runner thread instead. Tasks start in the order they were posted; when every runner thread
// is busy (a callback blocked on a later collective, whose own callbacks must run meanwhile) a
// thread is added, up to kMaxThreads. Threads start on the first post.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
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
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  std::vector<std::thread> threads_;         // guarded by mu_
  int idle_ = 0;                             // threads waiting for a task; guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
};

}  // namespace pyring
