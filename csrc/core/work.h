// The handle of one queued collective.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/callbacks.h"
#include "core/types.h"

namespace pyring {

// What a collective is, for messages; formatted only when a message needs it.
struct CollectiveDesc {
  const char* name = "";
  size_t count = 0;
  DType dtype = DType::kFloat32;
  int op = -1;    // a ReduceOp, or -1
  int root = -1;  // the broadcast source, or -1
  bool has_data = true;

  // e.g. "all_reduce(count=1024, dtype=float32, 4096 bytes, op=sum)"
  std::string str() const;
};

class Work {
 public:
  // Called once with the error (null on success): on a thread of `runner` when the work
  // completes, or on the adding thread when it already has.
  using Callback = std::function<void(std::exception_ptr)>;

  Work(CollectiveDesc desc, std::function<void()> fn, std::shared_ptr<CallbackRunner> runner);

  std::string description() const { return desc_.str(); }
  bool is_completed() const { return state_.load(std::memory_order_acquire) >= kDone; }
  bool failed() const { return state_.load(std::memory_order_acquire) == kFailed; }

  // Waits until the work completes or `timeout_s` passes (negative: no limit of its own; the
  // collective's deadline still applies). Returns false on timeout; rethrows the collective's
  // error. Spins briefly, then blocks.
  bool wait(double timeout_s);

  // Runs `cb` at completion, or now on the calling thread when already complete.
  void add_callback(Callback cb);

  // Runs the collective on the calling thread and completes the work. Called once.
  void run();
  // Completes the work with `error` without running it.
  void fail(std::exception_ptr error);
  // Completes a work that has no function (one whose engine completes it); null: success.
  void finish(std::exception_ptr error) { complete(error); }

  // Called by wait() before it blocks, on the waiting thread, to drive the work's engine.
  // Set once, before the work is shared.
  void set_helper(std::function<void(const Work&)> helper) { helper_ = std::move(helper); }
  // The rank a received message came from; -1 until a receive completes.
  int source() const { return source_.load(std::memory_order_acquire); }
  void set_source(int rank) { source_.store(rank, std::memory_order_release); }

 private:
  enum State : int { kPending = 0, kDone = 1, kFailed = 2 };
  void complete(std::exception_ptr error);

  CollectiveDesc desc_;
  std::function<void()> fn_;
  std::atomic<int> state_{kPending};
  std::exception_ptr error_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Callback> callbacks_;
  std::shared_ptr<CallbackRunner> runner_;
  std::function<void(const Work&)> helper_;
  std::atomic<int> source_{-1};
};

}  // namespace pyring
