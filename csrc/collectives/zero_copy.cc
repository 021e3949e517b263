#include "collectives/zero_copy.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>

#include "collectives/collectives.h"
#include "collectives/zero_copy_call.h"
#include "core/errors.h"
#include "kernels/dispatch.h"
#include "transport/shm/stream_copy.h"

namespace pyring {

namespace {

using zero_copy::Call;
using zero_copy::chunk_first;
using zero_copy::kAllGather;
using zero_copy::kAllReduce;
using zero_copy::kBarrier;
using zero_copy::kBroadcast;
using zero_copy::kReduceScatter;
using zero_copy::Sources;

// Bytes reduced per pass over the sources, by the call's size. From kSmallTileFrom, small
// enough that each line read is written (into the tile, then the outputs) while it is still in
// the first-level cache: on the 2-core machine, 2 ranks, two-shot (bench/allreduce.py, 3 runs
// side by side), 16 MiB took 675-764 us with 1 KiB against 1201-1429 us with 32 KiB, and
// 64 MiB 7.5-8.2 against 8.3-10.7 ms. Below it, fewer passes: with the 1 KiB tile at every
// size, DistributedOptimizer's 3.5 MB buckets stepped slower on symmetric memory than on
// private buckets in 5 of 5 runs of bench/training.py; with 32 KiB below kSmallTileFrom, faster
// in 4 of 5 (docs/symmetric.md).
constexpr size_t kSmallTileBytes = 1 << 10;
constexpr size_t kTileBytes = 32 << 10;
constexpr size_t kSmallTileFrom = 16 << 20;

size_t tile_bytes(size_t call_bytes) {
  return call_bytes >= kSmallTileFrom ? kSmallTileBytes : kTileBytes;
}

const KernelSite kHost{};

// Outputs of a reduction from this size up may be written with non-temporal stores, through
// the tile: they write whole lines without reading them first, and leave no line in this
// core's cache for the peer to take back. Which is faster changes with where the host put the
// vCPUs: with the 1 KiB tile, 2 ranks, 64 MiB, cached stores took 5.2-6.6 ms and non-temporal
// 7.2-8.8 ms with the cores near (bench/allreduce.py, 3 runs), and non-temporal ones were the
// faster with them far (0.83-0.90 of memcpy's speed against 0.62-0.92, with a 32 KiB tile). So
// the two-shot all_reduce times both (SymmetricHeap's store choice); a private output, which
// no peer reads, is always streamed from here. Below it, the peer's copy finds the output in
// cache.
constexpr size_t kStreamOutFrom = 16 << 20;

// Where a reduction writes: one output, or the same bytes into several (each rank's tensor).
struct Outs {
  std::array<uint8_t*, kMaxLocalWorld> p;  // [0, n) set
  size_t n = 0;
  void push_back(uint8_t* o) { p[n++] = o; }
};

// outs[j][0, n) = op over srcs[k][0, n), k in the order given, tile by tile; an output may be
// a source (element for element: each tile is read whole before it is written). `acc` holds
// 2 * kTileBytes: the accumulation type's tile and the output's, `tile_b` bytes of each used.
// `streamed`: the outputs are written with non-temporal stores, fenced before the function
// returns.
void reduce_sources(DType dtype, ReduceOp op, const Sources& srcs, const Outs& outs, size_t n,
                    int world, uint8_t* acc, size_t tile_b, bool streamed) {
  const size_t es = dtype_size(dtype);
  const size_t ws = dtype_size(accum_dtype(dtype));
  const size_t k = srcs.size();
  uint8_t* out = outs.p[0];
  if (k == 1) {
    kern::finish_single(kHost, dtype, srcs[0], out, n);
    return;
  }
  const bool same = accum_dtype(dtype) == dtype;
  const size_t tile = tile_b / ws;
  uint8_t* stage = streamed || outs.n > 1 ? acc + tile_b : nullptr;
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
    if (stage) {
      kern::finish(kHost, dtype, op, src(k - 1), b, stage, m, world);
      for (size_t j = 0; j < outs.n; ++j) {
        streamed ? copy_nontemporal(outs.p[j] + at * es, stage, m * es)
                 : kern::copy(kHost, outs.p[j] + at * es, stage, m * es);
      }
    } else {
      kern::finish(kHost, dtype, op, src(k - 1), b, out + at * es, m, world);
    }
  }
  if (streamed) fence_nontemporal();  // before the phase that publishes the outputs
}

// reduce_sources into one private output, for a call of `call_bytes`: streamed from
// kStreamOutFrom.
void reduce_sources(DType dtype, ReduceOp op, const Sources& srcs, uint8_t* out, size_t n,
                    int world, uint8_t* acc, size_t call_bytes) {
  Outs outs;
  outs.push_back(out);
  reduce_sources(dtype, op, srcs, outs, n, world, acc, tile_bytes(call_bytes),
                 call_bytes >= kStreamOutFrom);
}

// Whether a two-shot all_reduce from kStreamOutFrom writes its outputs with non-temporal
// stores: the store choice's preference, except in the calls that explore the other way.
bool stream_outputs(SymmetricHeap& heap, int size_class) {
  return heap.prefers_streamed_outputs(size_class) !=
         zero_copy::explores(heap.next_store_candidate(size_class));
}

}  // namespace

bool zero_copy_possible(const Communicator& comm) {
  const SymmetricHeap* h = comm.symmetric();
  return h && h->any() && h->whole(comm.size()) && comm.size() > 1;
}

bool zero_copy_barrier_possible(const Communicator& comm) {
  const SymmetricHeap* h = comm.symmetric();
  return h && h->active() && h->whole(comm.size()) && comm.size() > 1;
}

void zero_copy_barrier(Communicator& comm, Deadline deadline) {
  Call call(comm, "zero-copy barrier", kBarrier, SymmetricSpan{}, 0, DType::kUInt8, -1, -1,
            deadline);
  call.start();
  call.wait_all(1);
  comm.symmetric()->count_barrier();
}

void zero_copy_allreduce(Communicator& comm, const SymmetricSpan& si, const SymmetricSpan& so,
                         const BufferView& in, const BufferView& out, ReduceOp op,
                         Deadline deadline) {
  if (!comm.symmetric()->whole(comm.size())) {
    return zero_copy_hosts_allreduce(comm, si, so, in, out, op, deadline);
  }
  const size_t bytes = in.bytes(), es = dtype_size(in.dtype), n = in.count;
  const bool in_place = in.data == out.data;
  const bool staged = bytes <= kOneShotBytes && comm.size() > 2;
  const bool one_shot = staged || (!in_place && !so);
  Call call(comm, "zero-copy all_reduce", kAllReduce, si, bytes, in.dtype, static_cast<int>(op), -1,
            deadline, true);
  call.output(in_place ? si : so);
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
                           : "two-shot (each rank reduces its chunk into every rank's output)");
      });
    }
  };
  uint8_t* acc = comm.scratch(2 * kTileBytes);
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
    if (n > 0) {
      reduce_sources(in.dtype, op, srcs, static_cast<uint8_t*>(out.data), n, w, acc, bytes);
    }
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
    reduce_sources(in.dtype, op, srcs, static_cast<uint8_t*>(out.data), n, w, acc, bytes);
    call.post(2);  // done reading the peers' inputs
    call.moved(bytes * static_cast<size_t>(w - 1));
    call.wait_all(2);
    call.timed();
    return;
  }
  // Two-shot: rank r reduces chunk r and writes it into every rank's output (the peers read
  // and write only other chunks meanwhile), so each rank reads the buffer once and writes it
  // once, and the call needs no round after the reduction.
  const SymmetricSpan& dst = in_place ? si : so;
  const size_t f = chunk_first(n, w, me), l = chunk_first(n, w, me + 1);
  SymmetricHeap& heap = *comm.symmetric();
  const bool timed = bytes >= kStreamOutFrom;
  const int size_class = SymmetricHeap::size_class(bytes);
  const bool streamed = timed && stream_outputs(heap, size_class);
  const Clock::time_point t0 = timed ? Clock::now() : Clock::time_point{};
  for (int li = 0; li < w; ++li) {  // the peers in rank order, this rank's own last
    if (li != me) srcs.push_back(si.at(static_cast<size_t>(li)) + f * es);
  }
  srcs.push_back(static_cast<const uint8_t*>(in.data) + f * es);
  Outs outs;
  outs.push_back(static_cast<uint8_t*>(out.data) + f * es);
  for (int li = 0; li < w; ++li) {
    if (li != me) outs.push_back(dst.at(static_cast<size_t>(li)) + f * es);
  }
  if (l > f) reduce_sources(in.dtype, op, srcs, outs, l - f, w, acc, tile_bytes(bytes), streamed);
  call.post(2);  // this rank's chunk is everywhere, and it touches the peers' memory no more
  call.moved(2 * (l - f) * es * static_cast<size_t>(w - 1));
  call.wait_all(2);
  if (timed) {  // the rounds after the entry: every rank's reduction and stores
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0);
    heap.add_store_cost(size_class, streamed, static_cast<uint64_t>(ns.count()) * 1024 / bytes);
    if (streamed) heap.count_streamed_call();
  }
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
  uint8_t* scratch = comm.scratch(2 * kTileBytes);
  call.wait_all(1);
  if (call.use_slots()) {
    return call.run_slots([&](Deadline d) { reduce_scatter(comm, in, out, op, d); });
  }
  call.count(false);
  if (m > 0) {
    reduce_sources(in.dtype, op, srcs, static_cast<uint8_t*>(out.data), m, w, scratch, in.bytes());
  }
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
