#include "collectives/zero_copy.h"

#include <algorithm>
#include <array>
#include <functional>

#include "collectives/collectives.h"
#include "core/errors.h"
#include "kernels/dispatch.h"

namespace pyring {

namespace {

enum ZeroCopyKind : uint32_t { kAllReduce = 1, kReduceScatter = 2, kAllGather = 3, kBroadcast = 4 };

// Where the cores are far (vCPUs on different core complexes), reading memory a peer just
// wrote costs more than the slots' streamed copies: 2-rank all_reduce on this machine in that
// state took 38 us zero-copy against 9.6 us over slots at 64 KiB, 3.8 ms against 1.6 ms at
// 16 MiB. So calls of at least kSlotsFromBytes time both schedules (SymmetricHeap's timed
// choice) and run the slot schedule where some rank finds it the cheaper (counted apart).
constexpr size_t kSlotsFromBytes = 8 << 10;
constexpr uint32_t kExploreEvery = 64;

// Elements reduced per pass over the sources: small enough that the accumulator stays in cache
// between the sources.
constexpr size_t kTileBytes = 32 << 10;

const KernelSite kHost{};

// One zero-copy call: its phases are base + 1 (entered: this rank's data is in place), base +
// 2 and base + 3 (the algorithm's rounds); each rank raises them in order.
class Call {
 public:
  // `may_use_slots`: the call may run the slot schedule instead (use_slots()).
  Call(Communicator& comm, const char* what, ZeroCopyKind kind, const SymmetricSpan& span,
       size_t bytes, DType dtype, int op, int root, Deadline deadline, bool may_use_slots = false)
      : heap_(*comm.symmetric()),
        may_use_slots_(may_use_slots && bytes >= kSlotsFromBytes),
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
    c.alloc = span.alloc->id;
    c.offset = span.offset;
    c.bytes = bytes;
    c.dtype = static_cast<int32_t>(dtype);
    c.op = op;
    if (may_use_slots_) {
      class_ = SymmetricHeap::size_class(bytes);
      bytes_ = bytes;
      c.far = heap_.prefers_slots(class_);
      // The first 2 * kCostSamples calls of a class alternate, so that both schedules are
      // timed from the start.
      const uint64_t k = heap_.next_candidate(class_);
      const uint64_t warm = 2 * SymmetricHeap::kCostSamples;
      explore_ = k <= warm ? k % 2 == 0 : k % kExploreEvery == 0;
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
                     c.op, ", root ", c.root, "}");
    };
    // all_gather's inputs may lie at different offsets (each rank's own chunk of the output).
    const bool same_offset = mine.kind == kAllGather || theirs.offset == mine.offset;
    PYRING_CHECK(theirs.seq == mine.seq && theirs.kind == mine.kind && theirs.alloc == mine.alloc &&
                     same_offset && theirs.bytes == mine.bytes && theirs.dtype == mine.dtype &&
                     theirs.op == mine.op && theirs.root == mine.root,
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

// out[0, n) = op over srcs[k][0, n), k in the order given, tile by tile; out may be the last
// source (element for element). `acc` holds kTileBytes of the accumulation type.
void reduce_sources(DType dtype, ReduceOp op, const Sources& srcs, uint8_t* out, size_t n,
                    int world, uint8_t* acc) {
  const size_t es = dtype_size(dtype);
  const size_t ws = dtype_size(accum_dtype(dtype));
  const size_t k = srcs.size();
  if (k == 1) {
    kern::finish_single(kHost, dtype, srcs[0], out, n);
    return;
  }
  const bool same = accum_dtype(dtype) == dtype;
  const size_t tile = kTileBytes / ws;
  for (size_t at = 0; at < n; at += tile) {
    const size_t m = std::min(tile, n - at);
    auto src = [&](size_t i) { return srcs[i] + at * es; };
    const void* b = nullptr;
    size_t next = 1;
    if (same) {
      b = src(0);  // already the accumulation type
    } else {
      kern::widen(kHost, dtype, src(0), acc, m);
      b = acc;
    }
    for (; next + 1 < k; ++next) {
      kern::accumulate(kHost, dtype, op, src(next), b, acc, m);
      b = acc;
    }
    kern::finish(kHost, dtype, op, src(k - 1), b, out + at * es, m, world);
  }
}

// Element ranges of the two-shot chunks: rank r owns [first(r), first(r + 1)).
size_t chunk_first(size_t count, int world, int r) {
  const size_t w = static_cast<size_t>(world);
  const size_t per = ((count + w - 1) / w + 15) / 16 * 16;  // whole lines; per * world >= count
  return std::min(count, per * static_cast<size_t>(r));     // the last ends at count
}

}  // namespace

bool zero_copy_possible(const Communicator& comm) {
  const SymmetricHeap* h = comm.symmetric();
  return h && h->any() && h->whole(comm.size()) && comm.size() > 1;
}

void zero_copy_allreduce(Communicator& comm, const SymmetricSpan& si, const SymmetricSpan& so,
                         const BufferView& in, const BufferView& out, ReduceOp op,
                         Deadline deadline) {
  const size_t bytes = in.bytes(), es = dtype_size(in.dtype), n = in.count;
  const bool in_place = in.data == out.data;
  const bool staged = bytes <= kOneShotBytes && comm.size() > 2;
  const bool one_shot = staged || (!in_place && !so);
  Call call(comm, "zero-copy all_reduce", kAllReduce, si, bytes, in.dtype, static_cast<int>(op), -1,
            deadline, true);
  const int w = call.world(), me = call.me();
  auto slots = [&] {
    call.run_slots([&](Deadline d) { allreduce(comm, in, out, op, comm.options().algo, d); });
  };
  auto counted = [&] {
    call.count(one_shot);
    if (comm.options().log_level >= 1) {  // the key costs a string per call
      comm.log_once(1, str_cat("zero-copy/all_reduce/", staged, "/", one_shot), [&] {
        return str_cat("all_reduce ", bytes, " B: zero-copy ",
                       staged ? "one-shot from each rank's staging area (small: one round of flags)"
                       : one_shot
                           ? "one-shot (a private output)"
                           : "two-shot (each rank reduces its chunk, then copies the others')");
      });
    }
  };
  uint8_t* acc = comm.scratch(kTileBytes);
  Sources srcs;
  if (staged) {
    // Each rank copies its input into its staging area, so it may write its own buffer at once:
    // no peer reads the buffer, and the call needs no round after the reduction.
    if (bytes > 0) kern::copy(kHost, call.own_staging(), in.data, bytes);
    call.start();
    for (int li = 0; li < w; ++li) srcs.push_back(call.staging(li));
    call.wait_all(1);
    if (call.use_slots()) return slots();
    counted();
    if (n > 0) reduce_sources(in.dtype, op, srcs, static_cast<uint8_t*>(out.data), n, w, acc);
    call.moved(bytes * static_cast<size_t>(w - 1));
    call.timed();
    return;
  }
  call.start();
  call.wait_all(1);
  if (call.use_slots()) return slots();
  counted();
  if (one_shot) {  // into the private output, in rank order, reading the peers' inputs
    for (int li = 0; li < w; ++li) srcs.push_back(si.at(static_cast<size_t>(li)));
    reduce_sources(in.dtype, op, srcs, static_cast<uint8_t*>(out.data), n, w, acc);
    call.post(2);  // done reading the peers' inputs
    call.moved(bytes * static_cast<size_t>(w - 1));
    call.wait_all(2);
    call.timed();
    return;
  }
  // Two-shot: rank r reduces chunk r into its own output, then copies the others' chunks.
  const SymmetricSpan& dst = in_place ? si : so;
  const size_t f = chunk_first(n, w, me), l = chunk_first(n, w, me + 1);
  for (int li = 0; li < w; ++li) {  // the peers in rank order, this rank's own last
    if (li != me) srcs.push_back(si.at(static_cast<size_t>(li)) + f * es);
  }
  srcs.push_back(static_cast<const uint8_t*>(in.data) + f * es);
  if (l > f) {
    reduce_sources(in.dtype, op, srcs, static_cast<uint8_t*>(out.data) + f * es, l - f, w, acc);
  }
  call.post(2);  // this rank's chunk is reduced, and it reads the peers' inputs no more
  call.wait_all(2);
  size_t read = (l - f) * es * static_cast<size_t>(w - 1);
  for (int li = 0; li < w; ++li) {
    if (li == me) continue;
    const size_t pf = chunk_first(n, w, li), pl = chunk_first(n, w, li + 1);
    if (pl > pf) {
      kern::copy(kHost, static_cast<uint8_t*>(out.data) + pf * es,
                 dst.at(static_cast<size_t>(li)) + pf * es, (pl - pf) * es);
      read += (pl - pf) * es;
    }
  }
  call.post(3);  // done reading the peers' outputs
  call.moved(read);
  call.wait_all(3);
  call.timed();
}

void zero_copy_reduce_scatter(Communicator& comm, const SymmetricSpan& si, const BufferView& in,
                              const BufferView& out, ReduceOp op, Deadline deadline) {
  const size_t es = dtype_size(in.dtype), m = out.count;
  Call call(comm, "zero-copy reduce_scatter", kReduceScatter, si, in.bytes(), in.dtype,
            static_cast<int>(op), -1, deadline, true);
  const int w = call.world(), me = call.me();
  call.start();
  const size_t f = static_cast<size_t>(me) * m;
  Sources srcs;
  for (int li = 0; li < w; ++li) {
    if (li != me) srcs.push_back(si.at(static_cast<size_t>(li)) + f * es);
  }
  srcs.push_back(static_cast<const uint8_t*>(in.data) + f * es);
  uint8_t* scratch = comm.scratch(kTileBytes);
  call.wait_all(1);
  if (call.use_slots()) {
    return call.run_slots([&](Deadline d) { reduce_scatter(comm, in, out, op, d); });
  }
  call.count(false);
  if (m > 0) reduce_sources(in.dtype, op, srcs, static_cast<uint8_t*>(out.data), m, w, scratch);
  call.post(2);
  call.moved(m * es * static_cast<size_t>(w - 1));
  call.wait_all(2);
  call.timed();
}

void zero_copy_allgather(Communicator& comm, const SymmetricSpan& si, const BufferView& in,
                         const BufferView& out, Deadline deadline) {
  const size_t bytes = in.bytes();
  Call call(comm, "zero-copy all_gather", kAllGather, si, bytes, in.dtype, -1, -1, deadline, true);
  const int w = call.world(), me = call.me();
  call.start();
  call.wait_all(1);
  if (call.use_slots()) return call.run_slots([&](Deadline d) { allgather(comm, in, out, d); });
  call.count(false);
  auto* o = static_cast<uint8_t*>(out.data);
  if (o + static_cast<size_t>(me) * bytes != in.data && bytes > 0) {
    kern::copy(kHost, o + static_cast<size_t>(me) * bytes, in.data, bytes);
  }
  for (int li = 0; li < w; ++li) {
    if (li != me && bytes > 0) {
      kern::copy(kHost, o + static_cast<size_t>(li) * bytes,
                 si.alloc->bases[static_cast<size_t>(li)] + call.offset_of(li), bytes);
    }
  }
  call.post(2);
  call.moved(bytes * static_cast<size_t>(w - 1));
  call.wait_all(2);
  call.timed();
}

void zero_copy_broadcast(Communicator& comm, const SymmetricSpan& sb, const BufferView& buf,
                         int root, Deadline deadline) {
  const size_t bytes = buf.bytes();
  Call call(comm, "zero-copy broadcast", kBroadcast, sb, bytes, buf.dtype, -1, root, deadline);
  const int me = call.me();
  call.count(false);
  call.start();
  if (me == root) {  // every peer has copied the root's buffer
    call.wait_all(1);
    call.wait_all(2);
    return;
  }
  call.wait(root, 1);
  if (bytes > 0) kern::copy(kHost, buf.data, sb.at(static_cast<size_t>(root)), bytes);
  call.post(2);
  call.moved(bytes);
}

}  // namespace pyring
