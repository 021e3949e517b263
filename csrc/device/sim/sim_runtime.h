// The sim device: the device seam on the host, for tests only (users never see it).
//
// - Memory: each allocation is its own shared-memory file (memfd), so an IPC handle (the owner's
//   pid, file descriptor and the offset) maps it in another process of this host.
// - Streams: one worker thread per stream runs its queue in order. PYRING_SIM_DELAY_US=D sleeps
//   a random 0..D microseconds before every operation, so that a missing wait shows.
// - Synchronizing calls: alloc(), alloc_host(), free() and free_host() hold the device as CUDA
//   may (cudaMalloc, cudaHostAlloc, cudaFree and cudaFreeHost can synchronize the device, and
//   loading a kernel's module lazily does): until they return, no other thread of the process
//   queues work on the device, and they first wait for every stream of the device. One that is
//   still busy after kSimFreeWaitS (a stream waiting on work that only a held-back or the calling
//   thread would queue: a deadlock on a GPU) aborts the process with a message saying so.
//   alloc_cached() and release() neither wait nor hold: a caching allocator's allocations from
//   its pool and stream-ordered frees (pyring.testing.sim_torch). The first launch of each
//   kernel on a device in a process does the same as the synchronizing calls (CUDA loads a
//   kernel's module lazily, at its first launch).
// - Flags: atomics in host memory from alloc_host, raised and waited on by stream threads and
//   host threads; a flag anywhere else is refused, as the driver refuses it.
// - Copies: one to or from pageable host memory (not alloc_host's, not the device's) holds the
//   calling thread until it has run, as cudaMemcpyAsync does.
// - Streams: stream 0 is the legacy default stream: work queued on it waits for the work queued
//   before on every blocking stream (create_blocking_stream), and theirs waits for its.
// - Device addresses: host code reading or writing one faults (SIGSEGV), as on a GPU; the
//   streams run on a second, readable view of the same memory (host_view, SimArena).
// - IPC: a handle opened in the process that exported it is refused (cudaErrorInvalidContext);
//   one allocation opened twice maps once and stays mapped until closed twice.
// - Kernels: the CUDA kernels' own bodies (kernels/reduce_functors.h, onebit_functors.h) over an
//   emulated grid (kernels/host_grid.cc), run on the stream's thread.
// - Faults: errors are sticky (sim_stream.h). launch_out_of_bounds faults the whole device, as an
//   illegal address does a CUDA context: its streams stop, and every later call that queues work
//   on it throws CudaError naming the fault.
// - PYRING_SIM_DEVICES: the device count (default kSimDefaultDevices). PYRING_SIM_IPC=refuse
//   makes ipc_handle and ipc_open throw CudaError, as a runtime that refuses IPC does.
// - PYRING_SIM_STREAM_MEMOPS=off: the device has no stream memory operations, as a driver that
//   disables them: require_stream_flags, write_flag and wait_flag throw CudaError.
// - Current device: each thread has one (0 by default); the methods that allocate or queue
//   work make theirs current for the call and restore the caller's (DeviceGuard), as the CUDA
//   runtime does.
// - PYRING_SIM_CAPACITY=B: each device holds at most B bytes of device memory (alloc and
//   alloc_cached); past it they throw DeviceOutOfMemory, as cudaMalloc fails.
// - Graph capture: set_capturing marks a stream as capturing (is_capturing), as
//   cudaStreamBeginCapture does; nothing is recorded.
#pragma once

#include <functional>

#include "device/runtime.h"

namespace pyring {

constexpr int kSimDefaultDevices = 4;
constexpr int kSimFreeWaitS = 30;
// The fault of launch_out_of_bounds, named as CUDA names an illegal address.
constexpr const char* kSimIllegalAddress =
    "cudaErrorIllegalAddress (an illegal memory access was encountered)";

class SimRuntime : public DeviceRuntime {
 public:
  // A stream that synchronizes with the legacy default stream (cudaStreamCreate without
  // cudaStreamNonBlocking); create_stream's streams do not.
  virtual StreamId create_blocking_stream(int index) = 0;
  // Where the sim's streams, and the tests' own queued operations, reach device address `p`:
  // the readable view of sim device memory (this process's or another's opened through an IPC
  // handle); any other address as it is. Host code that reads a device address itself faults,
  // as on a GPU.
  virtual uint8_t* host_view(const void* p) = 0;
  // Mappings of other processes' allocations open now (the same allocation opened twice is
  // one mapping, as CUDA counts its opens).
  virtual int ipc_mappings() = 0;
  // Queues `fn` on stream s of device `index`; it runs on the stream's thread.
  virtual void launch(int index, StreamId s, std::function<void()> fn) = 0;
  // The calling thread's current device, as cudaGetDevice gives (make_current sets it, as
  // cudaSetDevice does, and gives the device a context).
  virtual int current_device() const = 0;
  // Marks stream s of device `index` as capturing a graph (is_capturing), or not.
  virtual void set_capturing(int index, StreamId s, bool on) = 0;
  // The delay bound in microseconds now in force; tests change it between phases.
  virtual void set_delay_us(int us) = 0;
  // What cudaDeviceSynchronize does, holding the device as the synchronizing calls do.
  virtual void synchronize_device(int index) = 0;
  // Device memory, as alloc() gives, without holding the device or waiting for its streams.
  virtual void* alloc_cached(int index, size_t bytes) = 0;
  // Frees device memory from alloc() without waiting for the device's streams.
  virtual void release(int index, void* p) noexcept = 0;
  // Bytes of device memory allocated and not freed, over every device.
  virtual size_t allocated_bytes() = 0;
};

// The process's sim runtime. A forked child gets a fresh one.
SimRuntime& sim_runtime();

}  // namespace pyring
