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
    : thread_([held = state_] {
        name_this_thread(kProgressThreadName);
        loop(*held);
      }) {}

ProgressEngine::~ProgressEngine() {
  stop("communicator destroyed");
}

std::shared_ptr<Work> ProgressEngine::submit(const CollectiveDesc& desc, std::function<void()> fn) {
  State& s = *state_;
  auto work = std::make_shared<Work>(desc, std::move(fn), runner_);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopping) {
      work->fail(std::make_exception_ptr(CommError(
          str_cat(work->description(), ": communicator is closed (", s.stop_reason, ")"))));
      return work;
    }
    s.queue.push_back(work);
    s.queued.fetch_add(1, std::memory_order_release);
    wake = s.sleeping;
  }
  if (wake) s.cv.notify_one();
  return work;
}

void ProgressEngine::run_sync(const CollectiveDesc& desc, const std::function<void()>& fn) {
  State& s = *state_;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    if (s.stopping) {
      PYRING_THROW(CommError, desc.str(), ": communicator is closed (", s.stop_reason, ")");
    }
    if (!s.queue.empty() || s.busy) {
      lock.unlock();
      submit(desc, fn)->wait(-1);
      return;
    }
    s.busy = true;
  }
  std::exception_ptr err;
  try {
    fn();
  } catch (...) {
    err = std::current_exception();
  }
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.busy = false;
    wake = (s.sleeping && !s.queue.empty()) || s.stopping;
  }
  if (wake) s.cv.notify_all();  // the thread, or a stop() waiting for this run
  if (err) std::rethrow_exception(err);
}

namespace {
thread_local bool t_on_progress_thread = false;
}  // namespace

bool ProgressEngine::on_progress_thread() {
  return t_on_progress_thread;
}

void ProgressEngine::loop(State& s) {
  t_on_progress_thread = true;
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    if (s.queue.empty() || s.busy) {
      if (s.stopping && s.queue.empty()) return;
      lock.unlock();
      auto start = Clock::now();
      while (s.queued.load(std::memory_order_acquire) == 0 && Clock::now() - start < kIdleSpin) {
        cpu_relax();
      }
      lock.lock();
      if (s.queue.empty() || s.busy) {
        if (s.stopping && s.queue.empty()) return;
        s.sleeping = true;
        s.cv.wait(lock);
        s.sleeping = false;
      }
      continue;
    }
    auto work = std::move(s.queue.front());
    s.queue.pop_front();
    s.queued.fetch_sub(1, std::memory_order_release);
    s.busy = true;
    lock.unlock();
    work->run();     // may destroy the engine (see the header)
    work = nullptr;  // the work's captures go before the lock is retaken
    lock.lock();
    s.busy = false;
  }
}

void ProgressEngine::stop(const std::string& why) {
  State& s = *state_;
  std::deque<std::shared_ptr<Work>> dropped;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.stopping) {
      s.stopping = true;
      s.stop_reason = why;
    }
    dropped.swap(s.queue);
    s.queued.store(0, std::memory_order_release);
  }
  s.cv.notify_all();
  for (auto& w : dropped) {
    w->fail(std::make_exception_ptr(
        CommError(str_cat(w->description(), ": not run, communicator closed (", why, ")"))));
  }
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  if (!on_progress_thread()) {  // a collective running inline on another thread finishes
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return !s.busy; });
  }
  runner_->stop();
}

}  // namespace pyring
