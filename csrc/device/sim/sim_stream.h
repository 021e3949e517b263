// One sim stream: a worker thread that runs queued operations in order, each after a random
// delay of at most the runtime's bound. Errors are sticky, as CUDA's: once an operation of the
// stream has failed, or any operation of its device has faulted (SimContext), the stream runs
// nothing more and reports the first error.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace pyring {

// Thrown by an operation that faults its device (a kernel writing out of bounds): every stream
// of the device stops, as a CUDA context does on an illegal address.
class SimFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One sim device's context: its first fault, shared by its streams. Any thread.
class SimContext {
 public:
  void set_fault(const std::string& what);  // the first fault stays
  std::string fault() const;
  bool faulted() const { return faulted_.load(std::memory_order_acquire); }

 private:
  mutable std::mutex mu_;
  std::string fault_;  // guarded by mu_
  std::atomic<bool> faulted_{false};
};

class SimStream {
 public:
  // `delay_us` is read before every operation; `context` is the device's. `blocking`: the
  // stream synchronizes with the device's legacy default stream (CUDA's streams made without
  // cudaStreamNonBlocking, and the legacy default stream itself).
  SimStream(const std::atomic<int>* delay_us, std::shared_ptr<SimContext> context, bool blocking);
  // Runs what is queued, then stops the thread.
  ~SimStream();
  SimStream(const SimStream&) = delete;
  SimStream& operator=(const SimStream&) = delete;

  void enqueue(std::function<void()> op);
  // Blocks until every operation queued before the call has run. Throws CudaError with the
  // first error an operation of this stream threw (the stream's error is sticky, as CUDA's).
  void synchronize();
  bool blocking() const { return blocking_; }
  // Operations queued so far; wait_done(n) blocks until the first n have run (or the stream
  // is being destroyed).
  uint64_t queued();
  void wait_done(uint64_t n);
  // The stream's sticky error (its own first failure, else its device's fault); "" if none.
  std::string error();
  const SimContext& context() const { return *context_; }
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
  std::shared_ptr<SimContext> context_;
  const bool blocking_;
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
