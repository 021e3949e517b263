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
