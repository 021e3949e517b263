#include <cuda_runtime.h>

#include "core/errors.h"
#include "kernels/cuda_device.h"

namespace pyring {

bool built_with_cuda() {
  return true;
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string cuda_device_name(int index) {
  int n = cuda_device_count();
  PYRING_CHECK_ARG(index >= 0 && index < n, "CUDA device index ", index, " out of range (", n,
                   " device(s))");
  cudaDeviceProp prop;
  cudaError_t err = cudaGetDeviceProperties(&prop, index);
  PYRING_CHECK(err == cudaSuccess, Error, "cudaGetDeviceProperties(", index,
               ") failed: ", cudaGetErrorString(err));
  return str_cat(prop.name, " (sm_", prop.major, prop.minor, ", ", prop.totalGlobalMem >> 20,
                 " MiB)");
}

}  // namespace pyring
