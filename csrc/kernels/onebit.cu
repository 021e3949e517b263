// The one-bit wire's kernels on the device (kernels/cuda_kernels.h): the kernel bodies of
// kernels/onebit_functors.h, launched on the caller's stream.
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/cuda_kernels.h"
#include "kernels/onebit_functors.h"

namespace pyring {

namespace {

constexpr unsigned kFull = 0xffffffffu;

// Adds the block's sums of sq and z to the workspace: each warp by a shuffle tree (lane l adds
// lane l + d's value for d = 16, 8, 4, 2, 1), then thread 0 adds warps 1.. in order to warp 0's
// and adds the total to ws atomically. host_grid.cc emulates the same order per block.
__device__ __forceinline__ void block_sum(double sq, unsigned long long z, OnebitWorkspace* ws) {
  __shared__ double part_sq[kOnebitThreads / kWarp];
  __shared__ unsigned long long part_z[kOnebitThreads / kWarp];
  for (int d = kWarp / 2; d > 0; d >>= 1) {
    sq += __shfl_down_sync(kFull, sq, d);
    z += __shfl_down_sync(kFull, z, d);
  }
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    part_sq[warp] = sq;
    part_z[warp] = z;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kOnebitThreads / kWarp; ++w) {
      sq += part_sq[w];
      z += part_z[w];
    }
    atomicAdd(&ws->sumsq, sq);
    atomicAdd(&ws->zeros, z);
  }
}

__global__ void encode_kernel(OnebitEncode f, OnebitWorkspace* ws) {
  double sq = 0.0;
  unsigned long long z = 0;
  f.thread(GridPos::here(), sq, z);
  block_sum(sq, z, ws);
}

__global__ void header_kernel(size_t n, const OnebitWorkspace* ws, uint8_t* out) {
  onebit_write_header(n, *ws, out);
}

__global__ void decode_kernel(OnebitDecode f) {
  f.thread(GridPos::here());
}

}  // namespace

size_t cuda_onebit_workspace_bytes() {
  return sizeof(OnebitWorkspace);
}

size_t cuda_onebit_encode(const float* in, uint16_t* residual, float pending, size_t n,
                          uint8_t* out, void* workspace, OnebitHeader* header, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  OnebitWorkspace* ws = static_cast<OnebitWorkspace*>(workspace);
  PYRING_CUDA_CHECK(cudaMemsetAsync(ws, 0, sizeof(OnebitWorkspace), s));
  if (n) {
    const OnebitEncode f = onebit_encode_sweep(in, residual, pending, n, out);
    encode_kernel<<<onebit_blocks((n + 7) / 8), kOnebitThreads, 0, s>>>(f, ws);
    PYRING_CUDA_CHECK(cudaGetLastError());
  }
  header_kernel<<<1, 1, 0, s>>>(n, ws, out);
  PYRING_CUDA_CHECK(cudaGetLastError());
  PYRING_CUDA_CHECK(cudaMemcpyAsync(header, out, sizeof(OnebitHeader), cudaMemcpyDeviceToHost, s));
  PYRING_CUDA_CHECK(cudaStreamSynchronize(s));
  return onebit_segment_bytes(*header, n);
}

void cuda_onebit_decode(const OnebitHeader& header, const uint8_t* encoded, size_t n, float alpha,
                        bool accumulate, float* out, void* stream) {
  const OnebitDecode f = onebit_decode_sweep(header, encoded, n, alpha, accumulate, out);
  if (n == 0) return;
  decode_kernel<<<onebit_blocks((n + 7) / 8), kOnebitThreads, 0,
                  static_cast<cudaStream_t>(stream)>>>(f);
  PYRING_CUDA_CHECK(cudaGetLastError());
}

}  // namespace pyring
