// The CUDA device runtime when the extension is built without CUDA: asking for it throws.
#ifndef PYRING_WITH_CUDA

#include "core/errors.h"
#include "device/cuda/cuda_runtime.h"

namespace pyring {

DeviceRuntime& cuda_runtime() {
  PYRING_THROW(CudaError,
               "the CUDA device runtime is unavailable: pyring was built without CUDA (no nvcc at "
               "build time)");
}

}  // namespace pyring

#endif
