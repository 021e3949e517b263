#include "kernels/onebit_blocks.h"

#include "kernels/elementwise.h"
#include "kernels/onebit_avx2.h"
#include "kernels/simd.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pyring::onebit_blocks {

namespace {

inline float decode_one(uint8_t sign, uint8_t zero, int k, float scale) {
  return onebit_value(sign, zero, k, scale);
}

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

// r - decode(r) with scale p (0 where r == 0), as onebit_settled, four lanes at a time.
inline __m128 settled4(__m128 r, __m128 p) {
  const __m128 zr = _mm_cmpeq_ps(r, _mm_setzero_ps());
  return _mm_sub_ps(r, _mm_andnot_ps(zr, _mm_or_ps(_mm_and_ps(r, _mm_set1_ps(-0.0f)), p)));
}

// A block's running figures on the SSE path: the squares of each group's first four and last
// four values in two accumulators, and minus the zeros seen per lane (cmpeq gives -1).
struct Figures4 {
  __m128 acc0 = _mm_setzero_ps(), acc1 = _mm_setzero_ps();
  __m128i zero_lanes = _mm_setzero_si128();

  // A group of eight values, v0 its first four: into the figures, and its sign and zero
  // bytes (movemask reads the sign bit as onebit_sign_bit does).
  void add(__m128 v0, __m128 v1, uint8_t* sign, uint8_t* mask) {
    const __m128 z = _mm_setzero_ps();
    const __m128 z0 = _mm_cmpeq_ps(v0, z), z1 = _mm_cmpeq_ps(v1, z);
    acc0 = _mm_add_ps(acc0, _mm_mul_ps(v0, v0));
    acc1 = _mm_add_ps(acc1, _mm_mul_ps(v1, v1));
    zero_lanes = _mm_add_epi32(zero_lanes, _mm_castps_si128(z0));
    zero_lanes = _mm_add_epi32(zero_lanes, _mm_castps_si128(z1));
    *sign = static_cast<uint8_t>(_mm_movemask_ps(v0) | (_mm_movemask_ps(v1) << 4));
    *mask = static_cast<uint8_t>(_mm_movemask_ps(z0) | (_mm_movemask_ps(z1) << 4));
  }

  // acc0 + acc1, then its four lanes in order, into sumsq; the zeros into zeros.
  void into(double& sumsq, size_t& zeros) const {
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, _mm_add_ps(acc0, acc1));
    sumsq += double(lanes[0]) + lanes[1] + lanes[2] + lanes[3];
    alignas(16) int32_t zl[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(zl), zero_lanes);
    zeros += static_cast<size_t>(-(int64_t{zl[0]} + zl[1] + zl[2] + zl[3]));
  }
};

}  // namespace
#endif

void encode_block(const float* in, float* residual, size_t count, float pending, double& sumsq,
                  size_t& zeros, uint8_t* signs, uint8_t* mask) {
  if (host_avx2()) {
    return onebit_avx2::encode_block(in, residual, count, pending, sumsq, zeros, signs, mask);
  }
  const size_t whole = count / 8;
  size_t j = 0;
#if defined(__SSE2__)
  Figures4 f;
  const __m128 p = _mm_set1_ps(pending);
  for (; j < whole; ++j) {
    __m128 v0 = _mm_loadu_ps(in + 8 * j), v1 = _mm_loadu_ps(in + 8 * j + 4);
    if (residual) {
      float* r = residual + 8 * j;
      v0 = _mm_add_ps(v0, settled4(_mm_loadu_ps(r), p));
      v1 = _mm_add_ps(v1, settled4(_mm_loadu_ps(r + 4), p));
      _mm_storeu_ps(r, v0);
      _mm_storeu_ps(r + 4, v1);
    }
    f.add(v0, v1, signs + j, mask + j);
  }
  f.into(sumsq, zeros);
#endif
  for (; j < whole; ++j) {
    onebit_encode_tail(in + 8 * j, residual ? residual + 8 * j : nullptr, 8, pending, sumsq, zeros,
                       signs + j, mask + j);
  }
  onebit_encode_tail(in + 8 * whole, residual ? residual + 8 * whole : nullptr, count % 8, pending,
                     sumsq, zeros, signs + whole, mask + whole);
}

void settle_block(float* residual, size_t count, float scale) {
  if (host_avx2()) return onebit_avx2::settle_block(residual, count, scale);
  for (size_t i = 0; i < count; ++i) residual[i] = onebit_settled(residual[i], scale);
}

#if defined(__SSE2__)
namespace {

// The SSE2 forms of onebit_avx2.cc's kept_load, kept_bits and fed_kept, four lanes at a time.
inline __m128 kept_load4(const uint16_t* residual) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(residual));
  return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), b));
}

inline __m128i kept_bits4(__m128 v) {
  const __m128i u = _mm_castps_si128(v);
  const __m128i high = _mm_srli_epi32(u, 16);
  const __m128i bias =
      _mm_add_epi32(_mm_set1_epi32(0x7fff), _mm_and_si128(high, _mm_set1_epi32(1)));
  const __m128i rounded = _mm_srli_epi32(_mm_add_epi32(u, bias), 16);
  const __m128i nan = _mm_or_si128(high, _mm_set1_epi32(0x40));
  const __m128i is_nan =
      _mm_cmpgt_epi32(_mm_and_si128(u, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
  return _mm_or_si128(_mm_and_si128(is_nan, nan), _mm_andnot_si128(is_nan, rounded));
}

inline __m128 fed_kept4(__m128 v, uint16_t* residual, __m128 p) {
  const __m128i b = kept_bits4(_mm_add_ps(v, settled4(kept_load4(residual), p)));
  const __m128i s = _mm_srai_epi32(_mm_slli_epi32(b, 16), 16);  // packs saturates: sign-extend
  _mm_storel_epi64(reinterpret_cast<__m128i*>(residual), _mm_packs_epi32(s, s));
  return _mm_castsi128_ps(_mm_slli_epi32(b, 16));
}

}  // namespace
#endif

void encode_block_kept(const float* in, uint16_t* residual, size_t count, float pending,
                       double& sumsq, size_t& zeros, uint8_t* signs, uint8_t* mask) {
  const size_t whole = count / 8;
  if (host_avx2()) {
    onebit_avx2::encode_block_kept(in, residual, 8 * whole, pending, sumsq, zeros, signs, mask);
  } else {
#if defined(__SSE2__)
    Figures4 f;
    const __m128 p = _mm_set1_ps(pending);
    for (size_t j = 0; j < whole; ++j) {
      const __m128 v0 = fed_kept4(_mm_loadu_ps(in + 8 * j), residual + 8 * j, p);
      const __m128 v1 = fed_kept4(_mm_loadu_ps(in + 8 * j + 4), residual + 8 * j + 4, p);
      f.add(v0, v1, signs + j, mask + j);
    }
    f.into(sumsq, zeros);
#else
    for (size_t j = 0; j < whole; ++j) {
      onebit_encode_tail(in + 8 * j, residual + 8 * j, 8, pending, sumsq, zeros, signs + j,
                         mask + j);
    }
#endif
  }
  onebit_encode_tail(in + 8 * whole, residual + 8 * whole, count % 8, pending, sumsq, zeros,
                     signs + whole, mask + whole);
}

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

}  // namespace pyring::onebit_blocks
