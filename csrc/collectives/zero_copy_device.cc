// The zero-copy collectives on symmetric device memory (zero_copy.h): host-driven. The thread
// that runs the collective queues each step's kernels and copies on pyring's stream, waits on
// the host until the stream has run them (DeviceQueue::drain), and only then raises the phase
// that lets the peers go on; it waits for the peers' phases on the host too. No kernel ever
// waits for another process, so ranks that share one GPU without MPS cannot deadlock.
#include <cstddef>

#include "collectives/zero_copy.h"
#include "collectives/zero_copy_call.h"
#include "core/errors.h"
#include "device/runtime.h"

namespace pyring {

namespace {

using zero_copy::Call;
using zero_copy::chunk_first;
using zero_copy::Sources;

// The steps of one call on its device: kernels and copies queued on pyring's stream.
class Steps {
 public:
  Steps(Communicator& comm, const Device& device, Deadline deadline)
      : q_(comm.device_queue(device)),
        rt_(device_runtime(device.kind)),
        index_(device.index),
        deadline_(deadline) {}

  // out[0, n) = op over srcs[k][0, n) in the order given; out may be the last source.
  void reduce(DType dtype, ReduceOp op, const Sources& srcs, uint8_t* out, size_t n, int world) {
    if (n == 0) return;
    const size_t k = srcs.size();
    const StreamId s = q_->stream();
    if (k == 1) {
      rt_.copy_async(index_, out, srcs[0], n * dtype_size(dtype), s);
      return;
    }
    const DType wide = accum_dtype(dtype);
    const void* b = srcs[0];
    uint8_t* acc = nullptr;
    if (wide != dtype) {
      acc = q_->device_scratch(n * dtype_size(wide));
      rt_.cast(index_, dtype, wide, srcs[0], acc, n, s);
      b = acc;
    }
    for (size_t next = 1; next + 1 < k; ++next) {
      if (!acc) acc = q_->device_scratch(n * dtype_size(wide));
      rt_.reduce_accumulate(index_, dtype, op, srcs[next], b, acc, n, s);
      b = acc;
    }
    rt_.reduce_finish(index_, dtype, op, srcs[k - 1], b, out, n, world, s);
  }
  void copy(void* dst, const void* src, size_t bytes) {
    if (bytes > 0 && dst != src) rt_.copy_async(index_, dst, src, bytes, q_->stream());
  }
  // Returns once the device has run what was queued: this rank's writes are in place and it
  // reads the peers' memory no more.
  void drain(const char* what) { q_->drain(deadline_, what); }

 private:
  std::shared_ptr<DeviceQueue> q_;
  DeviceRuntime& rt_;
  int index_;
  Deadline deadline_;
};

void log_path(Communicator& comm, const char* key, const char* text, size_t bytes) {
  if (comm.options().log_level >= 1) {
    comm.log_once(1, str_cat("zero-copy/device/", key),
                  [&] { return str_cat(key, " ", bytes, " B: zero-copy on the device, ", text); });
  }
}

}  // namespace

void zero_copy_device_allreduce(Communicator& comm, const SymmetricSpan& si,
                                const SymmetricSpan& so, const BufferView& in,
                                const BufferView& out, ReduceOp op, Deadline deadline) {
  const size_t bytes = in.bytes(), es = dtype_size(in.dtype), n = in.count;
  const bool in_place = in.data == out.data;
  const bool one_shot = !in_place && !so;
  Call call(comm, "zero-copy all_reduce", zero_copy::kAllReduce, si, bytes, in.dtype,
            static_cast<int>(op), -1, deadline);
  call.output(in_place ? si : so);
  Steps steps(comm, in.device, deadline);
  const int w = call.world(), me = call.me();
  call.start();
  call.wait_all(1);
  call.count(one_shot);
  log_path(comm, "all_reduce",
           one_shot ? "one-shot (a private output)"
                    : "two-shot (each rank reduces its chunk, then copies the others')",
           bytes);
  Sources srcs;
  if (one_shot) {  // into the private output, in rank order, reading the peers' inputs
    for (int li = 0; li < w; ++li) srcs.push_back(si.at(static_cast<size_t>(li)));
    steps.reduce(in.dtype, op, srcs, static_cast<uint8_t*>(out.data), n, w);
    steps.drain("zero-copy all_reduce: the reduction on the device");
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
  steps.reduce(in.dtype, op, srcs, static_cast<uint8_t*>(out.data) + f * es, l - f, w);
  steps.drain("zero-copy all_reduce: the reduction of this rank's chunk on the device");
  call.post(2);  // this rank's chunk is reduced, and it reads the peers' inputs no more
  call.wait_all(2);
  size_t read = (l - f) * es * static_cast<size_t>(w - 1);
  for (int li = 0; li < w; ++li) {
    if (li == me) continue;
    const size_t pf = chunk_first(n, w, li), pl = chunk_first(n, w, li + 1);
    steps.copy(static_cast<uint8_t*>(out.data) + pf * es, dst.at(static_cast<size_t>(li)) + pf * es,
               (pl - pf) * es);
    read += (pl - pf) * es;
  }
  steps.drain("zero-copy all_reduce: the copies of the peers' chunks on the device");
  call.post(3);  // done reading the peers' outputs
  call.moved(read);
  call.wait_all(3);
}

void zero_copy_device_reduce_scatter(Communicator& comm, const SymmetricSpan& si,
                                     const BufferView& in, const BufferView& out, ReduceOp op,
                                     Deadline deadline) {
  const size_t es = dtype_size(in.dtype), m = out.count;
  Call call(comm, "zero-copy reduce_scatter", zero_copy::kReduceScatter, si, in.bytes(), in.dtype,
            static_cast<int>(op), -1, deadline);
  Steps steps(comm, in.device, deadline);
  const int w = call.world(), me = call.me();
  call.start();
  call.wait_all(1);
  call.count(false);
  log_path(comm, "reduce_scatter", "each rank reduces its chunk from every rank's input",
           in.bytes());
  const size_t f = static_cast<size_t>(me) * m;
  Sources srcs;
  for (int li = 0; li < w; ++li) {
    if (li != me) srcs.push_back(si.at(static_cast<size_t>(li)) + f * es);
  }
  srcs.push_back(static_cast<const uint8_t*>(in.data) + f * es);
  steps.reduce(in.dtype, op, srcs, static_cast<uint8_t*>(out.data), m, w);
  steps.drain("zero-copy reduce_scatter: the reduction on the device");
  call.post(2);
  call.moved(m * es * static_cast<size_t>(w - 1));
  call.wait_all(2);
}

void zero_copy_device_allgather(Communicator& comm, const SymmetricSpan& si, const BufferView& in,
                                const BufferView& out, Deadline deadline) {
  const size_t bytes = in.bytes();
  Call call(comm, "zero-copy all_gather", zero_copy::kAllGather, si, bytes, in.dtype, -1, -1,
            deadline);
  Steps steps(comm, in.device, deadline);
  const int w = call.world(), me = call.me();
  call.start();
  call.wait_all(1);
  call.count(false);
  log_path(comm, "all_gather", "each rank copies every peer's input", bytes);
  auto* o = static_cast<uint8_t*>(out.data);
  steps.copy(o + static_cast<size_t>(me) * bytes, in.data, bytes);
  for (int li = 0; li < w; ++li) {
    if (li != me) {
      steps.copy(o + static_cast<size_t>(li) * bytes,
                 si.alloc->bases[static_cast<size_t>(li)] + call.offset_of(li), bytes);
    }
  }
  steps.drain("zero-copy all_gather: the copies on the device");
  call.post(2);
  call.moved(bytes * static_cast<size_t>(w - 1));
  call.wait_all(2);
}

void zero_copy_device_broadcast(Communicator& comm, const SymmetricSpan& sb, const BufferView& buf,
                                int root, Deadline deadline) {
  const size_t bytes = buf.bytes();
  Call call(comm, "zero-copy broadcast", zero_copy::kBroadcast, sb, bytes, buf.dtype, -1, root,
            deadline);
  Steps steps(comm, buf.device, deadline);
  const int me = call.me();
  call.count(false);
  log_path(comm, "broadcast", "each rank copies the root's buffer", bytes);
  call.start();
  if (me == root) {  // every peer has copied the root's buffer
    call.wait_all(1);
    call.wait_all(2);
    return;
  }
  call.wait(root, 1);
  steps.copy(buf.data, sb.at(static_cast<size_t>(root)), bytes);
  steps.drain("zero-copy broadcast: the copy on the device");
  call.post(2);
  call.moved(bytes);
}

}  // namespace pyring
