// The device seam: memory, pinned host memory, streams, flags, copies, kernels and IPC handles
// of one kind of device. Two implementations sit behind it: CUDA (device/cuda/, the real one)
// and sim (device/sim/, for tests only: host memory in shared-memory files, one worker thread
// per stream). Nothing above this header includes a CUDA header.
//
// Ordering between the caller's stream, the progress thread and pyring's own stream uses
// flags: 64-bit counters in host memory from alloc_host() that a stream or a host thread
// raises and that a stream or a host thread waits on (CUDA: stream memory operations on
// mapped pinned memory; sim: atomics). A flag's value only grows.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "core/types.h"
#include "kernels/onebit.h"

namespace pyring {

using Flag = std::atomic<uint64_t>;

// Raises `flag` to `value` unless it is already there or past (any thread).
inline void raise_flag(Flag& flag, uint64_t value) {
  uint64_t cur = flag.load();
  while (cur < value && !flag.compare_exchange_weak(cur, value)) {
  }
}

// What require_stream_flags says when a device lacks them.
constexpr const char* kNoStreamFlags =
    "this device cannot order pyring's collectives with its streams: its driver has stream "
    "memory operations disabled (some vGPUs and drivers do). Enable them (NVIDIA's kernel "
    "module option NVreg_EnableStreamMemOPs=1), or hand pyring host tensors (copy the device "
    "tensors to the CPU around the collective)";

// An allocation another process of this host can map: opaque bytes, published through the
// store.
struct IpcHandle {
  uint8_t bytes[72] = {};
};

// Every method may be called from any thread; `index` names the device. Failures throw
// CudaError naming the call and the device.
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceKind kind() const = 0;
  // Usable devices; 0 where there is no driver or no device (never throws).
  virtual int device_count() = 0;

  // Makes device `index` current on the calling thread (CUDA: cudaSetDevice, which also binds
  // its primary context for the driver's calls) and returns the device current before, -1
  // when unknown. Throws CudaError. Use DeviceGuard rather than calling it.
  virtual int make_current(int index) = 0;
  // Makes `previous` current again where it has a context already; restoring a device that
  // has none would create one (CUDA's primary context takes memory on that device), so the
  // device made current stays. Never throws.
  virtual void restore_current(int previous) noexcept = 0;

  virtual void* alloc(int index, size_t bytes) = 0;
  virtual void free(int index, void* p) noexcept = 0;
  // Host memory the device copies to and from at full speed and whose flags it reads and writes.
  virtual void* alloc_host(int index, size_t bytes) = 0;
  virtual void free_host(int index, void* p) noexcept = 0;

  // A stream that does not wait for the default stream.
  virtual StreamId create_stream(int index) = 0;
  virtual void destroy_stream(int index, StreamId s) noexcept = 0;
  // Queues a copy of `bytes` from src to dst (device or alloc_host memory) on s.
  virtual void copy_async(int index, void* dst, const void* src, size_t bytes, StreamId s) = 0;
  // Throws CudaError, saying what to do, when the device cannot raise and wait on flags from
  // its streams (CUDA: 64-bit stream memory operations, which a driver may disable, as on some
  // vGPUs). Device queues and device links call it when they are made, before any flag is queued.
  virtual void require_stream_flags(int index) = 0;
  // Queues *flag = value, run once the work queued before it on s has finished.
  virtual void write_flag(int index, StreamId s, Flag* flag, uint64_t value) = 0;
  // Queues a wait: work queued after it on s starts once *flag >= value.
  virtual void wait_flag(int index, StreamId s, Flag* flag, uint64_t value) = 0;
  // Blocks the calling thread until the work queued on s has finished.
  virtual void synchronize(int index, StreamId s) = 0;
  // Whether s is capturing into a graph (cudaStreamIsCapturing): work queued on it is recorded,
  // not run. Never throws (a failed query reads as not capturing).
  virtual bool is_capturing(int index, StreamId s) noexcept = 0;
  // The error that stopped s (a fault in its work, sticky: CUDA's illegal address, a failed
  // launch), or "" while s runs or has finished cleanly (cudaStreamQuery). Never throws.
  virtual std::string stream_error(int index, StreamId s) noexcept = 0;
  // Test-only: queues on s a kernel that writes out of bounds, so that the device faults as a
  // broken kernel would (the self-check and the fault tests; never called by a collective).
  virtual void launch_out_of_bounds(int index, StreamId s) = 0;

  // The kernels of kernels/reduce.h and kernels/onebit.h on device memory, queued on s.
  virtual void reduce_accumulate(int index, DType dtype, ReduceOp op, const void* a, const void* b,
                                 void* acc, size_t n, StreamId s) = 0;
  virtual void reduce_finish(int index, DType dtype, ReduceOp op, const void* a, const void* b,
                             void* out, size_t n, int world, StreamId s) = 0;
  virtual void finish_wide(int index, DType dtype, ReduceOp op, const void* acc, void* out,
                           size_t n, int world, StreamId s) = 0;
  virtual void cast(int index, DType from, DType to, const void* in, void* out, size_t n,
                    StreamId s) = 0;
  // Encodes without mask caches, with a kept residual (kernels/onebit.h; null: none) whose last
  // scale is `pending`; synchronizes s to return the bytes written and the header. Decode
  // reads the segment (header, signs, mask) at `encoded` but takes its header from `header`
  // (the host's copy); a kMaskCached header is refused.
  virtual size_t onebit_encode(int index, const float* in, uint16_t* residual, float pending,
                               size_t n, uint8_t* out, OnebitHeader* header, StreamId s) = 0;
  virtual void onebit_decode(int index, const OnebitHeader& header, const uint8_t* encoded,
                             size_t n, float alpha, bool accumulate, float* out, StreamId s) = 0;

  // A handle to the allocation `p` (from alloc) that ipc_open maps in another process of this
  // host; ipc_close unmaps it there. Throws CudaError where the runtime refuses IPC.
  virtual IpcHandle ipc_handle(int index, void* p) = 0;
  virtual void* ipc_open(int index, const IpcHandle& h) = 0;
  virtual void ipc_close(int index, void* p) noexcept = 0;
};

// Device `index` current for the scope of one runtime call, and the caller's device current
// again after it: torch's current device is the thread's CUDA device, which a call for another
// device must not move. The nothrow form, for noexcept methods, leaves a failure to the call
// that follows.
class DeviceGuard {
 public:
  DeviceGuard(DeviceRuntime& rt, int index) : rt_(rt), index_(index) {
    previous_ = rt.make_current(index);
  }
  DeviceGuard(DeviceRuntime& rt, int index, const std::nothrow_t&) noexcept
      : rt_(rt), index_(index) {
    try {
      previous_ = rt.make_current(index);
    } catch (...) {
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != index_) rt_.restore_current(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  DeviceRuntime& rt_;
  int index_;
  int previous_ = -1;
};

// pyring's device memory: every allocation of device memory pyring makes for itself (cuda_ipc
// inboxes, device scratch, compressed wires' residuals) goes through these, which count what
// is held per device. When the device is out of memory, device_alloc asks the releaser (the
// caching allocator beside pyring: torch's empty_cache, set by the bindings) to give its cached
// blocks back, and tries once more; DeviceOutOfMemory when that fails too. Any thread.
void* device_alloc(DeviceRuntime& rt, int index, size_t bytes);
void device_free(DeviceRuntime& rt, int index, void* p) noexcept;
// Bytes of device memory pyring holds in this process: on one device, and by device name
// ("cuda:0").
uint64_t device_memory_held_on(const Device& device);
std::vector<std::pair<std::string, uint64_t>> device_memory_held();
// fn(device) releases the memory a caching allocator holds cached on device; empty: none.
void set_cached_memory_releaser(std::function<void(const Device&)> fn);

// The runtime of `kind` (kCuda or kSim). Throws InvalidArgument for kCpu, and CudaError for
// kCuda when pyring was built without CUDA.
DeviceRuntime& device_runtime(DeviceKind kind);

// Throws Error naming the stream when `stream` of `device` is capturing into a graph: a
// collective's flags would be recorded, not raised, and its host part would wait forever.
void check_not_capturing(const Device& device, StreamId stream);

// A stream whose faults a host wait reports: the flag it waits for is raised by work that a
// fault on this stream (or on its device, for sticky errors) would stop. rt null: none.
struct StreamProbe {
  DeviceRuntime* rt = nullptr;
  Device device;
  StreamId stream = 0;
};

// Throws DeviceFault naming the device's error and `what` when probe's stream has stopped on
// one; does nothing otherwise.
void check_stream(const StreamProbe& probe, const char* what);

// Blocks the calling thread until *flag >= value: spins briefly, then sleeps in short steps,
// asking the probe's stream for a fault between them. Throws DeviceFault at once when the stream
// has stopped on one (no flag it would raise ever rises), and TimeoutError with `what` when
// `deadline` passes first.
void host_wait_flag(const Flag* flag, uint64_t value, Deadline deadline, const char* what,
                    const StreamProbe& probe = {});

}  // namespace pyring
