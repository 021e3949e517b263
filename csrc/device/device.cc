#include <map>
#include <mutex>
#include <thread>

#include "core/errors.h"
#include "device/cuda/cuda_runtime.h"
#include "device/runtime.h"
#include "device/sim/sim_runtime.h"

namespace pyring {

DeviceRuntime& device_runtime(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCuda:
      return cuda_runtime();
    case DeviceKind::kSim:
      return sim_runtime();
    case DeviceKind::kCpu:
      break;
  }
  PYRING_THROW(InvalidArgument, "the host has no device runtime");
}

namespace {

struct Held {
  std::mutex mu;
  std::map<void*, std::pair<Device, size_t>> sizes;  // guarded by mu
  std::map<std::string, uint64_t> by_device;         // guarded by mu
  std::function<void(const Device&)> releaser;       // guarded by mu
};

// Leaked on purpose: frees may run from threads that outlive static destruction.
Held& held() {
  static Held* h = new Held();
  return *h;
}

}  // namespace

void set_cached_memory_releaser(std::function<void(const Device&)> fn) {
  std::lock_guard<std::mutex> lock(held().mu);
  held().releaser = std::move(fn);
}

void* device_alloc(DeviceRuntime& rt, int index, size_t bytes) {
  const Device device{rt.kind(), index};
  void* p = nullptr;
  try {
    p = rt.alloc(index, bytes);
  } catch (const DeviceOutOfMemory& e) {
    std::function<void(const Device&)> release;
    {
      std::lock_guard<std::mutex> lock(held().mu);
      release = held().releaser;
    }
    if (!release) throw;
    release(device);
    try {
      p = rt.alloc(index, bytes);
    } catch (const DeviceOutOfMemory& again) {
      PYRING_THROW(DeviceOutOfMemory, again.what(),
                   "; also after the caching allocator released its cached blocks (pyring holds ",
                   device_memory_held_on(device), " bytes of ", device.str(), ")");
    }
  }
  std::lock_guard<std::mutex> lock(held().mu);
  held().sizes[p] = {device, bytes};
  held().by_device[device.str()] += bytes;
  return p;
}

void device_free(DeviceRuntime& rt, int index, void* p) noexcept {
  if (p == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(held().mu);
    auto it = held().sizes.find(p);
    if (it != held().sizes.end()) {
      held().by_device[it->second.first.str()] -= it->second.second;
      held().sizes.erase(it);
    }
  }
  rt.free(index, p);
}

uint64_t device_memory_held_on(const Device& device) {
  std::lock_guard<std::mutex> lock(held().mu);
  auto it = held().by_device.find(device.str());
  return it == held().by_device.end() ? 0 : it->second;
}

std::vector<std::pair<std::string, uint64_t>> device_memory_held() {
  std::lock_guard<std::mutex> lock(held().mu);
  return {held().by_device.begin(), held().by_device.end()};
}

void check_not_capturing(const Device& device, StreamId stream) {
  if (device.is_cpu()) return;
  PYRING_CHECK(!device_runtime(device.kind).is_capturing(device.index, stream), Error, "stream ",
               reinterpret_cast<void*>(stream), " of ", device.str(),
               " is capturing a graph: pyring's collectives cannot be captured (their host part "
               "runs at the call, not at the replay); call them outside the capture, between "
               "the graph's replays");
}

void check_stream(const StreamProbe& probe, const char* what) {
  if (probe.rt == nullptr) return;
  const std::string err = probe.rt->stream_error(probe.device.index, probe.stream);
  PYRING_CHECK(err.empty(), DeviceFault, probe.device.str(), " stopped on ", err,
               " while waiting for ", what);
}

void host_wait_flag(const Flag* flag, uint64_t value, Deadline deadline, const char* what,
                    const StreamProbe& probe) {
  constexpr int kSpins = 2000;
  for (int i = 0; i < kSpins; ++i) {
    if (flag->load(std::memory_order_acquire) >= value) return;
    cpu_relax();
  }
  // Short sleeps: a staged chunk's copy takes about 100 us on a GPU, and each step it is
  // overslept delays the chunk's exchange.
  auto step = std::chrono::microseconds(10);
  while (flag->load(std::memory_order_acquire) < value) {
    PYRING_CHECK(!deadline.expired(), TimeoutError, "timed out waiting for ", what);
    check_stream(probe, what);
    std::this_thread::sleep_for(step);
    if (step < std::chrono::microseconds(80)) step *= 2;
  }
}

}  // namespace pyring
