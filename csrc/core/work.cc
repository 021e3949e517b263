#include "core/work.h"

#include <chrono>
#include <cstring>

#include "core/errors.h"
#include "core/types.h"

namespace pyring {

namespace {
constexpr auto kSpin = std::chrono::microseconds(50);
}

std::string CollectiveDesc::str() const {
  if (!has_data) return str_cat(name, "()");
  std::string s = str_cat(name, "(count=", count, ", dtype=", dtype_name(dtype), ", ",
                          count * dtype_size(dtype), " bytes");
  if (op >= 0) s += str_cat(", op=", op_name(static_cast<ReduceOp>(op)));
  if (root >= 0) {
    const bool to_root = std::strcmp(name, "reduce") == 0 || std::strcmp(name, "gather") == 0;
    s += str_cat(to_root ? ", dst=" : ", src=", root);
  }
  return s + ")";
}

Work::Work(CollectiveDesc desc, std::function<void()> fn, std::shared_ptr<CallbackRunner> runner)
    : desc_(desc), fn_(std::move(fn)), runner_(std::move(runner)) {}

void Work::run() {
  std::exception_ptr err;
  try {
    fn_();
  } catch (...) {
    err = std::current_exception();
  }
  fn_ = nullptr;
  complete(err);
}

void Work::fail(std::exception_ptr error) {
  fn_ = nullptr;
  complete(error);
}

void Work::complete(std::exception_ptr error) {
  std::vector<Callback> callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = error;
    state_.store(error ? kFailed : kDone, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  if (callbacks.empty()) return;
  runner_->post([callbacks = std::move(callbacks), error] {
    for (const auto& cb : callbacks) cb(error);
  });
}

bool Work::wait(double timeout_s) {
  if (helper_ && !is_completed()) helper_(*this);
  auto start = Clock::now();
  while (!is_completed() && Clock::now() - start < kSpin) cpu_relax();
  if (!is_completed()) {
    std::unique_lock<std::mutex> lock(mu_);
    auto done = [&] { return state_.load(std::memory_order_acquire) >= kDone; };
    if (timeout_s < 0) {
      cv_.wait(lock, done);
    } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), done)) {
      return false;
    }
  }
  if (state_.load(std::memory_order_acquire) == kFailed) std::rethrow_exception(error_);
  return true;
}

void Work::add_callback(Callback cb) {
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_.load(std::memory_order_acquire) == kPending) {
      callbacks_.push_back(std::move(cb));
      return;
    }
    err = error_;
  }
  cb(err);
}

}  // namespace pyring
