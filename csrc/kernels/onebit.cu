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

// The kept residual after adding x to the one whose bits are r, settled at scale `pending`; the
// value the segment encodes is onebit_kept_value of it.
__device__ __forceinline__ uint16_t kept_next(float x, uint16_t r, float pending) {
  return onebit_kept(x + onebit_settled(onebit_kept_value(r), pending));
}

// One sweep: each thread takes groups of 8 values (one byte of signs and one of the zero mask)
// and adds their squares and zeros to the workspace; the signs and the mask do not depend on the
// scale, so they are written here. The mask is always written (the segment has room for it); the
// header says whether it follows. `vectors`: in (and residual) are 16-byte aligned, so a full
// group is two 16-byte loads of in and one of residual.
__global__ void encode_kernel(const float* in, uint16_t* residual, float pending, size_t n,
                              bool vectors, uint8_t* signs, uint8_t* mask, Workspace* ws) {
  __shared__ double part_sq[kThreads / 32];
  __shared__ unsigned long long part_z[kThreads / 32];
  double sq = 0.0;
  unsigned long long z = 0;
  const size_t groups = (n + 7) / 8, full = vectors ? n / 8 : 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += stride) {
    float v[8];
    if (g < full) {
      const float4 x0 = reinterpret_cast<const float4*>(in)[2 * g];
      const float4 x1 = reinterpret_cast<const float4*>(in)[2 * g + 1];
      v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w;
      v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
      if (residual) {
        const uint4 p = reinterpret_cast<const uint4*>(residual)[g];
        uint32_t w[4] = {p.x, p.y, p.z, p.w};  // element 8g + k in half k % 2 of w[k / 2]
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const int shift = 16 * (k % 2);
          const uint16_t b = kept_next(v[k], static_cast<uint16_t>(w[k / 2] >> shift), pending);
          w[k / 2] = (w[k / 2] & ~(0xffffu << shift)) | (static_cast<uint32_t>(b) << shift);
          v[k] = onebit_kept_value(b);
        }
        reinterpret_cast<uint4*>(residual)[g] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const size_t i = 8 * g + k;
        if (i >= n) {
          v[k] = 1.0f;  // past the end: no sign bit, not a zero, no square
        } else if (residual) {
          const uint16_t b = kept_next(in[i], residual[i], pending);
          residual[i] = b;
          v[k] = onebit_kept_value(b);
        } else {
          v[k] = in[i];
        }
      }
    }
    uint32_t sbyte = 0, zbyte = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const bool real = 8 * g + k < n;
      sq += real ? static_cast<double>(v[k]) * v[k] : 0.0;
      z += onebit_zero_bit(v[k]);
      sbyte |= onebit_sign_bit(v[k]) << k;
      zbyte |= onebit_zero_bit(v[k]) << k;
    }
    signs[g] = static_cast<uint8_t>(sbyte);
    mask[g] = static_cast<uint8_t>(zbyte);
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

// The header, from the sweep's sums: the scale is the root mean square of the nonzero values.
// Written byte by byte: a segment (and its header) may start at any even offset of the buffer.
__global__ void header_kernel(size_t n, const Workspace* ws, uint8_t* out) {
  const unsigned long long nonzero = n - ws->zeros;
  const float scale =
      nonzero ? static_cast<float>(sqrt(ws->sumsq / static_cast<double>(nonzero))) : 0.0f;
  const OnebitHeader h{scale, ws->zeros ? kMaskFollows : kNoZeros, 0u, static_cast<uint32_t>(n)};
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&h);
  for (size_t k = 0; k < sizeof(OnebitHeader); ++k) out[k] = b[k];
}

// Each thread takes groups of 8 values: one byte of signs (and of the mask), and where `out` is
// 16-byte aligned two 16-byte accesses of out.
__global__ void decode_kernel(const uint8_t* signs, const uint8_t* mask, size_t n, float pos,
                              bool accumulate, bool vectors, float* out) {
  const size_t groups = (n + 7) / 8, full = vectors ? n / 8 : 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += stride) {
    const uint32_t s = signs[g], z = mask ? mask[g] : 0u;
    float d[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) d[k] = onebit_value(s, z, k, pos);
    if (g < full) {
      float4* o = reinterpret_cast<float4*>(out) + 2 * g;
      float4 a = make_float4(d[0], d[1], d[2], d[3]), b = make_float4(d[4], d[5], d[6], d[7]);
      if (accumulate) {
        const float4 x = o[0], y = o[1];
        a = make_float4(x.x + a.x, x.y + a.y, x.z + a.z, x.w + a.w);
        b = make_float4(y.x + b.x, y.y + b.y, y.z + b.z, y.w + b.w);
      }
      o[0] = a;
      o[1] = b;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const size_t i = 8 * g + k;
        if (i < n) out[i] = accumulate ? out[i] + d[k] : d[k];
      }
    }
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
    uint8_t* signs = out + sizeof(OnebitHeader);
    const bool vectors = reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(residual) % 16 == 0;
    encode_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, s>>>(in, residual, pending, n, vectors,
                                                               signs, signs + (n + 7) / 8, ws);
    PYRING_CUDA_CHECK(cudaGetLastError());
  }
  header_kernel<<<1, 1, 0, s>>>(n, ws, out);
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
  const bool vectors = reinterpret_cast<uintptr_t>(out) % 16 == 0;
  decode_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      signs, mask, n, alpha * header.scale, accumulate, vectors, out);
  PYRING_CUDA_CHECK(cudaGetLastError());
}

}  // namespace pyring
