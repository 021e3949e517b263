#include "kernels/onebit.h"

#include <cmath>
#include <cstring>

#include "core/errors.h"
#include "kernels/elementwise.h"

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

// pack8_scalar, vectorised where the machine can.
inline void pack8(const float* v, uint8_t* sign, uint8_t* zero) {
#if defined(__SSE2__)
  const __m128 a = _mm_loadu_ps(v), b = _mm_loadu_ps(v + 4), z = _mm_setzero_ps();
  // movemask reads the sign bit as onebit_sign_bit does.
  *sign = static_cast<uint8_t>(_mm_movemask_ps(a) | (_mm_movemask_ps(b) << 4));
  *zero = static_cast<uint8_t>(_mm_movemask_ps(_mm_cmpeq_ps(a, z)) |
                               (_mm_movemask_ps(_mm_cmpeq_ps(b, z)) << 4));
#else
  pack8_scalar(v, sign, zero);
#endif
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

// decode(v) for 4 lanes: copysign(scale, v), or 0 where v == 0.
inline __m128 decode4(__m128 v, __m128 scale) {
  const __m128 sign_bit = _mm_set1_ps(-0.0f);
  const __m128 d = _mm_or_ps(_mm_and_ps(v, sign_bit), scale);
  return _mm_andnot_ps(_mm_cmpeq_ps(v, _mm_setzero_ps()), d);
}

}  // namespace
#endif

size_t onebit_encode(const float* in, float* residual, size_t n, uint8_t* out, uint8_t* cache) {
  // Sweep 1, block by block: v = in + residual (kept in residual), sum of squares, zeros.
  double sumsq = 0.0;
  size_t zeros = 0;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = b + kBlock < n ? b + kBlock : n;
    size_t i = b;
#if defined(__SSE2__)
    __m128 acc0 = _mm_setzero_ps(), acc1 = _mm_setzero_ps();
    for (; i + 8 <= e; i += 8) {
      __m128 v0 = _mm_loadu_ps(in + i), v1 = _mm_loadu_ps(in + i + 4);
      if (residual) {
        v0 = _mm_add_ps(v0, _mm_loadu_ps(residual + i));
        v1 = _mm_add_ps(v1, _mm_loadu_ps(residual + i + 4));
        _mm_storeu_ps(residual + i, v0);
        _mm_storeu_ps(residual + i + 4, v1);
      }
      acc0 = _mm_add_ps(acc0, _mm_mul_ps(v0, v0));
      acc1 = _mm_add_ps(acc1, _mm_mul_ps(v1, v1));
      const __m128 z = _mm_setzero_ps();
      zeros += static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(
          _mm_movemask_ps(_mm_cmpeq_ps(v0, z)) | (_mm_movemask_ps(_mm_cmpeq_ps(v1, z)) << 4))));
    }
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, _mm_add_ps(acc0, acc1));
    sumsq += double(lanes[0]) + lanes[1] + lanes[2] + lanes[3];
#endif
    for (; i < e; ++i) {
      const float v = residual ? in[i] + residual[i] : in[i];
      if (residual) residual[i] = v;
      sumsq += double(v) * v;
      zeros += v == 0.0f;
    }
  }
  const float* v = residual ? residual : in;
  const size_t nonzero = n - zeros;
  const float scale = nonzero ? static_cast<float>(std::sqrt(sumsq / double(nonzero))) : 0.0f;
  OnebitHeader h{scale, zeros ? kMaskFollows : kNoZeros, 0u, static_cast<uint32_t>(n)};
  uint8_t* signs = out + sizeof(OnebitHeader);
  uint8_t* mask = signs + (n + 7) / 8;
  // Sweep 2: sign pack, zero mask and new residual = v - decode(v).
  const size_t whole = n / 8;
#if defined(__SSE2__)
  const __m128 sc = _mm_set1_ps(scale);
#endif
  for (size_t j = 0; j < whole; ++j) {
    const float* p = v + 8 * j;
    uint8_t s, zr;
    pack8(p, &s, &zr);
    signs[j] = s;
    if (zeros) mask[j] = zr;
    if (residual) {
      float* r = residual + 8 * j;
#if defined(__SSE2__)
      const __m128 a = _mm_loadu_ps(p), b = _mm_loadu_ps(p + 4);
      _mm_storeu_ps(r, _mm_sub_ps(a, decode4(a, sc)));
      _mm_storeu_ps(r + 4, _mm_sub_ps(b, decode4(b, sc)));
#else
      for (int k = 0; k < 8; ++k) r[k] = p[k] - decode_one(s, zr, k, scale);
#endif
    }
  }
  if (n % 8) {
    float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const size_t left = n % 8;
    std::memcpy(tail, v + 8 * whole, left * sizeof(float));
    uint8_t s, zr;
    pack8_scalar(tail, &s, &zr);
    const uint8_t keep = static_cast<uint8_t>((1u << left) - 1u);
    signs[whole] = s & keep;
    if (zeros) mask[whole] = zr & keep;
    if (residual) {
      for (size_t k = 0; k < left; ++k) {
        residual[8 * whole + k] = tail[k] - decode_one(s, zr, static_cast<int>(k), scale);
      }
    }
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
  const float pos = alpha * h.scale;
  size_t j = 0;
#if defined(__SSE2__)
  const __m128 p = _mm_set1_ps(pos);
  for (; 8 * j + 8 <= n; ++j) {
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
  for (; j * 8 < n; ++j) {
    const uint8_t s = signs[j], zr = mask ? mask[j] : 0;
    const size_t m = n - 8 * j < 8 ? n - 8 * j : 8;
    float* o = out + 8 * j;
    for (size_t k = 0; k < m; ++k) {
      const float d = decode_one(s, zr, static_cast<int>(k), pos);
      o[k] = accumulate ? o[k] + d : d;
    }
  }
}

}  // namespace pyring
