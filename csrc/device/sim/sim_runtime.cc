#include "device/sim/sim_runtime.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "device/sim/sim_arena.h"
#include "device/sim/sim_stream.h"
#include "kernels/onebit.h"
#include "kernels/reduce.h"
#include "kernels/wire_cast.h"

namespace pyring {

namespace {

// The calling thread's current sim device (CUDA's per-thread device; 0 by default).
thread_local int t_current = 0;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// The IPC handle's bytes.
struct SimIpc {
  int32_t pid;
  int32_t fd;
  uint64_t offset;
  uint64_t bytes;
};
static_assert(sizeof(SimIpc) <= sizeof(IpcHandle::bytes), "SimIpc must fit an IpcHandle");

class Sim final : public SimRuntime {
 public:
  Sim() : devices_(env_int("PYRING_SIM_DEVICES", kSimDefaultDevices)) {
    for (int i = 0; i < devices_; ++i) {
      device_mu_.push_back(std::make_unique<std::shared_mutex>());
      contexts_.push_back(std::make_shared<SimContext>());
    }
    delay_us_.store(env_int("PYRING_SIM_DELAY_US", 0));
    const char* ipc = std::getenv("PYRING_SIM_IPC");
    refuse_ipc_ = ipc && std::strcmp(ipc, "refuse") == 0;
    const char* memops = std::getenv("PYRING_SIM_STREAM_MEMOPS");
    no_stream_flags_ = memops && std::strcmp(memops, "off") == 0;
    const char* capacity = std::getenv("PYRING_SIM_CAPACITY");
    capacity_ = capacity && *capacity ? std::strtoull(capacity, nullptr, 10) : 0;
  }

  DeviceKind kind() const override { return DeviceKind::kSim; }
  int device_count() override { return devices_; }

  int make_current(int index) override {
    check(index);
    const int previous = t_current;
    t_current = index;
    std::lock_guard<std::mutex> lock(mu_);
    contexts_made_.insert(index);
    return previous;
  }
  void restore_current(int previous) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    if (contexts_made_.count(previous) > 0) t_current = previous;
  }
  int current_device() const override { return t_current; }

  void* alloc(int index, size_t bytes) override {
    DeviceGuard guard(*this, index);
    Quiesce q = quiesce(index, "alloc");
    return take(index, bytes);
  }
  void* alloc_cached(int index, size_t bytes) override {
    check(index);
    return take(index, bytes);
  }
  void free(int index, void* p) noexcept override {
    Quiesce q = quiesce(index, "free");
    give_back(p, true);
  }
  void release(int, void* p) noexcept override { give_back(p, false); }

  void* alloc_host(int index, size_t bytes) override {
    DeviceGuard guard(*this, index);
    Quiesce q = quiesce(index, "alloc_host");
    void* p = std::calloc(1, bytes == 0 ? 1 : bytes);
    PYRING_CHECK(p != nullptr, CudaError, "sim alloc_host of ", bytes, " bytes failed");
    std::lock_guard<std::mutex> lock(mu_);
    pinned_[static_cast<uint8_t*>(p)] = bytes == 0 ? 1 : bytes;
    return p;
  }
  void free_host(int index, void* p) noexcept override {
    Quiesce q = quiesce(index, "free_host");
    {
      std::lock_guard<std::mutex> lock(mu_);
      pinned_.erase(static_cast<uint8_t*>(p));
    }
    std::free(p);
  }

  StreamId create_stream(int index) override { return make_stream(index, false); }
  StreamId create_blocking_stream(int index) override { return make_stream(index, true); }

  void destroy_stream(int index, StreamId s) noexcept override {
    std::shared_ptr<SimStream> gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = streams_.find({index, s});
      if (it == streams_.end() || s == 0) return;
      gone = std::move(it->second);
      streams_.erase(it);
    }
  }

  // A copy to or from pageable host memory holds the host until it is done, as CUDA's does.
  void copy_async(int index, void* dst, const void* src, size_t bytes, StreamId s) override {
    submit(index, s, [d = at(dst), r = at(src), bytes] { std::memcpy(d, r, bytes); });
    if (bytes > 0 && (pageable(dst) || pageable(src))) synchronize(index, s);
  }

  void require_stream_flags(int index) override {
    check(index);
    PYRING_CHECK(!no_stream_flags_, CudaError, kNoStreamFlags, " (", where(index),
                 ": PYRING_SIM_STREAM_MEMOPS=off)");
  }

  void write_flag(int index, StreamId s, Flag* flag, uint64_t value) override {
    check_stream_flags(index, "cuStreamWriteValue64");
    check_flag(index, flag, "cuStreamWriteValue64");
    submit(index, s, [=] { raise_flag(*flag, value); });
  }

  void wait_flag(int index, StreamId s, Flag* flag, uint64_t value) override {
    check_stream_flags(index, "cuStreamWaitValue64");
    check_flag(index, flag, "cuStreamWaitValue64");
    SimStream* st = &stream(index, s);
    submit(index, s, [=] {
      if (flag->load(std::memory_order_acquire) >= value) return;
      st->set_waiting(
          str_cat("a wait for the flag at ", static_cast<const void*>(flag), " to reach ", value));
      while (flag->load(std::memory_order_acquire) < value && !st->stopping() &&
             !st->context().faulted()) {
        std::this_thread::sleep_for(std::chrono::microseconds(10));
      }
      st->set_waiting("");
    });
  }

  void synchronize(int index, StreamId s) override { stream(index, s).synchronize(); }

  bool is_capturing(int index, StreamId s) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    return capturing_.count({index, s}) > 0;
  }
  void set_capturing(int index, StreamId s, bool on) override {
    check(index);
    std::lock_guard<std::mutex> lock(mu_);
    if (on) {
      capturing_.insert({index, s});
    } else {
      capturing_.erase({index, s});
    }
  }

  std::string stream_error(int index, StreamId s) noexcept override {
    try {
      return stream(index, s).error();
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  void launch_out_of_bounds(int index, StreamId s) override {
    submit(index, s, [] { throw SimFault(kSimIllegalAddress); });
  }

  void reduce_accumulate(int index, DType dtype, ReduceOp op, const void* a, const void* b,
                         void* acc, size_t n, StreamId s) override {
    load(index, Kernel::kReduceAccumulate);
    submit(index, s, [=, a = at(a), b = at(b), acc = at(acc)] {
      grid_reduce_accumulate(dtype, op, a, b, acc, n);
    });
  }
  void reduce_finish(int index, DType dtype, ReduceOp op, const void* a, const void* b, void* out,
                     size_t n, int world, StreamId s) override {
    load(index, Kernel::kReduceFinish);
    submit(index, s, [=, a = at(a), b = at(b), out = at(out)] {
      grid_reduce_finish(dtype, op, a, b, out, n, world);
    });
  }
  void finish_wide(int index, DType dtype, ReduceOp op, const void* acc, void* out, size_t n,
                   int world, StreamId s) override {
    load(index, Kernel::kFinishWide);
    submit(index, s,
           [=, acc = at(acc), out = at(out)] { grid_finish_wide(dtype, op, acc, out, n, world); });
  }
  void cast(int index, DType from, DType to, const void* in, void* out, size_t n,
            StreamId s) override {
    load(index, Kernel::kCast);
    submit(index, s, [=, in = at(in), out = at(out)] { grid_cast(from, to, in, out, n); });
  }
  size_t onebit_encode(int index, const float* in, uint16_t* residual, float pending, size_t n,
                       uint8_t* out, OnebitHeader* header, StreamId s) override {
    load(index, Kernel::kOnebitEncode);
    size_t bytes = 0;
    submit(index, s, [=, &bytes, in = at(in), residual = at(residual), out = at(out)] {
      bytes = grid_onebit_encode(in, residual, pending, n, out, header);
    });
    synchronize(index, s);
    return bytes;
  }
  void onebit_decode(int index, const OnebitHeader& header, const uint8_t* encoded, size_t n,
                     float alpha, bool accumulate, float* out, StreamId s) override {
    load(index, Kernel::kOnebitDecode);
    // The caller's header, copied: the stream runs after the call has returned.
    OnebitHeader h = header;
    PYRING_CHECK_ARG(h.zeros != kMaskCached, "device segments never use the mask caches");
    submit(index, s, [=, encoded = at(encoded), out = at(out)] {
      grid_onebit_decode(h, encoded, n, alpha, accumulate, out);
    });
  }

  IpcHandle ipc_handle(int index, void* p) override {
    check(index);
    PYRING_CHECK(!refuse_ipc_, CudaError, "sim ipc_handle on ", where(index),
                 ": IPC refused (PYRING_SIM_IPC=refuse)");
    const SimArenaRef ref = arena_.find(p);
    PYRING_CHECK(ref.fd >= 0, CudaError, "sim ipc_handle: ", p, " is not sim device memory");
    SimIpc h{static_cast<int32_t>(getpid()), ref.fd, ref.offset, ref.arena_bytes};
    IpcHandle out;
    std::memcpy(out.bytes, &h, sizeof h);
    return out;
  }

  void* ipc_open(int index, const IpcHandle& handle) override {
    check(index);
    PYRING_CHECK(!refuse_ipc_, CudaError, "sim ipc_open on ", where(index),
                 ": IPC refused (PYRING_SIM_IPC=refuse)");
    SimIpc h;
    std::memcpy(&h, handle.bytes, sizeof h);
    PYRING_CHECK(h.pid != static_cast<int32_t>(getpid()), CudaError,
                 "cudaIpcOpenMemHandle failed on ", where(index),
                 ": cudaErrorInvalidContext (invalid device context): the handle was exported "
                 "by this process, which cannot open it");
    const IpcKey key{h.pid, h.fd, h.bytes};
    {
      // The same allocation opened again maps once, counted, as the CUDA driver does.
      std::lock_guard<std::mutex> lock(mu_);
      auto it = mappings_.find(key);
      if (it != mappings_.end()) {
        ++it->second.opens;
        auto* p = it->second.base + h.offset;
        opened_.insert({p, key});
        return p;
      }
    }
    const std::string path = str_cat("/proc/", h.pid, "/fd/", h.fd);
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    PYRING_CHECK(fd >= 0, CudaError, "sim ipc_open of ", path, ": ", std::strerror(errno));
    // Device addresses with no access, and the readable view the streams use (see SimArena).
    void* base = mmap(nullptr, h.bytes, PROT_NONE, MAP_SHARED, fd, 0);
    int err = errno;
    void* shadow = mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (shadow == MAP_FAILED) err = errno;
    ::close(fd);
    if (base == MAP_FAILED || shadow == MAP_FAILED) {
      if (base != MAP_FAILED) munmap(base, h.bytes);
      if (shadow != MAP_FAILED) munmap(shadow, h.bytes);
      PYRING_THROW(CudaError, "sim ipc_open: mmap: ", std::strerror(err));
    }
    auto* p = static_cast<uint8_t*>(base) + h.offset;
    std::lock_guard<std::mutex> lock(mu_);
    mappings_[key] =
        IpcMapping{static_cast<uint8_t*>(base), static_cast<uint8_t*>(shadow), h.bytes, 1};
    opened_.insert({p, key});
    return p;
  }

  // Each open is matched by one close; the mapping goes with the last.
  void ipc_close(int, void* p) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = opened_.find(static_cast<uint8_t*>(p));
    if (it == opened_.end()) return;
    auto m = mappings_.find(it->second);
    opened_.erase(it);
    if (m == mappings_.end() || --m->second.opens > 0) return;
    munmap(m->second.base, m->second.bytes);
    munmap(m->second.shadow, m->second.bytes);
    mappings_.erase(m);
  }
  uint8_t* host_view(const void* p) override {
    if (uint8_t* v = arena_.host_view(p)) return v;
    const auto* q = static_cast<const uint8_t*>(p);
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, m] : mappings_) {
      if (q >= m.base && q < m.base + m.bytes) return m.shadow + (q - m.base);
    }
    return const_cast<uint8_t*>(q);
  }
  int ipc_mappings() override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(mappings_.size());
  }

  void launch(int index, StreamId s, std::function<void()> fn) override {
    submit(index, s, std::move(fn));
  }
  void synchronize_device(int index) override {
    check(index);
    Quiesce q = quiesce(index, "synchronize_device");
  }
  void set_delay_us(int us) override { delay_us_.store(us < 0 ? 0 : us); }
  size_t allocated_bytes() override { return arena_.allocated_bytes(); }

 private:
  std::string where(int index) const { return str_cat("sim:", index); }
  enum class Kernel {
    kReduceAccumulate,
    kReduceFinish,
    kFinishWide,
    kCast,
    kOnebitEncode,
    kOnebitDecode
  };
  // The first launch of `k` on device `index` loads its module: a synchronizing call.
  void load(int index, Kernel k) {
    check(index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!loaded_.insert({index, static_cast<int>(k)}).second) return;
    }
    Quiesce q = quiesce(index, "the first launch of a kernel (its module loaded lazily)");
  }
  // Queues fn on stream s of device `index`, as a runtime call that a synchronizing call of
  // another thread holds back (see the header).
  void submit(int index, StreamId s, std::function<void()> fn) {
    DeviceGuard guard(*this, index);
    // After a fault every call on the device returns it, as CUDA's calls return a sticky error.
    const SimContext& ctx = *context(index);
    PYRING_CHECK(!ctx.faulted(), CudaError, "sim:", index, " has faulted: ", ctx.fault());
    std::shared_lock<std::shared_mutex> lock(*device_mu_[static_cast<size_t>(index)]);
    SimStream& st = stream(index, s);
    auto after = legacy_order(index, s, st);
    if (!after.empty()) {
      fn = [after = std::move(after), fn = std::move(fn)] {
        for (const auto& [other, n] : after) other->wait_done(n);
        fn();
      };
    }
    st.enqueue(std::move(fn));
  }
  // A synchronizing call's hold on device `index`: no other thread queues work on it until the
  // call returns, and every stream of the device has drained (see the header).
  using Quiesce = std::unique_lock<std::shared_mutex>;
  Quiesce quiesce(int index, const char* what) noexcept {
    if (index < 0 || index >= devices_) return Quiesce();
    Quiesce hold(*device_mu_[static_cast<size_t>(index)]);
    wait_device(index, what);
    return hold;
  }
  // Waits for every stream of the device; aborts after kSimFreeWaitS (see the header).
  void wait_device(int index, const char* what) noexcept {
    std::vector<std::pair<StreamId, std::shared_ptr<SimStream>>> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [key, st] : streams_) {
        if (key.first == index) all.emplace_back(key.second, st);
      }
    }
    for (const auto& [id, st] : all) {
      if (st->drain_for(std::chrono::seconds(kSimFreeWaitS))) continue;
      const std::string waiting = st->waiting();
      std::fprintf(stderr,
                   "pyring sim: %s on sim:%d waited %d s for its stream %llu, which is still "
                   "busy%s%s: on a GPU this %s would wait for it forever (it synchronizes the "
                   "device, as cudaMalloc, cudaHostAlloc, cudaFree and a kernel's first launch "
                   "may)\n",
                   what, index, kSimFreeWaitS, static_cast<unsigned long long>(id),
                   waiting.empty() ? "" : " with ", waiting.c_str(), what);
      std::abort();
    }
  }
  void check(int index) const {
    PYRING_CHECK_ARG(index >= 0 && index < devices_, "sim device index ", index, " out of range (",
                     devices_, " sim device(s))");
  }
  // A flag operation on a device without stream memory operations fails, as the driver's call
  // does (CUDA_ERROR_NOT_SUPPORTED).
  void check_stream_flags(int index, const char* call) const {
    PYRING_CHECK(!no_stream_flags_, CudaError, call, " failed on ", where(index),
                 ": CUresult 801 (operation not supported): PYRING_SIM_STREAM_MEMOPS=off");
  }
  // Device memory within the device's capacity (PYRING_SIM_CAPACITY); DeviceOutOfMemory past
  // it, as cudaMalloc's cudaErrorMemoryAllocation.
  void* take(int index, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      uint64_t& used = used_[index];
      PYRING_CHECK(capacity_ == 0 || used + bytes <= capacity_, DeviceOutOfMemory, "sim alloc of ",
                   bytes, " bytes on ", where(index),
                   ": cudaErrorMemoryAllocation (out of memory): ", used, " of its ", capacity_,
                   " bytes (PYRING_SIM_CAPACITY) in use");
      used += bytes;
    }
    void* p = nullptr;
    try {
      p = arena_.alloc(bytes, where(index).c_str());
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      used_[index] -= bytes;
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    taken_[p] = {index, bytes};
    return p;
  }
  // unmap: as free() (see SimArena::free).
  void give_back(void* p, bool unmap) noexcept {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = taken_.find(p);
      if (it == taken_.end()) return;
      used_[it->second.first] -= it->second.second;
      taken_.erase(it);
    }
    arena_.free(p, unmap);
  }
  // What an operation queued on stream s now waits for under the legacy default stream's rules:
  // on the legacy stream (0), the work queued so far on every blocking stream of the device; on
  // a blocking stream, the work queued so far on the legacy stream.
  std::vector<std::pair<std::shared_ptr<SimStream>, uint64_t>> legacy_order(int index, StreamId s,
                                                                            SimStream& st) {
    std::vector<std::pair<std::shared_ptr<SimStream>, uint64_t>> after;
    if (s != 0 && !st.blocking()) return after;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, other] : streams_) {
      if (key.first != index || other.get() == &st) continue;
      if (s == 0 ? other->blocking() : key.second == 0) after.emplace_back(other, other->queued());
    }
    return after;
  }
  // Where the streams reach `p` (see the header); any thread.
  template <class T>
  T* at(T* p) {
    return reinterpret_cast<T*>(host_view(p));
  }

  StreamId make_stream(int index, bool blocking) {
    DeviceGuard guard(*this, index);
    std::lock_guard<std::mutex> lock(mu_);
    StreamId id = next_stream_++;
    streams_[{index, id}] = std::make_shared<SimStream>(&delay_us_, context(index), blocking);
    return id;
  }
  // Host memory that is neither pinned (alloc_host) nor the device's (its arenas, or a mapping
  // opened through an IPC handle).
  bool pageable(const void* p) {
    if (arena_.find(p).fd >= 0) return false;
    const auto* q = static_cast<const uint8_t*>(p);
    std::lock_guard<std::mutex> lock(mu_);
    return !within(pinned_, q) && !mapped_by_ipc(q);
  }
  bool mapped_by_ipc(const uint8_t* q) const {
    for (const auto& [key, m] : mappings_) {
      if (q >= m.base && q < m.base + m.bytes) return true;
    }
    return false;
  }
  static bool within(const std::map<uint8_t*, size_t>& ranges, const uint8_t* q) {
    auto it = ranges.upper_bound(const_cast<uint8_t*>(q));
    if (it == ranges.begin()) return false;
    --it;
    return q < it->first + it->second;
  }
  // A flag is a 64-bit word of mapped pinned memory (alloc_host), as the stream memory
  // operations need: anything else fails as the driver's call does (CUDA_ERROR_INVALID_VALUE).
  void check_flag(int index, const Flag* flag, const char* call) {
    const auto* q = reinterpret_cast<const uint8_t*>(flag);
    bool ok = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ok = within(pinned_, q) && within(pinned_, q + sizeof(Flag) - 1);
    }
    PYRING_CHECK(ok, CudaError, call, " failed on ", where(index),
                 ": CUresult 1 (invalid argument): the flag at ", static_cast<const void*>(flag),
                 " is not in mapped pinned memory from alloc_host");
  }
  std::shared_ptr<SimContext> context(int index) const {
    return contexts_[static_cast<size_t>(index)];
  }
  // Stream s of device `index`; 0 is the device's default stream, made on first use.
  SimStream& stream(int index, StreamId s) {
    check(index);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find({index, s});
    if (it == streams_.end()) {
      PYRING_CHECK_ARG(s == 0, "sim stream ", s, " does not exist on ", where(index));
      it = streams_
               .emplace(std::make_pair(index, s),
                        std::make_shared<SimStream>(&delay_us_, context(index), true))
               .first;
    }
    return *it->second;
  }

  const int devices_;
  bool refuse_ipc_ = false;
  bool no_stream_flags_ = false;
  uint64_t capacity_ = 0;  // bytes per device; 0: unbounded
  std::atomic<int> delay_us_{0};
  SimArena arena_;
  std::vector<std::unique_ptr<std::shared_mutex>> device_mu_;  // one per device (quiesce)
  std::vector<std::shared_ptr<SimContext>> contexts_;          // one per device
  std::mutex mu_;
  // An allocation's file as an IPC handle names it: (exporting pid, its fd, the file's bytes).
  using IpcKey = std::tuple<int32_t, int32_t, uint64_t>;
  struct IpcMapping {
    uint8_t* base;    // the device addresses handed out: no access
    uint8_t* shadow;  // the readable view
    size_t bytes;
    int opens;
  };
  std::map<IpcKey, IpcMapping> mappings_;          // guarded by mu_
  std::multimap<uint8_t*, IpcKey> opened_;         // pointer handed out -> its file; mu_
  std::map<uint8_t*, size_t> pinned_;              // alloc_host ranges; guarded by mu_
  std::set<std::pair<int, StreamId>> capturing_;   // guarded by mu_
  std::map<int, uint64_t> used_;                   // device -> bytes; guarded by mu_
  std::map<void*, std::pair<int, size_t>> taken_;  // guarded by mu_
  std::set<int> contexts_made_;           // devices some thread has made current; guarded by mu_
  std::set<std::pair<int, int>> loaded_;  // (device, Kernel) launched once; guarded by mu_
  std::map<std::pair<int, StreamId>, std::shared_ptr<SimStream>> streams_;  // guarded by mu_
  StreamId next_stream_ = 1;                                                // guarded by mu_
};

// Leaked on purpose: stream threads may still run while the process exits.
Sim* g_sim = nullptr;
std::once_flag g_once;

}  // namespace

SimRuntime& sim_runtime() {
  std::call_once(g_once, [] {
    g_sim = new Sim();
    // A forked child has none of the parent's stream threads: it starts a runtime of its own.
    pthread_atfork(nullptr, nullptr, [] { g_sim = new Sim(); });
  });
  return *g_sim;
}

}  // namespace pyring
