#include "device/sim/sim_stream.h"

#include <chrono>
#include <random>

#include "core/errors.h"
#include "core/thread_name.h"

namespace pyring {

void SimContext::set_fault(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!fault_.empty()) return;
  fault_ = what;
  faulted_.store(true, std::memory_order_release);
}

std::string SimContext::fault() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fault_;
}

SimStream::SimStream(const std::atomic<int>* delay_us, std::shared_ptr<SimContext> context,
                     bool blocking)
    : delay_us_(delay_us), context_(std::move(context)), blocking_(blocking) {
  thread_ = std::thread([this] {
    name_this_thread(kSimStreamThreadName);
    run();
  });
}

SimStream::~SimStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  thread_.join();
}

void SimStream::enqueue(std::function<void()> op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(op));
    ++queued_;
  }
  cv_.notify_all();
}

void SimStream::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = queued_;
  cv_.wait(lock, [&] { return done_ >= target; });
  lock.unlock();
  const std::string err = error();
  PYRING_CHECK(err.empty(), CudaError, "sim stream: ", err);
}

uint64_t SimStream::queued() {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

void SimStream::wait_done(uint64_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= n || stopping_.load(); });
}

std::string SimStream::error() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) return error_;
  }
  return context_->fault();
}

bool SimStream::drain_for(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = queued_;
  return cv_.wait_for(lock, limit, [&] { return done_ >= target; });
}

void SimStream::set_waiting(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  waiting_ = std::move(what);
}

std::string SimStream::waiting() {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_;
}

void SimStream::run() {
  std::minstd_rand rng(std::random_device{}());
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !queue_.empty() || stopping_.load(); });
    if (queue_.empty()) return;
    auto op = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    const int bound = delay_us_->load(std::memory_order_relaxed);
    if (bound > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % (bound + 1)));
    }
    std::string error;
    bool stopped = false;
    {
      std::lock_guard<std::mutex> held(mu_);
      stopped = !error_.empty();
    }
    // A stream that failed, or whose device faulted, runs nothing more.
    if (!stopped && !context_->faulted()) {
      try {
        op();
      } catch (const SimFault& e) {
        context_->set_fault(e.what());
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    lock.lock();
    if (error_.empty()) error_ = error;
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace pyring
