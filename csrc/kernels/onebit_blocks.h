// The host's block sweeps of the one-bit kernels (kernels/onebit.cc): AVX2 where the CPU has
// it (kernels/onebit_avx2.h), SSE2 or one value at a time otherwise, the same bytes and floats
// on every path. A block starts a byte: its first value is a multiple of 8 into the segment.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyring::onebit_blocks {

constexpr size_t kBlock = 4096;  // values per sweep: 16 KiB of float32 stays in L1/L2

// One sweep over one block: v = in + settled residual (residual null: v = in; else the
// residual holds the last v, encoded with scale `pending`), stored back in the residual; its
// sum of squares and zeros added to sumsq and zeros in the same lane order on every path; its
// sign and zero bytes.
void encode_block(const float* in, float* residual, size_t count, float pending, double& sumsq,
                  size_t& zeros, uint8_t* signs, uint8_t* mask);
// encode_block with a kept residual (kernels/onebit.h; non-null): the value encoded is v
// rounded as the residual keeps it.
void encode_block_kept(const float* in, uint16_t* residual, size_t count, float pending,
                       double& sumsq, size_t& zeros, uint8_t* signs, uint8_t* mask);
// residual[0, count) = onebit_settled(residual, scale).
void settle_block(float* residual, size_t count, float scale);
// out[0, count) = pos * decode (or += with accumulate) of the sign and mask bytes from `signs`
// and `mask` (null: no zeros) on.
void decode_span(const uint8_t* signs, const uint8_t* mask, size_t count, float pos,
                 bool accumulate, float* out);

}  // namespace pyring::onebit_blocks
