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
    SymmetricCall& c = heap_.control(me_).call;
    c.seq = seq_;
    c.kind = kind;
    c.root = root;
    c.alloc = span.alloc->id;
    c.offset = span.offset;
    c.bytes = bytes;
    c.dtype = static_cast<int32_t>(dtype);
    c.op = op;
    heap_.raise(base_ + 1);
  }

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
  void count(bool one_shot) { heap_.count_call(one_shot); }

 private:
  void check(int li) const {
    const SymmetricCall& mine = heap_.control(me_).call;
    const SymmetricCall& theirs = heap_.control(li).call;
    auto text = [](const SymmetricCall& c) {
      return str_cat("{collective #", c.seq, ", kind ", c.kind, ", allocation ", c.alloc,
                     " at offset ", c.offset, ", ", c.bytes, " bytes, dtype ", c.dtype, ", op ",
                     c.op, ", root ", c.root, "}");
    };
    PYRING_CHECK(theirs.seq == mine.seq && theirs.kind == mine.kind && theirs.alloc == mine.alloc &&
                     theirs.offset == mine.offset && theirs.bytes == mine.bytes &&
                     theirs.dtype == mine.dtype && theirs.op == mine.op && theirs.root == mine.root,
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
  const size_t per = (count / static_cast<size_t>(world) + 15) / 16 * 16;  // whole cache lines
  return std::min(count, per * static_cast<size_t>(r));
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
  const bool one_shot = bytes <= kOneShotBytes || (!in_place && !so);
  Call call(comm, "zero-copy all_reduce", kAllReduce, si, bytes, in.dtype, static_cast<int>(op), -1,
            deadline);
  const int w = call.world(), me = call.me();
  call.count(one_shot);
  const size_t acc_bytes = kTileBytes;
  if (one_shot) {
    // Every rank reduces the whole buffer in rank order (so all get the same bits), into
    // scratch when in place, since peers still read this rank's buffer.
    uint8_t* scratch = comm.scratch(acc_bytes + (in_place ? bytes : 0));
    uint8_t* result = in_place ? scratch + acc_bytes : static_cast<uint8_t*>(out.data);
    std::vector<const uint8_t*> srcs;
    for (int li = 0; li < w; ++li) srcs.push_back(si.at(static_cast<size_t>(li)));
    call.wait_all(1);
    reduce_sources(in.dtype, op, srcs, result, n, w, scratch);
    call.post(2);  // done reading the peers' buffers
    call.moved(bytes * static_cast<size_t>(w - 1));
    call.wait_all(2);
    if (in_place) kern::copy(kHost, out.data, result, bytes);
    return;
  }
  // Two-shot: rank r reduces chunk r into its own output, then copies the others' chunks.
  const SymmetricSpan& dst = in_place ? si : so;
  const size_t f = chunk_first(n, w, me), l = chunk_first(n, w, me + 1);
  std::vector<const uint8_t*> srcs;  // the peers in rank order, this rank's own last
  for (int li = 0; li < w; ++li) {
    if (li != me) srcs.push_back(si.at(static_cast<size_t>(li)) + f * es);
  }
  srcs.push_back(static_cast<const uint8_t*>(in.data) + f * es);
  uint8_t* scratch = comm.scratch(acc_bytes);
  call.wait_all(1);
  if (l > f) {
    reduce_sources(in.dtype, op, srcs, static_cast<uint8_t*>(out.data) + f * es, l - f, w, scratch);
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
  call.wait_all(1);
  auto* o = static_cast<uint8_t*>(out.data);
  if (o + static_cast<size_t>(me) * bytes != in.data && bytes > 0) {
    kern::copy(kHost, o + static_cast<size_t>(me) * bytes, in.data, bytes);
  }
  for (int li = 0; li < w; ++li) {
    if (li != me && bytes > 0) {
      kern::copy(kHost, o + static_cast<size_t>(li) * bytes, si.at(static_cast<size_t>(li)), bytes);
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
