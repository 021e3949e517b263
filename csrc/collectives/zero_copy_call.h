// The parts every zero-copy collective shares (zero_copy.h): the phases and checks of one call,
// and how two-shot cuts a buffer into chunks. Internal to collectives/zero_copy*.cc.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/communicator.h"
#include "core/errors.h"
#include "core/symmetric.h"
#include "core/types.h"

namespace pyring::zero_copy {

enum ZeroCopyKind : uint32_t {
  kAllReduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kHostsAllReduce = 5,
  kBarrier = 6,
};

// Where the cores are far (vCPUs on different core complexes), reading memory a peer just
// wrote costs more than the slots' streamed copies: 2-rank all_reduce on this machine in that
// state took 38 us zero-copy against 9.6 us over slots at 64 KiB, 3.8 ms against 1.6 ms at
// 16 MiB. So calls of at least kSlotsFromBytes time both schedules (SymmetricHeap's timed
// choice) and run the slot schedule where some rank finds it the cheaper (counted apart).
//
// Not where the host's ranks outnumber their cores: there each hand-off between ranks costs a
// turn on a core, and the slots take 2 (n - 1) of them per call against zero-copy's 2. At 4
// ranks on the 2-core machine (bench/allreduce.py --world 4, 10 runs) the slots took 305-924
// us at 64 KiB and 8.8-13.4 ms at 16 MiB, zero-copy 4.8-6.2 ms at 16 MiB in every run and
// 71-120 us at 64 KiB in the 8 runs where the timing kept it; the per-call times are so noisy
// there that in the other 2 some rank's timing preferred the slots for a while, and the 64 KiB
// all_reduce took 104-838 us.
constexpr size_t kSlotsFromBytes = 8 << 10;
constexpr uint32_t kExploreEvery = 64;

// Whether the k-th call (from 1) of a size class tries the way its timed choice does not
// prefer: every second of the first 2 * kCostSamples, so that both ways are timed from the
// start, then every kExploreEvery-th, so that both stay timed.
inline bool explores(uint64_t k) {
  return k <= 2 * SymmetricHeap::kCostSamples ? k % 2 == 0 : k % kExploreEvery == 0;
}

// One zero-copy call: its phases are base + 1 (entered: this rank's data is in place), base +
// 2 and base + 3 (the algorithm's rounds); each rank raises them in order.
class Call {
 public:
  // `may_use_slots`: the call may run the slot schedule instead (use_slots()).
  Call(Communicator& comm, const char* what, ZeroCopyKind kind, const SymmetricSpan& span,
       size_t bytes, DType dtype, int op, int root, Deadline deadline, bool may_use_slots = false)
      : heap_(*comm.symmetric()),
        may_use_slots_(may_use_slots && bytes >= kSlotsFromBytes && !heap_.shared_cores()),
        deadline_(deadline),
        what_(what),
        spin_us_(comm.spin_us()),
        seq_(comm.seq()),
        n_(heap_.local_world()),
        me_(heap_.local_index()) {
    heap_.enter(seq_, true);
    base_ = heap_.next_base();
    SymmetricCall& c = heap_.control(me_).call[parity()];
    c.seq = seq_;
    c.kind = kind;
    c.root = root;
    c.alloc = span ? span.alloc->id : 0;  // empty for a barrier
    c.offset = span ? span.offset : 0;
    c.bytes = bytes;
    c.dtype = static_cast<int32_t>(dtype);
    c.op = op;
    c.out_alloc = 0;
    c.out_offset = 0;
    if (may_use_slots_) {
      class_ = SymmetricHeap::size_class(bytes);
      bytes_ = bytes;
      c.far = heap_.prefers_slots(class_);
      explore_ = explores(heap_.next_candidate(class_));
    }
  }

  // After the entry round, alike on every rank: whether this call runs the slot schedule:
  // where some rank's timed choice prefers it, except every kExploreEvery-th call of its size
  // class (and every second of its first ones), which runs the other schedule so that its cost
  // is timed again. Starts the call's timing.
  bool use_slots() {
    if (!may_use_slots_) return false;
    bool any = false;
    for (int li = 0; li < n_; ++li) any = any || heap_.control(li).call[parity()].far != 0;
    slots_ = explore_ ? !any : any;
    t0_ = Clock::now();
    return slots_;
  }
  // Ends the call's timing (a call that took the other schedule's path does not time it).
  void timed() {
    if (!may_use_slots_ || bytes_ == 0) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_);
    heap_.add_cost(class_, slots_, static_cast<uint64_t>(ns.count()) * 1024 / bytes_);
  }
  // all_reduce: where this rank's output is (`so`, or the input's span where in place; empty:
  // private), so that the ranks check they agree before any writes or reads another's. Call
  // before start().
  void output(const SymmetricSpan& so) {
    SymmetricCall& c = heap_.control(me_).call[parity()];
    c.out_alloc = so ? so.alloc->id : 0;
    c.out_offset = so ? so.offset : 0;
  }
  // Enters: this rank's data is in place for the peers.
  void start() { heap_.raise(base_ + 1); }
  // This rank's staging area for this call (the two alternate), once every peer has entered
  // the call before, and so is done reading it for the call before that.
  uint8_t* own_staging() {
    // The call before saw every peer enter it where its entry round waited for all of them.
    if (heap_.calls_entered() > 1 && !heap_.saw_all_enter(base_ - 4)) {
      for (int li = 0; li < n_; ++li) {
        if (li != me_) heap_.wait(static_cast<size_t>(li), base_ - 3, spin_us_, deadline_, what_);
      }
    }
    return heap_.staging(static_cast<size_t>(me_), parity());
  }
  uint8_t* staging(int li) const { return heap_.staging(static_cast<size_t>(li), parity()); }
  int world() const { return n_; }
  int me() const { return me_; }
  void post(uint32_t k) { heap_.raise(base_ + k); }
  // Waits for local rank li's phase k; on the entry phase checks its call against this one's.
  void wait(int li, uint32_t k) {
    heap_.wait(static_cast<size_t>(li), base_ + k, spin_us_, deadline_, what_, k == 1 ? seq_ : 0);
    if (k == 1) check(li);
  }
  void wait_all(uint32_t k) {
    for (int li = 0; li < n_; ++li) {
      if (li != me_) wait(li, k);
    }
    if (k == 1) heap_.set_saw_all_enter(base_);
  }
  void moved(size_t bytes) { heap_.add_zero_copy_bytes(bytes); }
  // The offset local rank li posted (valid after its entry phase).
  size_t offset_of(int li) const { return heap_.control(li).call[parity()].offset; }
  void count(bool one_shot) { heap_.count_call(one_shot); }
  // Runs fn, the slot schedule of the call, instead (use_slots()).
  void run_slots(const std::function<void(Deadline)>& fn) {
    heap_.count_slot_call();
    fn(deadline_);
    timed();
  }

 private:
  uint32_t parity() const { return (base_ / 4) & 1; }
  void check(int li) const {
    const SymmetricCall& mine = heap_.control(me_).call[parity()];
    const SymmetricCall& theirs = heap_.control(li).call[parity()];
    auto text = [](const SymmetricCall& c) {
      return str_cat("{collective #", c.seq, ", kind ", c.kind, ", allocation ", c.alloc,
                     " at offset ", c.offset, ", ", c.bytes, " bytes, dtype ", c.dtype, ", op ",
                     c.op, ", root ", c.root, ", output ",
                     c.out_alloc ? str_cat("allocation ", c.out_alloc, " at offset ", c.out_offset)
                                 : std::string("private"),
                     "}");
    };
    // all_gather's inputs may lie at different offsets (each rank's own chunk of the output).
    const bool same_offset = mine.kind == kAllGather || theirs.offset == mine.offset;
    PYRING_CHECK(theirs.seq == mine.seq && theirs.kind == mine.kind && theirs.alloc == mine.alloc &&
                     same_offset && theirs.bytes == mine.bytes && theirs.dtype == mine.dtype &&
                     theirs.op == mine.op && theirs.root == mine.root &&
                     theirs.out_alloc == mine.out_alloc && theirs.out_offset == mine.out_offset,
                 CommError, what_, ": ranks disagree on the zero-copy call: rank ",
                 heap_.global_rank(static_cast<size_t>(li)), " posted ", text(theirs),
                 ", this rank ", text(mine));
  }

  SymmetricHeap& heap_;
  bool may_use_slots_;
  bool explore_ = false;
  bool slots_ = false;
  int class_ = 0;
  size_t bytes_ = 0;
  Clock::time_point t0_{};
  Deadline deadline_;
  const char* what_;
  int spin_us_;
  uint64_t seq_;
  int n_;
  int me_;
  uint32_t base_ = 0;
};

// The sources of a reduction, one per local rank, without an allocation per call.
struct Sources {
  std::array<const uint8_t*, kMaxLocalWorld> p;  // [0, n) set
  size_t n = 0;
  void push_back(const uint8_t* s) { p[n++] = s; }
  size_t size() const { return n; }
  const uint8_t* operator[](size_t i) const { return p[i]; }
};

// Element ranges of the two-shot chunks: rank r owns [first(r), first(r + 1)).
inline size_t chunk_first(size_t count, int world, int r) {
  const size_t w = static_cast<size_t>(world);
  const size_t per = ((count + w - 1) / w + 15) / 16 * 16;  // whole lines; per * world >= count
  return std::min(count, per * static_cast<size_t>(r));     // the last ends at count
}

}  // namespace pyring::zero_copy
