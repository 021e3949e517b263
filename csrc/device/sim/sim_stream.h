// One sim stream: a worker thread that runs queued operations in order, each after a random
// delay of at most the runtime's bound.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace pyring {

class SimStream {
 public:
  // `delay_us` is read before every operation.
  explicit SimStream(const std::atomic<int>* delay_us);
  // Runs what is queued, then stops the thread.
  ~SimStream();
  SimStream(const SimStream&) = delete;
  SimStream& operator=(const SimStream&) = delete;

  void enqueue(std::function<void()> op);
  // Blocks until every operation queued before the call has run. Throws CudaError with the
  // first error an operation of this stream threw (the stream's error is sticky, as CUDA's).
  void synchronize();
  // Waits up to `limit` for every operation queued before the call to run; false when some
  // has not. Ignores the stream's error.
  bool drain_for(std::chrono::milliseconds limit);
  // True once the stream is being destroyed: a wait inside an operation should give up.
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  // What the running operation waits for ("" when it does not), for messages.
  void set_waiting(std::string what);
  std::string waiting();

 private:
  void run();

  const std::atomic<int>* delay_us_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t queued_ = 0;  // guarded by mu_
  uint64_t done_ = 0;    // guarded by mu_
  std::string error_;    // guarded by mu_
  std::string waiting_;  // guarded by mu_
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace pyring
