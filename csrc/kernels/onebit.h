// The one-bit wire format and its kernels on host memory: plain functions of pointers and
// counts, so that device versions can sit beside them.
//
// One segment of n float32 values travels as a OnebitHeader, then ceil(n/8) bytes of signs
// (bit i%8 of byte i/8 is set when value i is negative), then, only when the header says
// kMaskFollows, ceil(n/8) bytes of a zero mask (bit set: the value is exactly zero). A value
// decodes to +scale or -scale, or to exactly 0 under the mask, so an element that is zero on
// every rank with zero residuals stays exactly zero without a user-made mask. scale is the
// root mean square of the segment's non-zero values, so the decoded segment keeps the input's
// L2 norm.
//
// Mask caches: a stream of segments between one encoder and one decoder may keep the last
// mask on both sides (a buffer of onebit_cache_bytes(n) each, zeroed before first use). A
// segment whose mask equals the cached one then travels as kMaskCached, with no mask bytes:
// structural zeros (frozen or padded parameters, inputs that are always zero) cost nothing
// after the first round. The header carries the mask's hash, and the decoder refuses a
// segment whose hash differs from its cache's (the two sides fell out of step).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyring {

enum OnebitZeros : uint32_t {
  kNoZeros = 0,      // no value is exactly zero: no mask
  kMaskFollows = 1,  // the mask follows the signs
  kMaskCached = 2,   // the mask is the decoder's cached one
};

struct OnebitHeader {
  float scale;
  uint32_t zeros;      // an OnebitZeros
  uint32_t mask_hash;  // onebit_mask_hash of the mask; 0 with kNoZeros or no encoder cache
  uint32_t count;      // n mod 2^32: the decoder checks it against its own n
};
static_assert(sizeof(OnebitHeader) == 16, "OnebitHeader is part of the wire format");

// The most bytes a segment of n values takes (with a zero mask).
inline size_t onebit_max_bytes(size_t n) {
  return sizeof(OnebitHeader) + 2 * ((n + 7) / 8);
}
// The bytes of a mask cache for segments of n values: {uint32 valid, uint32 hash, mask}.
inline size_t onebit_cache_bytes(size_t n) {
  return 2 * sizeof(uint32_t) + (n + 7) / 8;
}
// The bytes the segment at `encoded` takes, read from its header.
size_t onebit_bytes(const uint8_t* encoded, size_t n);

uint32_t onebit_mask_hash(const uint8_t* mask, size_t bytes);

// Encodes v = in + residual (residual may be null: no error feedback) into `out` (at least
// onebit_max_bytes(n)) and, when residual is set, stores the new residual v - decode(v) in it,
// in float32. `cache` (null: none) is this stream's encoder-side mask cache. Returns the bytes
// written.
size_t onebit_encode(const float* in, float* residual, size_t n, uint8_t* out,
                     uint8_t* cache = nullptr);

// Kept residuals, for a caller that keeps them between calls (the compressed allreduce's
// state): bfloat16 (uint16_t bits), deferred. After an encoding of n values with scale p the
// kept residual holds, per value, b = onebit_kept(v) for the value v it encoded, and the
// caller keeps p as *pending (0: settled, b is the residual itself). The residual it stands
// for is onebit_settled(onebit_kept_value(b), p), computed in float32 where it is used.
//
// An encoding with a kept residual rounds what it encodes to bfloat16: v = onebit_kept_value(
// onebit_kept(in + settled residual)); its signs, zero bits and scale are those of that v.
// What the rounding drops (at most 2^-8 of |v|) is not fed back. Half the memory and memory
// traffic of float32 residuals.

// onebit_encode with a kept residual (non-null, with `pending`; or both null: no residual,
// no rounding): one sweep over `in` and the residual. Returns the bytes written; *pending
// becomes this encoding's scale.
size_t onebit_encode_deferred(const float* in, uint16_t* residual, float* pending, size_t n,
                              uint8_t* out, uint8_t* cache = nullptr);

// The n residuals a kept residual with scale `pending` stands for, as float32 into `out`.
void onebit_settled_copy(const uint16_t* residual, size_t n, float pending, float* out);

// The owner's step of the compressed allreduce, in one sweep over the kept residual:
// onebit_encode_deferred(in = own / divisor + the sum over k of decode(copies[k], cache
// caches[k]) / divisor, residual, pending, n, out, cache), without storing the sum. The sum
// starts at own[i] / divisor (float32 division: the owner's own values travel nowhere, so they
// go in exact), then adds alpha * decode(copies[k]) in k order, alpha = 1 / divisor; divisor is
// 1 (sum) or the world size (avg). Throws as onebit_decode, before writing anything.
size_t onebit_reduce_encode(const float* own, int divisor, const uint8_t* const* copies,
                            uint8_t* const* caches, size_t count, size_t n, uint16_t* residual,
                            float* pending, uint8_t* out, uint8_t* cache);

// The mask caches applied to a segment that was encoded with none (a device encoder's): when
// its mask equals the cache's, the header becomes kMaskCached and the mask is dropped;
// otherwise the cache takes the mask and the header its hash. The segment then reads as if
// onebit_encode had written it with `cache`. Returns its bytes.
size_t onebit_cache_encoded(uint8_t* encoded, size_t n, uint8_t* cache);

// The decoder side of the same: the segment at `encoded` (room for onebit_max_bytes(n)) gets
// its mask back from `cache` when it names the cached one, and a mask it carries goes into
// the cache, as onebit_decode does; it then decodes with no cache. Throws as onebit_decode.
void onebit_uncache(uint8_t* encoded, size_t n, uint8_t* cache);

// out[i] = alpha * decode(i), or out[i] += alpha * decode(i) when `accumulate`. `cache` (null:
// none) is this stream's decoder-side mask cache. Throws CommError, before writing to out, when
// the segment's count is not n, or it names a cached mask that `cache` does not hold.
void onebit_decode(const uint8_t* encoded, size_t n, float alpha, bool accumulate, float* out,
                   uint8_t* cache = nullptr);

// cuda_onebit_encode and cuda_onebit_decode (kernels/cuda_kernels.h) with their bodies run on
// the host over an emulated grid (kernels/host_grid.cc), for the sim device: the same
// arguments, less the workspace and the stream; they run at once.
size_t grid_onebit_encode(const float* in, uint16_t* residual, float pending, size_t n,
                          uint8_t* out, OnebitHeader* header);
void grid_onebit_decode(const OnebitHeader& header, const uint8_t* encoded, size_t n, float alpha,
                        bool accumulate, float* out);

}  // namespace pyring
