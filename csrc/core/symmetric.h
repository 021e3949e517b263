// Symmetric memory: allocations that every local rank of a communicator has mapped
// (pyring.empty), on the host or on a device, and the flags that order the zero-copy
// collectives on them (collectives/zero_copy.h).
//
// Each allocation is one unnamed shared file (core/shared_file.h: memfd, mode 0600) per local
// rank, so a rank killed at any point, or every rank at once, leaves nothing in /dev/shm. Its
// local peers open it through /proc/PID/fd/FD while its rank still holds the descriptor (the
// allocation's exchange says which, and its inode; the rank closes it once every local rank has
// mapped it). Ranks are of one host only where they share a pid
// namespace (pyring.runtime.rendezvous.host_key), so they see each other in /proc. Freeing is local
// (munmap): the kernel keeps the pages while a peer still maps them, and no zero-copy call returns
// while a peer still reads this rank's memory for it, so a freed tensor is never read again.
//
// On a device (CUDA, sim), each rank allocates device memory of its own and every local peer
// opens it once through its IPC handle (DeviceRuntime::ipc_open). Freeing retires this rank's
// memory and its mappings of the peers' to the device's queue (DeviceQueue::retire), which
// frees and closes them once every collective entered before has finished on the device: a
// peer never reads the memory after its call returned, and nothing is freed under a kernel
// still queued. A rank killed holds nothing another process must free (the driver's, or the
// sim's, memory goes with the process).
//
// Each local rank also owns one control segment (made with the first allocation): a page that
// holds its zero-copy phase counter, the description of the call it posted and whether it gave
// up, then two staging areas of kStagingBytes that small all-reduces copy their input into.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/device_queue.h"
#include "core/types.h"

namespace pyring {

class Communicator;

// One allocation: this rank's mapping and every local peer's, by local index.
struct SymmetricAllocation {
  uint64_t id = 0;
  size_t bytes = 0;   // as asked
  size_t mapped = 0;  // bytes of each mapping (host: a multiple of the page size, at least one)
  Device device;      // the host, or the device whose memory it is
  int my = 0;         // this rank's local index
  // By local index; bases[my] is this rank's. On a device: device addresses in this process.
  std::vector<uint8_t*> bases;
  std::shared_ptr<DeviceQueue> queue;  // a device's: frees and closes its memory (see above)
  ~SymmetricAllocation();
};

// Where a buffer lies in symmetric memory: its allocation and its offset in every mapping.
struct SymmetricSpan {
  std::shared_ptr<SymmetricAllocation> alloc;
  size_t offset = 0;
  explicit operator bool() const { return alloc != nullptr; }
  // The same bytes in local rank `li`'s mapping.
  uint8_t* at(size_t li) const { return alloc->bases[li] + offset; }
};

// What a rank posts on entering a zero-copy call, checked by the peers it waits for.
struct SymmetricCall {
  uint64_t seq = 0;  // the communicator's collective number
  uint32_t kind = 0;
  int32_t root = -1;
  uint64_t alloc = 0;  // allocation id of the buffer peers read
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int32_t dtype = -1;
  int32_t op = -1;
  uint32_t far = 0;  // this rank's links found a peer's core far (not compared)
  // all_reduce's output: the allocation and offset peers write or read it at (in place: the
  // input's), or 0 where it is private.
  uint64_t out_alloc = 0;
  uint64_t out_offset = 0;
};

// One local rank's control page.
struct SymmetricControl {
  alignas(64) std::atomic<uint32_t> phase;    // futex word: raised by its rank only
  std::atomic<uint32_t> waiters;              // peers asleep on phase
  alignas(64) std::atomic<uint64_t> entered;  // 2 * seq + 1 on a zero-copy call, 2 * seq else
  // By the parity of its zero-copy calls (a peer may enter the next call before this rank
  // has read the description of the last): written before phase is raised to enter.
  SymmetricCall call[2];
  alignas(64) std::atomic<uint32_t> aborted;  // non-zero once its rank gave up
  int32_t pid;
  // Non-zero once its rank closed its communicator, after its last phase was raised.
  std::atomic<uint32_t> closed;
};

// The most ranks one host's symmetric memory spans.
constexpr size_t kMaxLocalWorld = 256;

// Bytes of each of a rank's two staging areas.
constexpr size_t kStagingBytes = 64 << 10;

class SymmetricHeap {
 public:
  // `local`: the ranks of this host, this one included, in rank order; `job`: the job's id
  // (it labels the segments); `shared_cores`: some local ranks share a core (a waiting rank
  // yields its core rather than spinning on it); `across_hosts`: the job spans several hosts
  // of as many ranks each, grouped by host in its topology (collectives/zero_copy.h's
  // all_reduce across hosts), alike on every rank.
  SymmetricHeap(int rank, std::vector<int> local, std::string job, bool shared_cores,
                bool across_hosts);
  ~SymmetricHeap();
  SymmetricHeap(const SymmetricHeap&) = delete;
  SymmetricHeap& operator=(const SymmetricHeap&) = delete;

  // Collective over the whole communicator (run it as one of its collectives): every rank
  // allocates `bytes` on `device` (the host, or a device of its kind: ranks may use different
  // GPUs of the host) described by `what` (e.g. "empty(4, 1024, dtype=float32)"). Ranks that
  // asked differently, or a rank that could not allocate, make every rank throw
  // InvalidArgument naming both calls (or the failure). Returns this rank's allocation.
  std::shared_ptr<SymmetricAllocation> allocate(Communicator& comm, size_t bytes,
                                                const std::string& what, const Device& device,
                                                Deadline deadline);
  // Forgets allocation `id` (its mappings go with the last reference). Thread-safe.
  void release(uint64_t id);

  // The symmetric allocation on `device` holding [data, data + bytes) of this rank, or an
  // empty span. Thread-safe; cheap while nothing is allocated.
  SymmetricSpan find(const void* data, size_t bytes, const Device& device = Device{}) const;
  bool any() const { return count_.load(std::memory_order_acquire) != 0; }
  // Whether the control pages are mapped (the first allocation was made): from then on every
  // collective says which path it took (enter).
  bool active() const { return active_.load(std::memory_order_acquire); }
  size_t allocations() const { return count_.load(std::memory_order_acquire); }
  size_t allocated_bytes() const;

  int local_index() const { return my_; }
  int local_world() const { return static_cast<int>(local_.size()); }
  int global_rank(size_t li) const { return local_[li]; }
  // Whether every rank of a world of `world` is on this host.
  bool whole(int world) const { return static_cast<int>(local_.size()) == world; }
  bool across_hosts() const { return across_hosts_; }
  // The local index of global rank `rank`, or -1.
  int local_of(int rank) const;

  // The zero-copy flags (valid once the first allocation is made).
  SymmetricControl& control(size_t li) const { return *controls_[li]; }
  // Staging area `k` (0 or 1) of local rank li, kStagingBytes long.
  uint8_t* staging(size_t li, uint32_t k) const {
    return reinterpret_cast<uint8_t*>(controls_[li]) + 4096 + k * kStagingBytes;
  }
  // Posts this rank's phase and wakes peers asleep on it.
  void raise(uint32_t phase);
  // Returns once local rank `li` has raised its phase to `target` or past it (phases wrap):
  // polls for spin_us (yielding the core for longer where cores are shared), then sleeps on the
  // futex in 1 ms slices.
  // Throws PeerLost when that rank died or gave up, TimeoutError at the deadline, and CommError
  // when `seq` is non-zero and that rank entered collective `seq` on the slot path.
  void wait(size_t li, uint32_t target, int spin_us, Deadline deadline, const char* what,
            uint64_t seq = 0);
  // Marks the entry of collective `seq` (zero_copy: whether this rank takes the zero-copy
  // path), so that a peer on the other path is named at once.
  void enter(uint64_t seq, bool zero_copy);
  // This rank gave up: peers waiting on it fail at once.
  void abort();
  // This rank's communicator closed (Link::announce_closed): a peer waiting for a phase it
  // never raised fails at once.
  void announce_closed();
  // Bytes this rank moved zero-copy (read from a peer's mapping or written for the call), ever.
  uint64_t zero_copy_bytes() const { return moved_.load(std::memory_order_relaxed); }
  void add_zero_copy_bytes(uint64_t b) { moved_.fetch_add(b, std::memory_order_relaxed); }
  // Zero-copy calls run, ever: one-shot (each rank reduces the whole buffer) and the others.
  uint64_t one_shot_calls() const { return one_shot_.load(std::memory_order_relaxed); }
  uint64_t zero_copy_calls() const { return calls_.load(std::memory_order_relaxed); }
  void count_call(bool one_shot) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    if (one_shot) one_shot_.fetch_add(1, std::memory_order_relaxed);
  }
  // The timed choice between the zero-copy and the slot schedule of the calls that may run
  // either (zero_copy.h), per size class (a factor of 4 from 8 KiB): each schedule's cost is
  // the median nanoseconds per KiB of its last kCostSamples calls of the class on this rank.
  // Prefers the slots once both have samples and the slots cost under 0.9 of zero-copy.
  static constexpr int kSizeClasses = 12;
  static constexpr uint32_t kCostSamples = 5;
  static int size_class(size_t bytes);
  bool prefers_slots(int size_class) const;
  void add_cost(int size_class, bool slots, uint64_t ns_per_kib);
  // Some local ranks share a core (alike on every rank).
  bool shared_cores() const { return shared_cores_; }
  // Calls placed zero-copy that ran the slot schedule instead (zero_copy.h).
  uint64_t slot_calls() const { return slots_.load(std::memory_order_relaxed); }
  void count_slot_call() { slots_.fetch_add(1, std::memory_order_relaxed); }
  // Barriers run on the control pages (collectives/zero_copy.h), ever.
  uint64_t barriers() const { return barriers_.load(std::memory_order_relaxed); }
  void count_barrier() { barriers_.fetch_add(1, std::memory_order_relaxed); }
  // The timed choice between cached and non-temporal stores for the outputs of the two-shot
  // all_reduces large enough to time it (zero_copy.cc), per size class: each way's cost is the
  // median nanoseconds per KiB of its last kCostSamples calls of the class on this rank.
  // Prefers non-temporal stores once both have samples and they cost less. The calls are
  // numbered alike on every rank (from 1), so the ranks try the same way in the same call.
  uint64_t next_store_candidate(int size_class) { return ++store_candidates_[size_class]; }
  bool prefers_streamed_outputs(int size_class) const;
  void add_store_cost(int size_class, bool streamed, uint64_t ns_per_kib);
  // Zero-copy calls that wrote their outputs with non-temporal stores.
  uint64_t streamed_calls() const { return streamed_.load(std::memory_order_relaxed); }
  void count_streamed_call() { streamed_.fetch_add(1, std::memory_order_relaxed); }
  // The phase counter of this rank's next zero-copy call (each call uses 4 phases).
  uint32_t next_base() {
    ++entered_;
    return base_ += 4;
  }
  // Whether this rank saw every peer enter the zero-copy call of base `base` (its entry round
  // waited for all of them), as the running collective last noted.
  bool saw_all_enter(uint32_t base) const { return saw_all_ == base; }
  void set_saw_all_enter(uint32_t base) { saw_all_ = base; }
  // Numbers the calls of a size class that may run either schedule (zero_copy.h), alike on
  // every rank (from 1).
  uint64_t next_candidate(int size_class) { return ++candidates_[size_class]; }
  // Zero-copy calls this rank entered, ever (next_base calls).
  uint64_t calls_entered() const { return entered_; }

 private:
  // Sets `flag` in this rank's control page and wakes the peers asleep on its phase.
  void raise_flag(std::atomic<uint32_t> SymmetricControl::* flag);
  // The label of this rank's segment (seen in /proc/PID/maps as /memfd:LABEL).
  std::string label_of(const char* kind, uint64_t n) const;

  int rank_;
  std::vector<int> local_;
  int my_ = 0;
  std::string job_;
  bool shared_cores_;
  bool across_hosts_;
  uint64_t next_id_ = 0;  // written by allocate (a collective: one at a time)
  uint32_t base_ = 0;     // written by the running collective
  uint64_t entered_ = 0;  // written by the running collective
  uint32_t saw_all_ = 0;
  uint64_t candidates_[kSizeClasses] = {};        // written by the running collective
  uint64_t store_candidates_[kSizeClasses] = {};  // written by the running collective
  std::vector<SymmetricControl*> controls_;       // by local index; mapped pages
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<SymmetricAllocation>> allocs_;  // guarded by mu_
  std::atomic<size_t> count_{0};
  std::atomic<bool> active_{false};
  std::atomic<uint64_t> moved_{0};
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> one_shot_{0};
  std::atomic<uint64_t> slots_{0};
  std::atomic<uint64_t> barriers_{0};
  std::atomic<uint64_t> streamed_{0};
  struct Costs {
    uint64_t ns_per_kib[kCostSamples] = {};
    uint32_t n = 0;  // samples taken
    uint64_t median() const;
  };
  Costs costs_[kSizeClasses][2];        // [class][slots]; written by the running collective
  Costs store_costs_[kSizeClasses][2];  // [class][streamed]; written by the running collective
};

}  // namespace pyring
