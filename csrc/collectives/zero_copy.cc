#include "collectives/zero_copy.h"

#include <algorithm>
#include <vector>

#include "core/errors.h"
#include "kernels/dispatch.h"

namespace pyring {

namespace {

enum ZeroCopyKind : uint32_t { kAllReduce = 1, kReduceScatter = 2, kAllGather = 3, kBroadcast = 4 };

// Elements reduced per pass over the sources: small enough that the accumulator stays in cache
// between the sources.
constexpr size_t kTileBytes = 32 << 10;

const KernelSite kHost{};

// One zero-copy call: its phases are base + 1 (entered: this rank's data is in place), base +
// 2 and base + 3 (the algorithm's rounds); each rank raises them in order.
class Call {
 public:
  Call(Communicator& comm, const char* what, ZeroCopyKind kind, const SymmetricSpan& span,
       size_t bytes, DType dtype, int op, int root, Deadline deadline)
      : heap_(*comm.symmetric()),
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
  }

  // Enters: this rank's data is in place for the peers.
  void start() { heap_.raise(base_ + 1); }
  // This rank's staging area for this call (the two alternate), once every peer has entered
  // the call before, and so is done reading it for the call before that.
  uint8_t* own_staging() {
    if (heap_.zero_copy_calls() > 1) {
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
  }
  void moved(size_t bytes) { heap_.add_zero_copy_bytes(bytes); }
  // The offset local rank li posted (valid after its entry phase).
  size_t offset_of(int li) const { return heap_.control(li).call[parity()].offset; }
  void count(bool one_shot) { heap_.count_call(one_shot); }

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
  Deadline deadline_;
  const char* what_;
  int spin_us_;
  uint64_t seq_;
  int n_;
  int me_;
  uint32_t base_ = 0;
};

// out[0, n) = op over srcs[k][0, n), k in the order given, tile by tile; out may be the last
// source (element for element). `acc` holds kTileBytes of the accumulation type.
void reduce_sources(DType dtype, ReduceOp op, const std::vector<const uint8_t*>& srcs, uint8_t* out,
                    size_t n, int world, uint8_t* acc) {
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
  const bool staged = bytes <= kOneShotBytes;
  const bool one_shot = staged || (!in_place && !so);
  Call call(comm, "zero-copy all_reduce", kAllReduce, si, bytes, in.dtype, static_cast<int>(op), -1,
            deadline);
  const int w = call.world(), me = call.me();
  call.count(one_shot);
  comm.log_once(1, str_cat("zero-copy/all_reduce/", staged, "/", one_shot), [&] {
    return str_cat("all_reduce ", bytes, " B: zero-copy ",
                   staged     ? "one-shot from each rank's staging area (small: one round of flags)"
                   : one_shot ? "one-shot (a private output)"
                              : "two-shot (each rank reduces its chunk, then copies the others')");
  });
  uint8_t* acc = comm.scratch(kTileBytes);
  std::vector<const uint8_t*> srcs;
  if (staged) {
    // Each rank copies its input into its staging area, so it may write its own buffer at once:
    // no peer reads the buffer, and the call needs no round after the reduction.
    if (bytes > 0) kern::copy(kHost, call.own_staging(), in.data, bytes);
    call.start();
    for (int li = 0; li < w; ++li) srcs.push_back(call.staging(li));
    call.wait_all(1);
    if (n > 0) reduce_sources(in.dtype, op, srcs, static_cast<uint8_t*>(out.data), n, w, acc);
    call.moved(bytes * static_cast<size_t>(w - 1));
    return;
  }
  call.start();
  if (one_shot) {  // into the private output, in rank order, reading the peers' inputs
    for (int li = 0; li < w; ++li) srcs.push_back(si.at(static_cast<size_t>(li)));
    call.wait_all(1);
    reduce_sources(in.dtype, op, srcs, static_cast<uint8_t*>(out.data), n, w, acc);
    call.post(2);  // done reading the peers' inputs
    call.moved(bytes * static_cast<size_t>(w - 1));
    call.wait_all(2);
    return;
  }
  // Two-shot: rank r reduces chunk r into its own output, then copies the others' chunks.
  const SymmetricSpan& dst = in_place ? si : so;
  const size_t f = chunk_first(n, w, me), l = chunk_first(n, w, me + 1);
  for (int li = 0; li < w; ++li) {  // the peers in rank order, this rank's own last
    if (li != me) srcs.push_back(si.at(static_cast<size_t>(li)) + f * es);
  }
  srcs.push_back(static_cast<const uint8_t*>(in.data) + f * es);
  call.wait_all(1);
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
}

void zero_copy_reduce_scatter(Communicator& comm, const SymmetricSpan& si, const BufferView& in,
                              const BufferView& out, ReduceOp op, Deadline deadline) {
  const size_t es = dtype_size(in.dtype), m = out.count;
  Call call(comm, "zero-copy reduce_scatter", kReduceScatter, si, in.bytes(), in.dtype,
            static_cast<int>(op), -1, deadline);
  const int w = call.world(), me = call.me();
  call.count(false);
  call.start();
  const size_t f = static_cast<size_t>(me) * m;
  std::vector<const uint8_t*> srcs;
  for (int li = 0; li < w; ++li) {
    if (li != me) srcs.push_back(si.at(static_cast<size_t>(li)) + f * es);
  }
  srcs.push_back(static_cast<const uint8_t*>(in.data) + f * es);
  uint8_t* scratch = comm.scratch(kTileBytes);
  call.wait_all(1);
  if (m > 0) reduce_sources(in.dtype, op, srcs, static_cast<uint8_t*>(out.data), m, w, scratch);
  call.post(2);
  call.moved(m * es * static_cast<size_t>(w - 1));
  call.wait_all(2);
}

void zero_copy_allgather(Communicator& comm, const SymmetricSpan& si, const BufferView& in,
                         const BufferView& out, Deadline deadline) {
  const size_t bytes = in.bytes();
  Call call(comm, "zero-copy all_gather", kAllGather, si, bytes, in.dtype, -1, -1, deadline);
  const int w = call.world(), me = call.me();
  call.count(false);
  call.start();
  call.wait_all(1);
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
