#include "core/callbacks.h"

#include "core/thread_name.h"

namespace pyring {

CallbackRunner::~CallbackRunner() {
  stop();
}

void CallbackRunner::post(std::function<void()> task) {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.stopping) {
      s.queue.push_back(std::move(task));
      if (s.idle < static_cast<int>(s.queue.size()) &&
          static_cast<int>(s.threads.size()) < kMaxThreads) {
        s.threads.emplace_back([held = state_] {
          name_this_thread(kCallbackThreadName);
          loop(*held);
        });
      }
      s.cv.notify_one();
      return;
    }
  }
  task();
}

void CallbackRunner::loop(State& s) {
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    ++s.idle;
    s.cv.wait(lock, [&s] { return s.stopping || !s.queue.empty(); });
    --s.idle;
    if (s.queue.empty()) return;  // stopping, nothing left
    auto task = std::move(s.queue.front());
    s.queue.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // the task's captures go before the lock is retaken
    lock.lock();
  }
}

void CallbackRunner::stop() {
  State& s = *state_;
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stopping = true;
    threads.swap(s.threads);
  }
  s.cv.notify_all();
  for (auto& t : threads) {
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();  // a callback that closed its own communicator, or released the runner
    } else {
      t.join();
    }
  }
}

}  // namespace pyring
