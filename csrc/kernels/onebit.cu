// The one-bit wire's kernels on the device (kernels/cuda_kernels.h): the format of
// kernels/onebit.h, the element arithmetic of kernels/elementwise.h.
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/cuda_kernels.h"
#include "kernels/elementwise.h"

namespace pyring {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xffffffffu;

struct Workspace {
  double sumsq;
  unsigned long long zeros;
};

int blocks_for(size_t work) {
  const size_t b = (work + kThreads - 1) / kThreads;
  return static_cast<int>(b < 4096 ? (b ? b : 1) : 4096);
}

// Sweep 1: v = in, or with a kept residual onebit_kept(in + its settled value) (kept there),
// the sum of squares and the count of zeros.
__global__ void sumsq_kernel(const float* in, uint16_t* residual, float pending, size_t n,
                             Workspace* ws) {
  __shared__ double part_sq[kThreads / 32];
  __shared__ unsigned long long part_z[kThreads / 32];
  double sq = 0.0;
  unsigned long long z = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = in[i];
    if (residual) {
      const uint16_t b = onebit_kept(v + onebit_settled(onebit_kept_value(residual[i]), pending));
      residual[i] = b;
      v = onebit_kept_value(b);
    }
    sq += static_cast<double>(v) * v;
    z += onebit_zero_bit(v);
  }
  for (int d = 16; d > 0; d >>= 1) {
    sq += __shfl_down_sync(kFull, sq, d);
    z += __shfl_down_sync(kFull, z, d);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    part_sq[warp] = sq;
    part_z[warp] = z;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      sq += part_sq[w];
      z += part_z[w];
    }
    atomicAdd(&ws->sumsq, sq);
    atomicAdd(&ws->zeros, z);
  }
}

__device__ float segment_scale(const Workspace* ws, size_t n) {
  const unsigned long long nonzero = n - ws->zeros;
  return nonzero ? static_cast<float>(sqrt(ws->sumsq / static_cast<double>(nonzero))) : 0.0f;
}

// Sweep 2: each warp packs 32 values (sweep 1's v) into 4 bytes of signs (and of the zero
// mask).
__global__ void pack_kernel(const float* in, const uint16_t* residual, size_t n, uint8_t* out,
                            const Workspace* ws) {
  const float scale = segment_scale(ws, n);
  const bool zeros = ws->zeros != 0;
  const size_t sign_bytes = (n + 7) / 8;
  uint8_t* signs = out + sizeof(OnebitHeader);
  uint8_t* mask = signs + sign_bytes;
  const size_t warps = (n + 31) / 32;
  const size_t warp_stride = static_cast<size_t>(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (size_t w = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < warps;
       w += warp_stride) {
    const size_t i = w * 32 + lane;
    const float v = i >= n ? 1.0f : residual ? onebit_kept_value(residual[i]) : in[i];
    const uint32_t s = onebit_sign_bit(v), zb = onebit_zero_bit(v);
    const unsigned sign_word = __ballot_sync(kFull, s);
    const unsigned zero_word = __ballot_sync(kFull, zb);
    if (lane < 4 && w * 4 + lane < sign_bytes) {
      signs[w * 4 + lane] = static_cast<uint8_t>(sign_word >> (8 * lane));
      if (zeros) mask[w * 4 + lane] = static_cast<uint8_t>(zero_word >> (8 * lane));
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const OnebitHeader h{scale, zeros ? kMaskFollows : kNoZeros, 0u, static_cast<uint32_t>(n)};
    *reinterpret_cast<OnebitHeader*>(out) = h;
  }
}

__global__ void decode_kernel(const uint8_t* signs, const uint8_t* mask, size_t n, float pos,
                              bool accumulate, float* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t s = signs[i / 8], z = mask ? mask[i / 8] : 0u;
    const float d = onebit_value(s, z, static_cast<int>(i % 8), pos);
    out[i] = accumulate ? out[i] + d : d;
  }
}

}  // namespace

size_t cuda_onebit_workspace_bytes() {
  return sizeof(Workspace);
}

size_t cuda_onebit_encode(const float* in, uint16_t* residual, float pending, size_t n,
                          uint8_t* out, void* workspace, OnebitHeader* header, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  Workspace* ws = static_cast<Workspace*>(workspace);
  PYRING_CUDA_CHECK(cudaMemsetAsync(ws, 0, sizeof(Workspace), s));
  if (n) {
    sumsq_kernel<<<blocks_for(n), kThreads, 0, s>>>(in, residual, pending, n, ws);
    PYRING_CUDA_CHECK(cudaGetLastError());
  }
  // One warp per 32 values; at least one block, to write the header.
  pack_kernel<<<blocks_for((n + 31) / 32 * 32), kThreads, 0, s>>>(in, residual, n, out, ws);
  PYRING_CUDA_CHECK(cudaGetLastError());
  PYRING_CUDA_CHECK(cudaMemcpyAsync(header, out, sizeof(OnebitHeader), cudaMemcpyDeviceToHost, s));
  PYRING_CUDA_CHECK(cudaStreamSynchronize(s));
  return sizeof(OnebitHeader) + (header->zeros == kMaskFollows ? 2 : 1) * ((n + 7) / 8);
}

void cuda_onebit_decode(const OnebitHeader& header, const uint8_t* encoded, size_t n, float alpha,
                        bool accumulate, float* out, void* stream) {
  PYRING_CHECK(header.count == static_cast<uint32_t>(n), CommError, "one-bit segment holds ",
               header.count, " values, the decoder expects ", n);
  PYRING_CHECK(header.zeros == kNoZeros || header.zeros == kMaskFollows, CommError,
               "one-bit segment on the device: zero-mask mode ", header.zeros,
               " (device segments carry their mask; the mask caches are host-only)");
  if (n == 0) return;
  const uint8_t* signs = encoded + sizeof(OnebitHeader);
  const uint8_t* mask = header.zeros == kMaskFollows ? signs + (n + 7) / 8 : nullptr;
  decode_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      signs, mask, n, alpha * header.scale, accumulate, out);
  PYRING_CUDA_CHECK(cudaGetLastError());
}

}  // namespace pyring
