#include "core/progress.h"

#include <chrono>

#include "core/errors.h"
#include "core/thread_name.h"
#include "core/types.h"

namespace pyring {

namespace {
// How long the idle thread polls for new work before it sleeps.
constexpr auto kIdleSpin = std::chrono::microseconds(30);
}  // namespace

ProgressEngine::ProgressEngine()
    : thread_([this] {
        name_this_thread(kProgressThreadName);
        loop();
      }) {}

ProgressEngine::~ProgressEngine() {
  stop("communicator destroyed");
}

std::shared_ptr<Work> ProgressEngine::submit(const CollectiveDesc& desc, std::function<void()> fn) {
  auto work = std::make_shared<Work>(desc, std::move(fn), runner_);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      work->fail(std::make_exception_ptr(CommError(
          str_cat(work->description(), ": communicator is closed (", stop_reason_, ")"))));
      return work;
    }
    queue_.push_back(work);
    queued_.fetch_add(1, std::memory_order_release);
    wake = sleeping_;
  }
  if (wake) cv_.notify_one();
  return work;
}

void ProgressEngine::run_sync(const CollectiveDesc& desc, const std::function<void()>& fn) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) {
      PYRING_THROW(CommError, desc.str(), ": communicator is closed (", stop_reason_, ")");
    }
    if (!queue_.empty() || busy_) {
      lock.unlock();
      submit(desc, fn)->wait(-1);
      return;
    }
    busy_ = true;
  }
  std::exception_ptr err;
  try {
    fn();
  } catch (...) {
    err = std::current_exception();
  }
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    wake = sleeping_ && !queue_.empty();
  }
  if (wake) cv_.notify_one();
  if (err) std::rethrow_exception(err);
}

namespace {
thread_local bool t_on_progress_thread = false;
}  // namespace

bool ProgressEngine::on_progress_thread() {
  return t_on_progress_thread;
}

void ProgressEngine::loop() {
  t_on_progress_thread = true;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (queue_.empty() || busy_) {
      if (stopping_ && queue_.empty()) return;
      lock.unlock();
      auto start = Clock::now();
      while (queued_.load(std::memory_order_acquire) == 0 && Clock::now() - start < kIdleSpin) {
        cpu_relax();
      }
      lock.lock();
      if (queue_.empty() || busy_) {
        if (stopping_ && queue_.empty()) return;
        sleeping_ = true;
        cv_.wait(lock);
        sleeping_ = false;
      }
      continue;
    }
    auto work = queue_.front();
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_release);
    busy_ = true;
    lock.unlock();
    work->run();
    lock.lock();
    busy_ = false;
  }
}

void ProgressEngine::stop(const std::string& why) {
  std::deque<std::shared_ptr<Work>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      stop_reason_ = why;
    }
    dropped.swap(queue_);
    queued_.store(0, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& w : dropped) {
    w->fail(std::make_exception_ptr(
        CommError(str_cat(w->description(), ": not run, communicator closed (", why, ")"))));
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  runner_->stop();
}

}  // namespace pyring
