// The one-bit wire format and its kernels on host memory: plain functions of pointers and
// counts, so that device versions can sit beside them.
//
// One segment of n float32 values travels as a OnebitHeader, then ceil(n/8) bytes of signs
// (bit i%8 of byte i/8 is set when value i is negative), then, only when some value is exactly
// zero, ceil(n/8) bytes of a zero mask (bit set: the value is zero). A value decodes to
// +scale or -scale, or to exactly 0 under the mask, so an element that is zero on every rank
// with zero residuals stays exactly zero without a user-made mask; the mask costs a second
// bit per element only in segments that hold an exact zero. scale is the root mean square of
// the segment's non-zero values, so the decoded segment keeps the input's L2 norm.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyring {

struct OnebitHeader {
  float scale;
  uint32_t has_zeros;  // 1 when the zero mask follows the signs
};
static_assert(sizeof(OnebitHeader) == 8, "OnebitHeader is part of the wire format");

// The most bytes a segment of n values takes (with a zero mask).
inline size_t onebit_max_bytes(size_t n) {
  return sizeof(OnebitHeader) + 2 * ((n + 7) / 8);
}
// The bytes the segment at `encoded` takes, read from its header.
size_t onebit_bytes(const uint8_t* encoded, size_t n);

// Encodes v = in + residual (residual may be null: no error feedback) into `out` (at least
// onebit_max_bytes(n)) and, when residual is set, stores the new residual v - decode(v) in it.
// One fused sweep per cache-sized block: residual add and sum of squares, then sign pack,
// zero mask and new residual. Returns the bytes written.
size_t onebit_encode(const float* in, float* residual, size_t n, uint8_t* out);

// out[i] = alpha * decode(i), or out[i] += alpha * decode(i) when `accumulate`.
void onebit_decode(const uint8_t* encoded, size_t n, float alpha, bool accumulate, float* out);

}  // namespace pyring
