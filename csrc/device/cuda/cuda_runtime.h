// The CUDA device: the device seam on the CUDA runtime (cudart, linked statically; the few driver
// functions it needs are looked up at run time, so the module loads without a driver).
//
// - Every method that takes `index` makes that device current on the calling thread for the
//   call (DeviceGuard) and the caller's device current again after it, where that device has a
//   primary context already (none is created to restore it).
// - Flags live in mapped pinned host memory from alloc_host(); write_flag and wait_flag queue
//   the driver's stream memory operations on them (64-bit, wait: >=).
// - onebit_encode uses one workspace per device, allocated on first use and never freed;
//   encodes on one device run one at a time.
// - IPC handles: the allocation's cudaIpcMemHandle_t and the offset of the pointer in it.
#pragma once

#include "device/runtime.h"

namespace pyring {

// The process's CUDA runtime, created on first use and never destroyed. Throws CudaError when
// pyring was built without CUDA.
DeviceRuntime& cuda_runtime();

}  // namespace pyring
