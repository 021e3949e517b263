// The words a CUDA kernel body uses for its place in a launch and for its vector accesses,
// defined for the device and for the host, so that one body serves both: the .cu files launch
// it on a GPU, kernels/host_grid.cc runs it thread by thread over an emulated grid (the sim
// device's kernels). Functions marked PYRING_HD (kernels/half.h) compile for both.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/half.h"

#if defined(__CUDACC__)
#include <vector_functions.h>
#include <vector_types.h>
#endif

// `#pragma unroll` in device code; nothing on the host (GCC warns on the pragma).
#if defined(__CUDA_ARCH__)
#define PYRING_UNROLL _Pragma("unroll")
#else
#define PYRING_UNROLL
#endif

// Host stand-ins for the CUDA vector types may alias the scalars they are loaded from (as the
// device's vector loads do); the device build keeps CUDA's own types.
#if defined(__CUDACC__)
#define PYRING_MAY_ALIAS
#else
#define PYRING_MAY_ALIAS [[gnu::may_alias]]
#endif

namespace pyring {

// One thread's place in a one-dimensional launch: gridDim.x, blockDim.x, blockIdx.x and
// threadIdx.x.
struct GridPos {
  unsigned blocks;
  unsigned threads;
  unsigned block;
  unsigned thread;

  // The thread's index in the grid, and the grid's size: a grid-stride loop's start and step.
  PYRING_HD size_t tid() const { return static_cast<size_t>(block) * threads + thread; }
  PYRING_HD size_t stride() const { return static_cast<size_t>(blocks) * threads; }

#if defined(__CUDACC__)
  // The calling device thread's place.
  __device__ static GridPos here() {
    return GridPos{gridDim.x, blockDim.x, blockIdx.x, threadIdx.x};
  }
#endif
};

// The 16-byte vectors of four float32 and four uint32 (CUDA's float4 and uint4).
#if defined(__CUDACC__)
using F32x4 = float4;
using U32x4 = uint4;
PYRING_HD F32x4 f32x4(float x, float y, float z, float w) {
  return make_float4(x, y, z, w);
}
PYRING_HD U32x4 u32x4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  return make_uint4(x, y, z, w);
}
#else
struct alignas(16) PYRING_MAY_ALIAS F32x4 {
  float x, y, z, w;
};
struct alignas(16) PYRING_MAY_ALIAS U32x4 {
  uint32_t x, y, z, w;
};
inline F32x4 f32x4(float x, float y, float z, float w) {
  return F32x4{x, y, z, w};
}
inline U32x4 u32x4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  return U32x4{x, y, z, w};
}
#endif
static_assert(sizeof(F32x4) == 16 && alignof(F32x4) == 16, "F32x4 is CUDA's float4");
static_assert(sizeof(U32x4) == 16 && alignof(U32x4) == 16, "U32x4 is CUDA's uint4");

// Whether p is 16-byte aligned: where every pointer of a launch is, it takes the vector path.
inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace pyring
