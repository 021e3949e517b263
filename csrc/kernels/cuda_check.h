// PYRING_CUDA_CHECK(call): throws CudaError naming the call, the current device and CUDA's
// message when `call` does not return cudaSuccess. CUDA sources only.
#pragma once

#include <cuda_runtime.h>

#include "core/errors.h"

#define PYRING_CUDA_CHECK(call)                                                                \
  do {                                                                                         \
    const cudaError_t pyring_err_ = (call);                                                    \
    if (pyring_err_ != cudaSuccess) {                                                          \
      int pyring_dev_ = -1;                                                                    \
      cudaGetDevice(&pyring_dev_);                                                             \
      PYRING_THROW(::pyring::CudaError, #call, " failed on CUDA device ", pyring_dev_, ": ",   \
                   cudaGetErrorName(pyring_err_), " (", cudaGetErrorString(pyring_err_), ")"); \
    }                                                                                          \
  } while (0)
