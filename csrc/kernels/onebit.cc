#include "kernels/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/errors.h"
#include "kernels/elementwise.h"
#include "kernels/onebit_avx2.h"
#include "kernels/simd.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pyring {

namespace {

inline float decode_one(uint8_t sign, uint8_t zero, int k, float scale) {
  return onebit_value(sign, zero, k, scale);
}

constexpr size_t kBlock = 4096;  // values per sweep: 16 KiB of float32 stays in L1/L2

}  // namespace

size_t onebit_bytes(const uint8_t* encoded, size_t n) {
  OnebitHeader h;
  std::memcpy(&h, encoded, sizeof(h));
  return sizeof(OnebitHeader) + (h.zeros == kMaskFollows ? 2 : 1) * ((n + 7) / 8);
}

uint32_t onebit_mask_hash(const uint8_t* mask, size_t bytes) {
  // FNV-1a over 8-byte words, then the tail; folded to 32 bits.
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, mask + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < bytes; ++i) h = (h ^ mask[i]) * 1099511628211ull;
  h ^= bytes;
  return static_cast<uint32_t>(h ^ (h >> 32));
}

namespace {

struct CacheHead {
  uint32_t valid;
  uint32_t hash;
};

}  // namespace

#if defined(__SSE2__)
namespace {

// Lanes of one nibble of sign bits: -x where the bit is set, +x elsewhere (as a sign mask to
// OR in), and all-ones where a zero bit is set.
struct NibbleMasks {
  __m128 sign[16];
  __m128 zero[16];
  NibbleMasks() {
    for (int m = 0; m < 16; ++m) {
      alignas(16) uint32_t s[4], z[4];
      for (int k = 0; k < 4; ++k) {
        s[k] = (m >> k) & 1 ? 0x80000000u : 0u;
        z[k] = (m >> k) & 1 ? 0xffffffffu : 0u;
      }
      sign[m] = _mm_castsi128_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(s)));
      zero[m] = _mm_castsi128_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(z)));
    }
  }
};
const NibbleMasks kMasks;

}  // namespace
#endif

namespace {

// One sweep over one block (its first value starts a byte): v = in + settled residual
// (residual null: v = in; else the residual holds the last v, encoded with scale `pending`),
// stored back in the residual; its sum of squares and zeros added to sumsq and zeros in the
// same lane order on every path; its sign and zero bytes.
void encode_block(const float* in, float* residual, size_t count, float pending, double& sumsq,
                  size_t& zeros, uint8_t* signs, uint8_t* mask) {
  if (host_avx2()) {
    return onebit_avx2::encode_block(in, residual, count, pending, sumsq, zeros, signs, mask);
  }
  const size_t whole = count / 8;
  size_t j = 0;
#if defined(__SSE2__)
  __m128 acc0 = _mm_setzero_ps(), acc1 = _mm_setzero_ps();
  __m128i zero_lanes = _mm_setzero_si128();  // minus the zeros seen per lane (cmpeq gives -1)
  const __m128 z = _mm_setzero_ps(), p = _mm_set1_ps(pending), sign_bit = _mm_set1_ps(-0.0f);
  // r - decode(r) with scale p, as settle_block.
  auto settled = [&](__m128 r) {
    return _mm_sub_ps(r, _mm_andnot_ps(_mm_cmpeq_ps(r, z), _mm_or_ps(_mm_and_ps(r, sign_bit), p)));
  };
  for (; j < whole; ++j) {
    __m128 v0 = _mm_loadu_ps(in + 8 * j), v1 = _mm_loadu_ps(in + 8 * j + 4);
    if (residual) {
      float* r = residual + 8 * j;
      v0 = _mm_add_ps(v0, settled(_mm_loadu_ps(r)));
      v1 = _mm_add_ps(v1, settled(_mm_loadu_ps(r + 4)));
      _mm_storeu_ps(r, v0);
      _mm_storeu_ps(r + 4, v1);
    }
    const __m128 z0 = _mm_cmpeq_ps(v0, z), z1 = _mm_cmpeq_ps(v1, z);
    acc0 = _mm_add_ps(acc0, _mm_mul_ps(v0, v0));
    acc1 = _mm_add_ps(acc1, _mm_mul_ps(v1, v1));
    zero_lanes = _mm_add_epi32(zero_lanes, _mm_castps_si128(z0));
    zero_lanes = _mm_add_epi32(zero_lanes, _mm_castps_si128(z1));
    // movemask reads the sign bit as onebit_sign_bit does.
    signs[j] = static_cast<uint8_t>(_mm_movemask_ps(v0) | (_mm_movemask_ps(v1) << 4));
    mask[j] = static_cast<uint8_t>(_mm_movemask_ps(z0) | (_mm_movemask_ps(z1) << 4));
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, _mm_add_ps(acc0, acc1));
  sumsq += double(lanes[0]) + lanes[1] + lanes[2] + lanes[3];
  alignas(16) int32_t zl[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(zl), zero_lanes);
  zeros += static_cast<size_t>(-(int64_t{zl[0]} + zl[1] + zl[2] + zl[3]));
#endif
  for (; j < whole; ++j) {
    onebit_encode_tail(in + 8 * j, residual ? residual + 8 * j : nullptr, 8, pending, sumsq, zeros,
                       signs + j, mask + j);
  }
  onebit_encode_tail(in + 8 * whole, residual ? residual + 8 * whole : nullptr, count % 8, pending,
                     sumsq, zeros, signs + whole, mask + whole);
}

// residual[0, count) = onebit_settled(residual, scale).
void settle_block(float* residual, size_t count, float scale) {
  if (host_avx2()) return onebit_avx2::settle_block(residual, count, scale);
  for (size_t i = 0; i < count; ++i) residual[i] = onebit_settled(residual[i], scale);
}

// out[0, count) = pos * decode (or += with accumulate) of the sign and mask bytes from `signs`
// and `mask` (null: no zeros) on.
void decode_span(const uint8_t* signs, const uint8_t* mask, size_t count, float pos,
                 bool accumulate, float* out) {
  size_t j = 0;
  if (host_avx2()) {
    j = onebit_avx2::decode_whole(signs, mask, count, pos, accumulate, out);
  } else {
#if defined(__SSE2__)
    const __m128 p = _mm_set1_ps(pos);
    for (; 8 * j + 8 <= count; ++j) {
      const uint8_t s = signs[j], zr = mask ? mask[j] : 0;
      float* o = out + 8 * j;
      __m128 lo = _mm_andnot_ps(kMasks.zero[zr & 15], _mm_or_ps(kMasks.sign[s & 15], p));
      __m128 hi = _mm_andnot_ps(kMasks.zero[zr >> 4], _mm_or_ps(kMasks.sign[s >> 4], p));
      if (accumulate) {
        lo = _mm_add_ps(lo, _mm_loadu_ps(o));
        hi = _mm_add_ps(hi, _mm_loadu_ps(o + 4));
      }
      _mm_storeu_ps(o, lo);
      _mm_storeu_ps(o + 4, hi);
    }
#endif
  }
  for (; j * 8 < count; ++j) {
    const uint8_t s = signs[j], zr = mask ? mask[j] : 0;
    const size_t m = count - 8 * j < 8 ? count - 8 * j : 8;
    float* o = out + 8 * j;
    for (size_t k = 0; k < m; ++k) {
      const float d = decode_one(s, zr, static_cast<int>(k), pos);
      o[k] = accumulate ? o[k] + d : d;
    }
  }
}

// Writes the header of a segment of n values with the sweeps' figures; returns it.
OnebitHeader header_of(double sumsq, size_t zeros, size_t n) {
  const size_t nonzero = n - zeros;
  const float scale = nonzero ? static_cast<float>(std::sqrt(sumsq / double(nonzero))) : 0.0f;
  return OnebitHeader{scale, zeros ? kMaskFollows : kNoZeros, 0u, static_cast<uint32_t>(n)};
}

}  // namespace

void onebit_settle(float* residual, size_t n, float* pending) {
  if (*pending != 0.0f) settle_block(residual, n, *pending);
  *pending = 0.0f;
}

size_t onebit_encode_deferred(const float* in, float* residual, float* pending, size_t n,
                              uint8_t* out, uint8_t* cache) {
  // One sweep, block by block: the signs and zero bits do not depend on the scale, and the
  // residual keeps v until the scale is known (the next call, or onebit_settle).
  const float was = residual ? *pending : 0.0f;
  double sumsq = 0.0;
  size_t zeros = 0;
  uint8_t* signs = out + sizeof(OnebitHeader);
  uint8_t* mask = signs + (n + 7) / 8;
  for (size_t b = 0; b < n; b += kBlock) {
    encode_block(in + b, residual ? residual + b : nullptr, std::min(kBlock, n - b), was, sumsq,
                 zeros, signs + b / 8, mask + b / 8);
  }
  const OnebitHeader h = header_of(sumsq, zeros, n);
  if (residual) *pending = h.scale;
  std::memcpy(out, &h, sizeof(h));
  return onebit_cache_encoded(out, n, cache);
}

size_t onebit_encode(const float* in, float* residual, size_t n, uint8_t* out, uint8_t* cache) {
  float pending = 0.0f;
  const size_t bytes = onebit_encode_deferred(in, residual, &pending, n, out, cache);
  if (residual) onebit_settle(residual, n, &pending);
  return bytes;
}

size_t onebit_cache_encoded(uint8_t* encoded, size_t n, uint8_t* cache) {
  OnebitHeader h;
  std::memcpy(&h, encoded, sizeof(h));
  if (h.zeros != kMaskFollows || cache == nullptr) return onebit_bytes(encoded, n);
  const size_t mask_bytes = (n + 7) / 8;
  const uint8_t* mask = encoded + sizeof(OnebitHeader) + mask_bytes;
  CacheHead c;
  std::memcpy(&c, cache, sizeof(c));
  uint8_t* cached = cache + sizeof(CacheHead);
  if (c.valid && std::memcmp(cached, mask, mask_bytes) == 0) {
    h.zeros = kMaskCached;
    h.mask_hash = c.hash;
  } else {
    // Only a stream with caches reads the hash: without one, no kMaskCached ever follows.
    h.mask_hash = onebit_mask_hash(mask, mask_bytes);
    std::memcpy(cached, mask, mask_bytes);
    c = {1u, h.mask_hash};
    std::memcpy(cache, &c, sizeof(c));
  }
  std::memcpy(encoded, &h, sizeof(h));
  return onebit_bytes(encoded, n);
}

namespace {

// The segment's mask (null: none), checked against and kept in `cache` as onebit_decode says.
const uint8_t* mask_of(const OnebitHeader& h, const uint8_t* signs, size_t n, uint8_t* cache) {
  PYRING_CHECK(h.count == static_cast<uint32_t>(n), CommError, "one-bit segment holds ", h.count,
               " values, the decoder expects ", n);
  PYRING_CHECK(h.zeros <= kMaskCached, CommError, "one-bit segment: unknown zero-mask mode ",
               h.zeros);
  const size_t mask_bytes = (n + 7) / 8;
  if (h.zeros == kMaskFollows) {
    const uint8_t* mask = signs + mask_bytes;
    if (cache) {
      std::memcpy(cache + sizeof(CacheHead), mask, mask_bytes);
      const CacheHead c{1u, h.mask_hash};
      std::memcpy(cache, &c, sizeof(c));
    }
    return mask;
  }
  if (h.zeros == kMaskCached) {
    CacheHead c{0, 0};
    if (cache) std::memcpy(&c, cache, sizeof(c));
    PYRING_CHECK(c.valid && c.hash == h.mask_hash, CommError,
                 "one-bit segment names a cached zero mask (hash ", h.mask_hash,
                 ") that this decoder ", c.valid ? "does not hold" : "never received",
                 ": the two sides' mask caches are out of step (one side's state was reset "
                 "or restored from another step)");
    return cache + sizeof(CacheHead);
  }
  return nullptr;
}

}  // namespace

void onebit_uncache(uint8_t* encoded, size_t n, uint8_t* cache) {
  OnebitHeader h;
  std::memcpy(&h, encoded, sizeof(h));
  uint8_t* signs = encoded + sizeof(OnebitHeader);
  const uint8_t* mask = mask_of(h, signs, n, cache);
  if (h.zeros != kMaskCached) return;
  std::memcpy(signs + (n + 7) / 8, mask, (n + 7) / 8);
  h.zeros = kMaskFollows;
  std::memcpy(encoded, &h, sizeof(h));
}

void onebit_decode(const uint8_t* encoded, size_t n, float alpha, bool accumulate, float* out,
                   uint8_t* cache) {
  OnebitHeader h;
  std::memcpy(&h, encoded, sizeof(h));
  const uint8_t* signs = encoded + sizeof(OnebitHeader);
  const uint8_t* mask = mask_of(h, signs, n, cache);
  decode_span(signs, mask, n, alpha * h.scale, accumulate, out);
}

size_t onebit_reduce_encode(const float* own, int divisor, const uint8_t* const* copies,
                            uint8_t* const* caches, size_t count, size_t n, float* residual,
                            float* pending, uint8_t* out, uint8_t* cache) {
  PYRING_CHECK_ARG(divisor >= 1, "onebit_reduce_encode: divisor ", divisor, " is not >= 1");
  const float div = static_cast<float>(divisor), alpha = 1.0f / div;
  std::vector<const uint8_t*> signs(count), masks(count);
  std::vector<float> pos(count);
  for (size_t k = 0; k < count; ++k) {  // every copy checked before any value is written
    OnebitHeader h;
    std::memcpy(&h, copies[k], sizeof h);
    signs[k] = copies[k] + sizeof(OnebitHeader);
    masks[k] = mask_of(h, signs[k], n, caches[k]);
    pos[k] = alpha * h.scale;
  }
  // Each block's sum, as finish_wide and onebit_decode would leave it in a buffer (kept in
  // L1), encoded as onebit_encode_deferred does; the AVX2 path keeps it in registers.
  alignas(16) float sum[kBlock];
  const float was = *pending;
  double sumsq = 0.0;
  size_t zeros = 0;
  uint8_t* out_signs = out + sizeof(OnebitHeader);
  uint8_t* out_mask = out_signs + (n + 7) / 8;
  const bool fused = host_avx2();
  std::vector<const uint8_t*> at_signs(count), at_masks(count);
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = std::min(kBlock, n - b);
    if (fused && len % 8 == 0) {
      for (size_t k = 0; k < count; ++k) {
        at_signs[k] = signs[k] + b / 8;
        at_masks[k] = masks[k] ? masks[k] + b / 8 : nullptr;
      }
      onebit_avx2::reduce_encode_block(own + b, div, at_signs.data(), at_masks.data(), pos.data(),
                                       count, len, residual + b, was, sumsq, zeros,
                                       out_signs + b / 8, out_mask + b / 8);
      continue;
    }
    for (size_t i = 0; i < len; ++i) sum[i] = own[b + i] / div;
    for (size_t k = 0; k < count; ++k) {
      decode_span(signs[k] + b / 8, masks[k] ? masks[k] + b / 8 : nullptr, len, pos[k], true, sum);
    }
    encode_block(sum, residual + b, len, was, sumsq, zeros, out_signs + b / 8, out_mask + b / 8);
  }
  const OnebitHeader h = header_of(sumsq, zeros, n);
  *pending = h.scale;
  std::memcpy(out, &h, sizeof(h));
  return onebit_cache_encoded(out, n, cache);
}

}  // namespace pyring
