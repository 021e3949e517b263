#include "kernels/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/errors.h"
#include "kernels/elementwise.h"
#include "kernels/onebit_avx2.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pyring {

namespace {

// Packs the sign and zero bits of v[0, 8) into one byte each, one value at a time.
inline void pack8_scalar(const float* v, uint8_t* sign, uint8_t* zero) {
  uint32_t s = 0, zr = 0;
  for (int k = 0; k < 8; ++k) {
    s |= onebit_sign_bit(v[k]) << k;
    zr |= onebit_zero_bit(v[k]) << k;
  }
  *sign = static_cast<uint8_t>(s);
  *zero = static_cast<uint8_t>(zr);
}

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

// Sweep 1 over one block: the sum of squares and the zeros of v = in + residual (residual
// null: v = in), added to sumsq block by block in the same lane order on every path.
void sum_block(const float* in, const float* residual, size_t count, double& sumsq, size_t& zeros) {
  if (onebit_avx2::available()) return onebit_avx2::sum_block(in, residual, count, sumsq, zeros);
  size_t i = 0;
#if defined(__SSE2__)
  __m128 acc0 = _mm_setzero_ps(), acc1 = _mm_setzero_ps();
  __m128i zero_lanes = _mm_setzero_si128();  // minus the zeros seen per lane (cmpeq gives -1)
  const __m128 z = _mm_setzero_ps();
  for (; i + 8 <= count; i += 8) {
    __m128 v0 = _mm_loadu_ps(in + i), v1 = _mm_loadu_ps(in + i + 4);
    if (residual) {
      v0 = _mm_add_ps(v0, _mm_loadu_ps(residual + i));
      v1 = _mm_add_ps(v1, _mm_loadu_ps(residual + i + 4));
    }
    acc0 = _mm_add_ps(acc0, _mm_mul_ps(v0, v0));
    acc1 = _mm_add_ps(acc1, _mm_mul_ps(v1, v1));
    zero_lanes = _mm_add_epi32(zero_lanes, _mm_castps_si128(_mm_cmpeq_ps(v0, z)));
    zero_lanes = _mm_add_epi32(zero_lanes, _mm_castps_si128(_mm_cmpeq_ps(v1, z)));
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, _mm_add_ps(acc0, acc1));
  sumsq += double(lanes[0]) + lanes[1] + lanes[2] + lanes[3];
  alignas(16) int32_t zl[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(zl), zero_lanes);
  zeros += static_cast<size_t>(-(int64_t{zl[0]} + zl[1] + zl[2] + zl[3]));
#endif
  for (; i < count; ++i) {
    const float v = residual ? in[i] + residual[i] : in[i];
    sumsq += double(v) * v;
    zeros += v == 0.0f;
  }
}

// Sweep 2 over one block (its first value starts a byte): the sign and zero bytes of
// v = in + add (add null: v = in), and, where `residual` is set, residual = v - decode(v)
// (it may be `in` or `add`: each value is read before it is written).
void pack_block(const float* in, const float* add, float* residual, size_t count, float scale,
                bool zeros, uint8_t* signs, uint8_t* mask) {
  if (onebit_avx2::available()) {
    return onebit_avx2::pack_block(in, add, residual, count, scale, zeros, signs, mask);
  }
  const size_t whole = count / 8;
#if defined(__SSE2__)
  const __m128 sc = _mm_set1_ps(scale);
#endif
  for (size_t j = 0; j < whole; ++j) {
    const float* p = in + 8 * j;
#if defined(__SSE2__)
    __m128 a = _mm_loadu_ps(p), b = _mm_loadu_ps(p + 4);
    if (add) {
      a = _mm_add_ps(a, _mm_loadu_ps(add + 8 * j));
      b = _mm_add_ps(b, _mm_loadu_ps(add + 8 * j + 4));
    }
    // movemask reads the sign bit as onebit_sign_bit does.
    const __m128 za = _mm_cmpeq_ps(a, _mm_setzero_ps()), zb4 = _mm_cmpeq_ps(b, _mm_setzero_ps());
    signs[j] = static_cast<uint8_t>(_mm_movemask_ps(a) | (_mm_movemask_ps(b) << 4));
    if (zeros) mask[j] = static_cast<uint8_t>(_mm_movemask_ps(za) | (_mm_movemask_ps(zb4) << 4));
    if (residual) {
      float* r = residual + 8 * j;
      const __m128 sign_bit = _mm_set1_ps(-0.0f);
      // v - decode(v): decode is copysign(scale, v), or 0 where v == 0.
      _mm_storeu_ps(r, _mm_sub_ps(a, _mm_andnot_ps(za, _mm_or_ps(_mm_and_ps(a, sign_bit), sc))));
      _mm_storeu_ps(r + 4,
                    _mm_sub_ps(b, _mm_andnot_ps(zb4, _mm_or_ps(_mm_and_ps(b, sign_bit), sc))));
    }
#else
    float v[8];
    for (int k = 0; k < 8; ++k) v[k] = add ? p[k] + add[8 * j + k] : p[k];
    uint8_t sb, zb;
    pack8_scalar(v, &sb, &zb);
    signs[j] = sb;
    if (zeros) mask[j] = zb;
    if (residual) {
      for (int k = 0; k < 8; ++k) residual[8 * j + k] = v[k] - decode_one(sb, zb, k, scale);
    }
#endif
  }
  if (count % 8) {
    float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const size_t left = count % 8, at = 8 * whole;
    for (size_t k = 0; k < left; ++k) {
      tail[k] = add ? in[at + k] + add[at + k] : in[at + k];
    }
    uint8_t sb, zb;
    pack8_scalar(tail, &sb, &zb);
    const uint8_t keep = static_cast<uint8_t>((1u << left) - 1u);
    signs[whole] = sb & keep;
    if (zeros) mask[whole] = zb & keep;
    if (residual) {
      for (size_t k = 0; k < left; ++k) {
        residual[at + k] = tail[k] - decode_one(sb, zb, static_cast<int>(k), scale);
      }
    }
  }
}

// out[0, count) = pos * decode (or += with accumulate) of the sign and mask bytes from `signs`
// and `mask` (null: no zeros) on.
void decode_span(const uint8_t* signs, const uint8_t* mask, size_t count, float pos,
                 bool accumulate, float* out) {
  size_t j = 0;
  if (onebit_avx2::available()) {
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

size_t onebit_encode(const float* in, float* residual, size_t n, uint8_t* out, uint8_t* cache) {
  // Two sweeps, block by block, over v = in + residual (never stored): sum of squares and
  // zeros, then sign pack, zero mask and new residual.
  double sumsq = 0.0;
  size_t zeros = 0;
  for (size_t b = 0; b < n; b += kBlock) {
    sum_block(in + b, residual ? residual + b : nullptr, std::min(kBlock, n - b), sumsq, zeros);
  }
  const OnebitHeader h = header_of(sumsq, zeros, n);
  uint8_t* signs = out + sizeof(OnebitHeader);
  uint8_t* mask = signs + (n + 7) / 8;
  for (size_t b = 0; b < n; b += kBlock) {
    float* r = residual ? residual + b : nullptr;
    pack_block(in + b, r, r, std::min(kBlock, n - b), h.scale, zeros != 0, signs + b / 8,
               mask + b / 8);
  }
  std::memcpy(out, &h, sizeof(h));
  return onebit_cache_encoded(out, n, cache);
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

size_t onebit_reduce_encode(const uint8_t* const* copies, uint8_t* const* caches, size_t count,
                            size_t n, float alpha, float* residual, uint8_t* out, uint8_t* cache) {
  std::vector<const uint8_t*> signs(count), masks(count);
  std::vector<float> pos(count);
  for (size_t k = 0; k < count; ++k) {  // every copy checked before any value is written
    OnebitHeader h;
    std::memcpy(&h, copies[k], sizeof h);
    signs[k] = copies[k] + sizeof(OnebitHeader);
    masks[k] = mask_of(h, signs[k], n, caches[k]);
    pos[k] = alpha * h.scale;
  }
  // Sweep 1: each block's sum, as onebit_decode would leave it in a buffer (kept in L1), plus
  // the residual: v, kept in the residual. Sweep 2 packs v and leaves v - decode(v) there.
  alignas(16) float sum[kBlock];
  double sumsq = 0.0;
  size_t zeros = 0;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = std::min(kBlock, n - b);
    for (size_t k = 0; k < count; ++k) {
      decode_span(signs[k] + b / 8, masks[k] ? masks[k] + b / 8 : nullptr, len, pos[k], k > 0, sum);
    }
    float* r = residual + b;
    for (size_t i = 0; i < len; ++i) r[i] += sum[i];  // v = sum + residual, as encode adds
    sum_block(r, nullptr, len, sumsq, zeros);
  }
  const OnebitHeader h = header_of(sumsq, zeros, n);
  uint8_t* out_signs = out + sizeof(OnebitHeader);
  uint8_t* out_mask = out_signs + (n + 7) / 8;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = std::min(kBlock, n - b);
    pack_block(residual + b, nullptr, residual + b, len, h.scale, zeros != 0, out_signs + b / 8,
               out_mask + b / 8);
  }
  std::memcpy(out, &h, sizeof(h));
  return onebit_cache_encoded(out, n, cache);
}

}  // namespace pyring
