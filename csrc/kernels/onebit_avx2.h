// AVX2 versions of the one-bit block sweeps of kernels/onebit.cc, chosen at run time where the
// CPU has AVX2 (host_avx2(), kernels/simd.h). They give the same bytes and floats bit for bit: the
// same additions in the same lane order (eight lanes are the SSE path's two registers side by side)
// and no fused multiply-add. Arguments as onebit.cc's encode_block, settle_block and decode_span;
// decode_whole decodes only the whole bytes of signs (8 values each) and returns how many.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/elementwise.h"

namespace pyring::onebit_avx2 {

void encode_block(const float* in, float* residual, size_t count, float pending, double& sumsq,
                  size_t& zeros, uint8_t* signs, uint8_t* mask);
// encode_block with a kept residual (kernels/onebit.h; non-null): whole groups of 8 only,
// count a multiple of 8.
void encode_block_kept(const float* in, uint16_t* residual, size_t count, float pending,
                       double& sumsq, size_t& zeros, uint8_t* signs, uint8_t* mask);
// onebit.cc's block sum of onebit_reduce_encode (own[i] / divisor, then each copy k decoded
// and added in k order: sign bytes signs[k], zero bytes masks[k] or null, scale pos[k]), then
// its encode_block_kept, with no buffer: count (a multiple of 8) values from the start of a
// block, bit for bit the same.
void reduce_encode_block(const float* own, float divisor, const uint8_t* const* signs,
                         const uint8_t* const* masks, const float* pos, size_t copies, size_t count,
                         uint16_t* residual, float pending, double& sumsq, size_t& zeros,
                         uint8_t* out_signs, uint8_t* out_mask);
void settle_block(float* residual, size_t count, float scale);
// out[i] = onebit_settled(onebit_kept_value(residual[i]), scale) for whole groups of 8;
// returns how many values it wrote.
size_t settled_kept_whole(const uint16_t* residual, size_t count, float scale, float* out);
size_t decode_whole(const uint8_t* signs, const uint8_t* mask, size_t count, float pos,
                    bool accumulate, float* out);

}  // namespace pyring::onebit_avx2

namespace pyring {

// The last count % 8 (< 8) values of encode_block (R float: a float32 residual, kept as v) or
// encode_block_kept (R uint16_t: a kept residual), one at a time, on every path: into the one
// sign byte and mask byte they start.
template <typename R>
inline void onebit_encode_tail(const float* in, R* residual, size_t left, float pending,
                               double& sumsq, size_t& zeros, uint8_t* sign, uint8_t* mask) {
  if (left == 0) return;
  uint32_t sb = 0, zb = 0;
  for (size_t k = 0; k < left; ++k) {
    float v = in[k];
    if constexpr (std::is_same_v<R, uint16_t>) {
      if (residual) {
        const uint16_t b =
            onebit_kept(in[k] + onebit_settled(onebit_kept_value(residual[k]), pending));
        residual[k] = b;
        v = onebit_kept_value(b);
      }
    } else if (residual) {
      v = in[k] + onebit_settled(residual[k], pending);
      residual[k] = v;
    }
    sumsq += double(v) * v;
    zeros += v == 0.0f;
    sb |= onebit_sign_bit(v) << k;
    zb |= onebit_zero_bit(v) << k;
  }
  *sign = static_cast<uint8_t>(sb);
  *mask = static_cast<uint8_t>(zb);
}

}  // namespace pyring
