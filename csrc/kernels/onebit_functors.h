// The bodies of the CUDA one-bit kernels (kernels/cuda_kernels.h), for the device and for the
// host: onebit.cu launches them on a GPU; kernels/host_grid.cc runs the same per-thread body
// over an emulated grid (the sim device). The format is kernels/onebit.h's, the element
// arithmetic kernels/elementwise.h's.
//
// Encoding is one sweep and a header: each thread of onebit_blocks(groups) blocks of
// kOnebitThreads takes groups of 8 values (one byte of signs and one of the zero mask) in
// grid-stride order (OnebitEncode::thread), writing the signs and the mask and adding the
// squares and the zeros to its own sums; the block then sums its threads' (each warp by a
// shuffle tree, then the warps in order: the device's block_sum in onebit.cu, emulated by
// host_grid.cc), and adds that to the workspace; onebit_write_header then writes the header
// from the workspace. Decoding is one sweep (OnebitDecode::thread).
//
// The scale is thus a float64 sum in an order of its own: it differs from the host encoder's
// (float32 lanes per block, kernels/onebit_blocks.cc) in the last bits, and on a GPU from run to
// run (the blocks' atomics land in any order; the host runner takes them in block order). Given
// the same inputs, the signs, masks and kept residuals the sweep writes are the host's bit for
// bit.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/errors.h"
#include "kernels/elementwise.h"
#include "kernels/grid.h"
#include "kernels/onebit.h"

namespace pyring {

constexpr int kOnebitThreads = 256;
constexpr int kWarp = 32;

// The encoder's sums over the whole segment (device memory, zeroed before the sweep).
struct OnebitWorkspace {
  double sumsq;
  unsigned long long zeros;
};

// The blocks of a sweep over `groups` groups of 8 values.
inline int onebit_blocks(size_t groups) {
  const size_t b = (groups + kOnebitThreads - 1) / kOnebitThreads;
  return static_cast<int>(b < 4096 ? (b ? b : 1) : 4096);
}

// The kept residual after adding x to the one whose bits are r, settled at scale `pending`; the
// value the segment encodes is onebit_kept_value of it.
PYRING_HD uint16_t onebit_kept_next(float x, uint16_t r, float pending) {
  return onebit_kept(x + onebit_settled(onebit_kept_value(r), pending));
}

// The encoder's sweep. `vectors`: in (and residual) are 16-byte aligned, so a full group is
// two 16-byte loads of in and one of residual. The mask is always written (the segment has
// room for it); the header says whether it follows.
struct OnebitEncode {
  const float* in;
  uint16_t* residual;  // null: none
  float pending;
  size_t n;
  bool vectors;
  uint8_t* signs;
  uint8_t* mask;

  // Group g (below `full`: a vector group): its signs and mask bytes written, its squares and
  // zeros added to sq and z.
  PYRING_HD void group(size_t g, size_t full, double& sq, unsigned long long& z) const {
    float v[8];
    if (g < full) {
      const F32x4 x0 = reinterpret_cast<const F32x4*>(in)[2 * g];
      const F32x4 x1 = reinterpret_cast<const F32x4*>(in)[2 * g + 1];
      v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w;
      v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
      if (residual) {
        const U32x4 p = reinterpret_cast<const U32x4*>(residual)[g];
        uint32_t w[4] = {p.x, p.y, p.z, p.w};  // element 8g + k in half k % 2 of w[k / 2]
        PYRING_UNROLL
        for (int k = 0; k < 8; ++k) {
          const int shift = 16 * (k % 2);
          const uint16_t b =
              onebit_kept_next(v[k], static_cast<uint16_t>(w[k / 2] >> shift), pending);
          w[k / 2] = (w[k / 2] & ~(0xffffu << shift)) | (static_cast<uint32_t>(b) << shift);
          v[k] = onebit_kept_value(b);
        }
        reinterpret_cast<U32x4*>(residual)[g] = u32x4(w[0], w[1], w[2], w[3]);
      }
    } else {
      PYRING_UNROLL
      for (int k = 0; k < 8; ++k) {
        const size_t i = 8 * g + k;
        if (i >= n) {
          v[k] = 1.0f;  // past the end: no sign bit, not a zero, no square
        } else if (residual) {
          const uint16_t b = onebit_kept_next(in[i], residual[i], pending);
          residual[i] = b;
          v[k] = onebit_kept_value(b);
        } else {
          v[k] = in[i];
        }
      }
    }
    uint32_t sbyte = 0, zbyte = 0;
    PYRING_UNROLL
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

  // Thread p's groups, in grid-stride order, their sums added to sq and z.
  PYRING_HD void thread(const GridPos& p, double& sq, unsigned long long& z) const {
    const size_t groups = (n + 7) / 8, full = vectors ? n / 8 : 0;
    const size_t stride = p.stride();
    for (size_t g = p.tid(); g < groups; g += stride) group(g, full, sq, z);
  }
};

// The header of a segment of n values from the sweep's sums, written byte by byte at `out`: a
// segment (and its header) may start at any even offset of a buffer. The scale is the root mean
// square of the nonzero values.
PYRING_HD void onebit_write_header(size_t n, const OnebitWorkspace& ws, uint8_t* out) {
  const unsigned long long nonzero = n - ws.zeros;
  const float scale =
      nonzero ? static_cast<float>(sqrt(ws.sumsq / static_cast<double>(nonzero))) : 0.0f;
  const OnebitHeader h{scale, ws.zeros ? kMaskFollows : kNoZeros, 0u, static_cast<uint32_t>(n)};
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&h);
  for (size_t k = 0; k < sizeof(OnebitHeader); ++k) out[k] = b[k];
}

// The decoder's sweep: each thread takes groups of 8 values, one byte of signs (and of the
// mask, null: none); where `vectors` (out is 16-byte aligned) a full group is two 16-byte
// accesses of out.
struct OnebitDecode {
  const uint8_t* signs;
  const uint8_t* mask;
  size_t n;
  float pos;  // the decoded magnitude: alpha * scale
  bool accumulate;
  bool vectors;
  float* out;

  PYRING_HD void group(size_t g, size_t full) const {
    const uint32_t s = signs[g], z = mask ? mask[g] : 0u;
    float d[8];
    PYRING_UNROLL
    for (int k = 0; k < 8; ++k) d[k] = onebit_value(s, z, k, pos);
    if (g < full) {
      F32x4* o = reinterpret_cast<F32x4*>(out) + 2 * g;
      F32x4 a = f32x4(d[0], d[1], d[2], d[3]), b = f32x4(d[4], d[5], d[6], d[7]);
      if (accumulate) {
        const F32x4 x = o[0], y = o[1];
        a = f32x4(x.x + a.x, x.y + a.y, x.z + a.z, x.w + a.w);
        b = f32x4(y.x + b.x, y.y + b.y, y.z + b.z, y.w + b.w);
      }
      o[0] = a;
      o[1] = b;
    } else {
      PYRING_UNROLL
      for (int k = 0; k < 8; ++k) {
        const size_t i = 8 * g + k;
        if (i < n) out[i] = accumulate ? out[i] + d[k] : d[k];
      }
    }
  }

  PYRING_HD void thread(const GridPos& p) const {
    const size_t groups = (n + 7) / 8, full = vectors ? n / 8 : 0;
    const size_t stride = p.stride();
    for (size_t g = p.tid(); g < groups; g += stride) group(g, full);
  }
};

// The sweep that encodes n values at `in` (with the kept residual, null: none) into the segment
// at `out`.
inline OnebitEncode onebit_encode_sweep(const float* in, uint16_t* residual, float pending,
                                        size_t n, uint8_t* out) {
  uint8_t* signs = out + sizeof(OnebitHeader);
  const bool vectors = aligned16(in) && aligned16(residual);
  return OnebitEncode{in, residual, pending, n, vectors, signs, signs + (n + 7) / 8};
}

// The bytes of an encoded segment of n values with header h.
inline size_t onebit_segment_bytes(const OnebitHeader& h, size_t n) {
  return sizeof(OnebitHeader) + (h.zeros == kMaskFollows ? 2 : 1) * ((n + 7) / 8);
}

// The sweep that decodes the segment at `encoded`, whose header the caller holds, into out.
// Throws CommError for a count other than n or a kMaskCached header (device segments never use
// the mask caches).
inline OnebitDecode onebit_decode_sweep(const OnebitHeader& header, const uint8_t* encoded,
                                        size_t n, float alpha, bool accumulate, float* out) {
  PYRING_CHECK(header.count == static_cast<uint32_t>(n), CommError, "one-bit segment holds ",
               header.count, " values, the decoder expects ", n);
  PYRING_CHECK(header.zeros == kNoZeros || header.zeros == kMaskFollows, CommError,
               "one-bit segment on the device: zero-mask mode ", header.zeros,
               " (device segments carry their mask; the mask caches are host-only)");
  const uint8_t* signs = encoded + sizeof(OnebitHeader);
  const uint8_t* mask = header.zeros == kMaskFollows ? signs + (n + 7) / 8 : nullptr;
  return OnebitDecode{signs, mask, n, alpha * header.scale, accumulate, aligned16(out), out};
}

}  // namespace pyring
