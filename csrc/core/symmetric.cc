#include "core/symmetric.h"

#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "collectives/collectives.h"
#include "core/communicator.h"
#include "core/errors.h"
#include "core/shared_file.h"

namespace pyring {

namespace {

constexpr uint64_t kRecordMagic = 0x7079726d73796d31ULL;  // "pyrmsym1"
constexpr size_t kControlBytes = 4096 + 2 * kStagingBytes;
static_assert(sizeof(SymmetricControl) <= 4096);

// What each rank says of its allocation in the exchange: every rank checks every record.
struct Record {
  uint64_t magic;
  uint64_t id;
  uint64_t bytes;
  int32_t rank;
  int32_t failed;  // this rank could not make its segment; error says why
  char what[240];
  char error[128];
  int32_t kind;      // DeviceKind of the memory
  int32_t index;     // its device
  IpcHandle handle;  // a device allocation's, for the local peers
  // A host allocation's files, for the local peers (open_peer): the process, its
  // descriptors of the memory and of the control page (-1: none made), and their inodes.
  int32_t pid;
  int32_t fd;
  int32_t control_fd;
  int32_t pad;
  uint64_t ino;
  uint64_t control_ino;
};
static_assert(sizeof(Record) == 512);

size_t page_rounded(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return std::max<size_t>(page, (bytes + page - 1) / page * page);
}

template <size_t N>
void copy_text(char (&dst)[N], const std::string& s) {
  std::memset(dst, 0, sizeof dst);
  std::memcpy(dst, s.data(), std::min(s.size(), sizeof dst - 1));
}

// Maps local rank `peer`'s file of `bytes` that its record names (descriptor `fd`, inode `ino`).
uint8_t* open_peer(int peer, int32_t pid, int32_t fd, uint64_t ino, size_t bytes) {
  return map_shared_file(str_cat("symmetric memory: rank ", peer, "'s segment"),
                         SharedFileId{pid, fd, ino}, bytes);
}

// How long a waiting rank whose core is shared yields it before it sleeps (SymmetricHeap::wait).
// At 4 ranks on this machine's 2 cores, 64 KiB all_reduce: 230 us spinning 20 us then sleeping,
// 142 us yielding 200 us after the spin, 66 us yielding from the start (Open MPI: 75 us).
constexpr std::chrono::microseconds kYieldFor{2000};

bool process_gone(int32_t pid) {
  return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

SymmetricAllocation::~SymmetricAllocation() {
  for (size_t li = 0; li < bases.size(); ++li) {
    uint8_t* b = bases[li];
    if (!b) continue;
    if (device.is_cpu()) {
      munmap(b, mapped);
    } else if (static_cast<int>(li) == my) {
      queue->retire(b, false);
    } else {
      queue->retire_mapping(b);
    }
  }
}

SymmetricHeap::SymmetricHeap(int rank, std::vector<int> local, std::string job, bool shared_cores,
                             bool across_hosts)
    : rank_(rank),
      local_(std::move(local)),
      job_(std::move(job)),
      shared_cores_(shared_cores),
      across_hosts_(across_hosts) {
  auto it = std::find(local_.begin(), local_.end(), rank_);
  PYRING_CHECK_ARG(it != local_.end(), "symmetric memory: rank ", rank_,
                   " is not among its host's ranks");
  my_ = static_cast<int>(it - local_.begin());
  PYRING_CHECK_ARG(local_.size() <= kMaxLocalWorld, "symmetric memory spans at most ",
                   kMaxLocalWorld, " ranks of one host, not ", local_.size());
}

SymmetricHeap::~SymmetricHeap() {
  for (SymmetricControl* c : controls_) {
    if (c) munmap(c, kControlBytes);
  }
}

std::string SymmetricHeap::label_of(const char* kind, uint64_t n) const {
  return str_cat("pyring-", job_, "-", kind, n, "-", rank_);
}

std::shared_ptr<SymmetricAllocation> SymmetricHeap::allocate(Communicator& comm, size_t bytes,
                                                             const std::string& what,
                                                             const Device& device,
                                                             Deadline deadline) {
  const uint64_t id = ++next_id_;
  const bool first = controls_.empty();
  const bool host = device.is_cpu();
  auto a = std::make_shared<SymmetricAllocation>();
  a->id = id;
  a->bytes = bytes;
  a->mapped = host ? page_rounded(bytes) : std::max<size_t>(bytes, 256);
  a->device = device;
  a->my = my_;
  a->bases.assign(local_.size(), nullptr);
  if (first) controls_.assign(local_.size(), nullptr);
  // This rank's files: their descriptors stay open until every local peer has opened them.
  std::unique_ptr<SharedFile> file, control_file;

  Record mine{};
  mine.magic = kRecordMagic;
  mine.id = id;
  mine.bytes = bytes;
  mine.rank = rank_;
  mine.kind = static_cast<int32_t>(device.kind);
  mine.index = device.index;
  mine.pid = static_cast<int32_t>(getpid());
  mine.fd = mine.control_fd = -1;
  copy_text(mine.what, what);
  try {
    if (first) {
      control_file = std::make_unique<SharedFile>(label_of("yc", id));
      controls_[my_] = reinterpret_cast<SymmetricControl*>(control_file->map(kControlBytes));
      controls_[my_]->pid = static_cast<int32_t>(getpid());
      mine.control_fd = control_file->id().fd;
      mine.control_ino = control_file->id().ino;
    }
    if (host) {
      file = std::make_unique<SharedFile>(label_of("y", id));
      a->bases[my_] = file->map(a->mapped);
      mine.fd = file->id().fd;
      mine.ino = file->id().ino;
    } else {
      a->queue = comm.device_queue(device);
      DeviceRuntime& rt = device_runtime(device.kind);
      a->bases[my_] = static_cast<uint8_t*>(device_alloc(rt, device.index, a->mapped));
      mine.handle = rt.ipc_handle(device.index, a->bases[my_]);
    }
  } catch (const std::exception& e) {
    mine.failed = 1;
    copy_text(mine.error, e.what());
  }

  try {
    const int world = comm.size();
    std::vector<Record> all(static_cast<size_t>(world));
    allgather(comm, BufferView{&mine, sizeof mine, DType::kUInt8},
              BufferView{all.data(), sizeof mine * all.size(), DType::kUInt8}, deadline);
    for (const Record& r : all) {
      PYRING_CHECK(r.magic == kRecordMagic && r.id == id, CommError, "symmetric memory: rank ",
                   r.rank, " made allocation ", r.id, " where this rank made ", id,
                   " (the ranks' allocations are out of step)");
      PYRING_CHECK(!r.failed, InvalidArgument, "pyring.empty: rank ", r.rank,
                   " could not allocate ", r.what, ": ", r.error);
    }
    for (const Record& r : all) {
      PYRING_CHECK(r.bytes == all[0].bytes && std::strcmp(r.what, all[0].what) == 0,
                   InvalidArgument,
                   "pyring.empty is collective, with the same size and dtype on "
                   "every rank: rank 0 called ",
                   all[0].what, " but rank ", r.rank, " called ", r.what);
      PYRING_CHECK(r.kind == all[0].kind, InvalidArgument,
                   "pyring.empty is collective, on devices of one kind on every rank: rank 0 "
                   "allocated on ",
                   Device{static_cast<DeviceKind>(all[0].kind), all[0].index}.str(), " but rank ",
                   r.rank, " on ", Device{static_cast<DeviceKind>(r.kind), r.index}.str());
    }
    for (size_t li = 0; li < local_.size(); ++li) {
      if (static_cast<int>(li) == my_) continue;
      const int peer = local_[li];
      const Record& r = all[static_cast<size_t>(peer)];
      if (first) {
        controls_[li] = reinterpret_cast<SymmetricControl*>(
            open_peer(peer, r.pid, r.control_fd, r.control_ino, kControlBytes));
      }
      if (host) {
        a->bases[li] = open_peer(peer, r.pid, r.fd, r.ino, a->mapped);
      } else {
        a->bases[li] =
            static_cast<uint8_t*>(device_runtime(device.kind).ipc_open(device.index, r.handle));
      }
    }
    ring_barrier(comm, deadline);  // every local rank has mapped every segment
  } catch (...) {
    if (first) {
      for (SymmetricControl*& c : controls_) {
        if (c) munmap(c, kControlBytes);
      }
      controls_.clear();
    }
    throw;
  }
  active_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> g(mu_);
    allocs_.push_back(a);
    count_.store(allocs_.size(), std::memory_order_release);
  }
  return a;
}

void SymmetricHeap::release(uint64_t id) {
  std::shared_ptr<SymmetricAllocation> gone;  // unmapped outside the lock
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = allocs_.begin(); it != allocs_.end(); ++it) {
    if ((*it)->id == id) {
      gone = std::move(*it);
      allocs_.erase(it);
      break;
    }
  }
  count_.store(allocs_.size(), std::memory_order_release);
}

SymmetricSpan SymmetricHeap::find(const void* data, size_t bytes, const Device& device) const {
  if (!any()) return {};
  const auto* p = static_cast<const uint8_t*>(data);
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& a : allocs_) {
    if (a->device != device) continue;
    const uint8_t* base = a->bases[static_cast<size_t>(my_)];
    if (p >= base && p + bytes <= base + a->bytes) {
      return SymmetricSpan{a, static_cast<size_t>(p - base)};
    }
  }
  return {};
}

int SymmetricHeap::local_of(int rank) const {
  auto it = std::find(local_.begin(), local_.end(), rank);
  return it == local_.end() ? -1 : static_cast<int>(it - local_.begin());
}

size_t SymmetricHeap::allocated_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  size_t n = 0;
  for (const auto& a : allocs_) n += a->mapped;
  return n;
}

int SymmetricHeap::size_class(size_t bytes) {
  int c = 0;
  for (size_t b = bytes >> 13; b >= 4 && c < kSizeClasses - 1; b >>= 2) ++c;
  return c;
}

uint64_t SymmetricHeap::Costs::median() const {
  uint64_t v[kCostSamples];
  std::copy(ns_per_kib, ns_per_kib + kCostSamples, v);
  std::nth_element(v, v + kCostSamples / 2, v + kCostSamples);
  return v[kCostSamples / 2];
}

bool SymmetricHeap::prefers_slots(int c) const {
  const Costs& zero = costs_[c][0];
  const Costs& slots = costs_[c][1];
  if (zero.n < kCostSamples || slots.n < kCostSamples) return false;
  return slots.median() * 10 < zero.median() * 9;
}

void SymmetricHeap::add_cost(int c, bool slots, uint64_t ns_per_kib) {
  Costs& k = costs_[c][slots ? 1 : 0];
  k.ns_per_kib[k.n++ % kCostSamples] = ns_per_kib;
}

bool SymmetricHeap::prefers_streamed_outputs(int c) const {
  const Costs& cached = store_costs_[c][0];
  const Costs& streamed = store_costs_[c][1];
  if (cached.n < kCostSamples || streamed.n < kCostSamples) return false;
  return streamed.median() < cached.median();
}

void SymmetricHeap::add_store_cost(int c, bool streamed, uint64_t ns_per_kib) {
  Costs& k = store_costs_[c][streamed ? 1 : 0];
  k.ns_per_kib[k.n++ % kCostSamples] = ns_per_kib;
}

void SymmetricHeap::raise(uint32_t phase) {
  SymmetricControl& c = control(static_cast<size_t>(my_));
  c.phase.store(phase, std::memory_order_seq_cst);
  if (c.waiters.load(std::memory_order_seq_cst) != 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&c.phase), FUTEX_WAKE, INT32_MAX, nullptr,
            nullptr, 0);
  }
}

void SymmetricHeap::enter(uint64_t seq, bool zero_copy) {
  if (controls_.empty()) return;
  control(static_cast<size_t>(my_))
      .entered.store(2 * seq + (zero_copy ? 1 : 0), std::memory_order_release);
}

void SymmetricHeap::raise_flag(std::atomic<uint32_t> SymmetricControl::* flag) {
  if (controls_.empty()) return;
  SymmetricControl& c = control(static_cast<size_t>(my_));
  (c.*flag).store(1, std::memory_order_seq_cst);
  // Peers asleep on this rank's phase wake and see it.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&c.phase), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
          0);
}

void SymmetricHeap::abort() {
  raise_flag(&SymmetricControl::aborted);
}

void SymmetricHeap::announce_closed() {
  raise_flag(&SymmetricControl::closed);
}

void SymmetricHeap::wait(size_t li, uint32_t target, int spin_us, Deadline deadline,
                         const char* what, uint64_t seq) {
  SymmetricControl& c = control(li);
  auto reached = [&](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; };
  if (reached(c.phase.load(std::memory_order_acquire))) return;
  if (shared_cores_) {
    // The peer this rank waits for may be the one its core would run next: yield to it, for
    // longer than a spin (a sleep would cost a wake-up across cores).
    const Clock::time_point until =
        Clock::now() + std::max(kYieldFor, std::chrono::microseconds(spin_us));
    do {
      sched_yield();
      if (reached(c.phase.load(std::memory_order_acquire))) return;
    } while (Clock::now() < until);
  } else {
    const Clock::time_point spin_until = Clock::now() + std::chrono::microseconds(spin_us);
    do {
      for (int k = 0; k < 64; ++k) {
        if (reached(c.phase.load(std::memory_order_acquire))) return;
        cpu_relax();
      }
    } while (Clock::now() < spin_until);
  }
  const int peer = local_[li];
  for (;;) {
    if (c.aborted.load(std::memory_order_acquire) != 0) {
      throw PeerLost(
          peer, str_cat("rank ", peer, " gave up while this rank waited for it in ", what), true);
    }
    // Its phases were all raised before it closed: one not reached now never will be.
    if (c.closed.load(std::memory_order_acquire) != 0 &&
        !reached(c.phase.load(std::memory_order_acquire))) {
      PYRING_THROW(CommError, "rank ", peer,
                   " closed its communicator while this rank waited for it in ", what);
    }
    if (process_gone(c.pid)) {
      throw PeerLost(peer, str_cat("rank ", peer, " (pid ", c.pid,
                                   ") died while this rank waited for it in ", what));
    }
    PYRING_CHECK(seq == 0 || c.entered.load(std::memory_order_acquire) != 2 * seq, CommError, what,
                 ": rank ", peer, " entered this collective (#", seq,
                 ") on the slot path while this rank took the zero-copy path: its buffer is "
                 "not symmetric memory while this rank's is (pass pyring.empty tensors on "
                 "every rank, or on none), or it called another collective");
    PYRING_CHECK(!deadline.expired(), TimeoutError, "timed out waiting for rank ", peer, " in ",
                 what, " (zero-copy phase ", target, ", it is at ",
                 c.phase.load(std::memory_order_relaxed), ")");
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t v = c.phase.load(std::memory_order_seq_cst);
    if (!reached(v) && c.aborted.load(std::memory_order_seq_cst) == 0 &&
        c.closed.load(std::memory_order_seq_cst) == 0) {
      struct timespec ts{0, 1000000};  // 1 ms: then the peer's liveness and the deadline
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&c.phase), FUTEX_WAIT, v, &ts, nullptr, 0);
    }
    c.waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(c.phase.load(std::memory_order_acquire))) return;
  }
}

}  // namespace pyring
