#include "core/callbacks.h"

#include "core/thread_name.h"

namespace pyring {

CallbackRunner::~CallbackRunner() {
  stop();
}

void CallbackRunner::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      queue_.push_back(std::move(task));
      if (idle_ < static_cast<int>(queue_.size()) &&
          static_cast<int>(threads_.size()) < kMaxThreads) {
        threads_.emplace_back([this] {
          name_this_thread(kCallbackThreadName);
          loop();
        });
      }
      cv_.notify_one();
      return;
    }
  }
  task();
}

void CallbackRunner::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty()) return;  // stopping, nothing left
    auto task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // the task's captures go before the lock is retaken
    lock.lock();
  }
}

void CallbackRunner::stop() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) {
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();  // a callback that closed its own communicator
    } else {
      t.join();
    }
  }
}

}  // namespace pyring
