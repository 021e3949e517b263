// Device buffers in a collective: ordering with the caller's stream, and either staging through
// pinned host memory so that every algorithm and link runs on host memory, or (run_resident)
// the collective run on the device buffers themselves over links that carry device memory.
//
// One DeviceQueue per communicator and device. Each collective on device buffers takes a ticket:
// - enter() (caller's thread) queues on the caller's stream the raise of the ticket's
//   "entered" flag: the collective starts only after the work queued before the call;
// - run() (the thread running the collective) waits for that flag, copies the inputs to the
//   staging memory on pyring's own stream, runs the host collective, queues the copies of the
//   outputs back and the raise of the ticket's "done" flag after them;
// - order_after() (caller's thread) queues on a stream a wait for "done": work queued after it
//   sees the result, and the host is not blocked. It is called only once the ticket's "done"
//   raise is queued (or the ticket released), and throws CommError otherwise: a stream waiting
//   for a flag that this thread has still to queue would deadlock the process against any call
//   that synchronizes the device meanwhile (allocating or freeing device or pinned memory,
//   loading a kernel's module lazily, a copy to pageable memory), on any of its threads. An
//   async collective's wait() therefore waits on the host for the collective's host part first.
// A ticket whose collective fails or times out still has its done flag raised (after pyring's
// stream drains), so that no stream waits forever; its outputs are then unspecified. Every host
// wait also asks the stream that would raise its flag for a fault, and throws DeviceFault at
// once when that stream has stopped on one (CUDA's sticky errors stop every stream).
//
// Memory is never freed by the thread running the collectives: freeing device or pinned
// memory synchronizes the device (cudaFree, cudaFreeHost), and a caller's stream may be
// waiting for a done flag that only that thread's next steps raise, a deadlock. Memory that
// staging or scratch outgrew, or that a caller hands over (retire), is freed by enter() on the
// caller's thread once every earlier ticket is done (no stream then waits for a flag of this
// queue), or by the destructor.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "core/scratch_arena.h"
#include "core/types.h"
#include "device/runtime.h"

namespace pyring {

// One buffer of a collective as the device sees it. Regions are staged separately, so two
// regions that overlap on the device do not alias on the host.
struct StagedRegion {
  void* data = nullptr;
  size_t bytes = 0;
  bool read = false;   // copied to the host before the collective
  bool write = false;  // copied back to the device after it
};

class DeviceQueue {
 public:
  // Tickets whose flags are in flight at once; enter() waits for the oldest beyond this.
  static constexpr uint64_t kSlots = 1024;
  // run_chunked's chunk: large enough that each exchange runs at the links' bandwidth, small
  // enough that the copies of the neighbouring chunks overlap it.
  static constexpr size_t kStageChunkBytes = 4 << 20;
  static size_t stage_chunk_elems(DType dtype) { return kStageChunkBytes / dtype_size(dtype); }

  explicit DeviceQueue(Device device);
  // Waits for pyring's stream to drain, then frees the stream, flags and staging memory.
  ~DeviceQueue();
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;

  const Device& device() const { return device_; }

  // Caller's thread: a new ticket, after queueing its "entered" flag on `stream`.
  uint64_t enter(StreamId stream, Deadline deadline);
  // The thread running the collective: stages `regions`, runs fn(deadline, host copies in
  // region order) and queues the copies back. Throws what fn throws, or TimeoutError when the
  // caller's stream does not reach the ticket before the deadline.
  void run(uint64_t ticket, const std::vector<StagedRegion>& regions,
           const std::function<void(Deadline, uint8_t* const*)>& fn, Deadline deadline);
  // For element-wise collectives (all_reduce): runs fn(deadline, host chunk, first element,
  // count) over consecutive chunks of `in` copied to the host, which fn reduces in place and
  // which are copied back to `out`: chunk k+1 comes in and chunk k-1 goes back while chunk k
  // is exchanged. Every rank cuts the same chunks (stage_chunk_elems). in and out may be the
  // same buffer.
  void run_chunked(uint64_t ticket, const BufferView& in, const BufferView& out,
                   const std::function<void(Deadline, uint8_t*, size_t, size_t)>& fn,
                   Deadline deadline);
  // For collectives whose links carry device memory: runs fn(deadline) once the ticket's
  // "entered" flag is up; fn queues its kernels and copies on stream().
  void run_resident(uint64_t ticket, const std::function<void(Deadline)>& fn, Deadline deadline);
  // pyring's stream on this device: staging copies, resident collectives, done flags.
  StreamId stream() const { return stream_; }
  // Device scratch memory for the collective that runs now; valid until the next call.
  uint8_t* device_scratch(size_t bytes);
  // Queues a copy between device memory and host memory on stream(), counted in
  // host_device_bytes().
  void copy_async(void* dst, const void* src, size_t bytes);
  // Bytes copied between this device and the host by this queue, ever.
  uint64_t host_device_bytes() const { return host_device_bytes_.load(); }
  // Pinned host and device memory for the collective that runs now, taken as it goes (see
  // ScratchArena); the collective resets both once pyring's stream has drained.
  ScratchArena& pinned_arena() { return pinned_arena_; }
  ScratchArena& device_arena() { return device_arena_; }
  // Memory of this queue's device (host: pinned, from alloc_host) that nothing will use once
  // the tickets entered so far are done; freed as the header says. Any thread.
  void retire(void* p, bool host);
  // The same for a peer's memory this process opened (DeviceRuntime::ipc_open): closed, not
  // freed, once the tickets entered so far are done.
  void retire_mapping(void* p);
  // The running collective: blocks the host until the work queued so far on stream() has
  // finished; DeviceFault when the stream stops on a fault, TimeoutError naming `what` at the
  // deadline.
  void drain(Deadline deadline, const char* what);
  // Caller's thread: queues on `stream` a wait for the ticket's done flag, once its raise is
  // queued (see the header); CommError before then.
  void order_after(StreamId stream, uint64_t ticket);
  // Raises the ticket's done flag from the host once pyring's stream has drained: for a ticket
  // whose collective failed, or never ran (the communicator broke, or closed, first).
  void abandon(uint64_t ticket) noexcept { release(ticket); }
  // The ticket's device results are in place.
  bool done(uint64_t ticket) const;
  // Blocks the host until done(ticket), or throws TimeoutError at the deadline.
  void wait_done(uint64_t ticket, Deadline deadline) const;
  // Host memory the staging has reserved (allocated once, grown to the largest collective).
  size_t staging_bytes() const { return staging_bytes_; }

 private:
  Flag& slot(Flag* flags, uint64_t ticket) const { return flags[ticket % kSlots]; }
  // pyring's stream, for the host waits on flags it raises.
  StreamProbe own_stream() const { return StreamProbe{&rt_, device_, stream_}; }
  // Waits for the ticket's "entered" flag, runs body, then queues the raise of its "done" flag;
  // on failure releases the ticket and rethrows.
  void serve(uint64_t ticket, Deadline deadline, const std::function<void()>& body);
  // Raises the ticket's done flag from the host once pyring's stream has drained.
  void release(uint64_t ticket) noexcept;
  uint8_t* staging(size_t bytes);
  // p, of `capacity` bytes, grown to `bytes` (host: pinned memory, else device memory) once
  // pyring's stream has drained.
  uint8_t* grow(uint8_t*& p, size_t& capacity, size_t bytes, bool host);
  // Queues the raise of copied_ to the next value on the stream and returns that value.
  uint64_t mark_copied();
  enum class Freed { kHost, kDevice, kMapping };
  struct Retired {
    void* p;
    Freed how;
  };
  // Frees the retired memory whose tickets are done (all: every ticket is, or must be treated
  // as, finished).
  void free_retired(bool all) noexcept;

  Device device_;
  DeviceRuntime& rt_;
  StreamId stream_ = 0;    // pyring's stream: staging copies and done flags, in ticket order
  Flag* flags_ = nullptr;  // kSlots "entered", kSlots "done", one "copied in"
  Flag* entered_ = nullptr;
  Flag* done_ = nullptr;
  Flag* copied_ = nullptr;
  // The caller's stream of each ticket's slot: written by enter() before the ticket is
  // submitted, read by the thread serving it.
  std::vector<StreamId> callers_ = std::vector<StreamId>(kSlots, 0);
  std::atomic<uint64_t> next_ticket_{0};
  Flag done_queued_{0};  // tickets up to this one have their done raise queued (or done)
  std::atomic<uint64_t> host_device_bytes_{0};
  uint8_t* staging_ = nullptr;  // touched only by the running collective
  size_t staging_bytes_ = 0;
  uint8_t* scratch_ = nullptr;  // device memory; touched only by the running collective
  size_t scratch_bytes_ = 0;
  std::mutex retired_mu_;
  std::vector<Retired> retired_;  // guarded by retired_mu_
  ScratchArena pinned_arena_;
  ScratchArena device_arena_;
  uint64_t copy_seq_ = 0;  // copied_'s last queued value; touched only by the running collective
};

}  // namespace pyring
