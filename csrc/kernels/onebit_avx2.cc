#include "kernels/onebit_avx2.h"

#include "kernels/elementwise.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pyring::onebit_avx2 {

#if defined(__x86_64__)

namespace {
constexpr size_t kStreamFrom = size_t{1} << 18;
}  // namespace

// One lane group of settle: r - decode(r) with scale p (0 where r == 0), as the encoder's
// residual; with p == 0 it is r, bit for bit.
__attribute__((target("avx2"))) inline __m256 settled(__m256 r, __m256 p) {
  const __m256 zr = _mm256_cmp_ps(r, _mm256_setzero_ps(), _CMP_EQ_OQ);
  return _mm256_sub_ps(
      r, _mm256_andnot_ps(zr, _mm256_or_ps(_mm256_and_ps(r, _mm256_set1_ps(-0.0f)), p)));
}

// The eight values at v into the block's running figures: v + settled(residual) (residual
// null: v) stored back in the residual, its squares into acc, its zeros into zero_lanes (-1
// each), its sign and zero bytes.
__attribute__((target("avx2"))) inline void encode8(__m256 v, float* residual, __m256 p,
                                                    __m256& acc, __m256i& zero_lanes, uint8_t* sign,
                                                    uint8_t* mask) {
  if (residual) {
    v = _mm256_add_ps(v, settled(_mm256_loadu_ps(residual), p));
    _mm256_storeu_ps(residual, v);
  }
  const __m256 zv = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ);
  acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
  zero_lanes = _mm256_add_epi32(zero_lanes, _mm256_castps_si256(zv));
  *sign = static_cast<uint8_t>(_mm256_movemask_ps(v));  // the sign bits
  *mask = static_cast<uint8_t>(_mm256_movemask_ps(zv));
}

// A block's figures added to sumsq and zeros: the SSE path's acc0 + acc1 (the low and high
// halves), then its four lanes in order.
__attribute__((target("avx2"))) inline void add_figures(__m256 acc, __m256i zero_lanes,
                                                        double& sumsq, size_t& zeros) {
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
  sumsq += double(lanes[0]) + lanes[1] + lanes[2] + lanes[3];
  alignas(32) int32_t zl[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(zl), zero_lanes);
  int64_t total = 0;
  for (int k = 0; k < 8; ++k) total += zl[k];
  zeros += static_cast<size_t>(-total);
}

// Eight decoded values: bit k of sign byte s to lane k as -pos where set, else +pos; 0 where
// bit k of zero byte z is set.
__attribute__((target("avx2"))) inline __m256 decoded8(uint8_t s, uint8_t z, __m256 p) {
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i sl = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(s), bits), bits);
  const __m256 d = _mm256_or_ps(_mm256_castsi256_ps(_mm256_slli_epi32(sl, 31)), p);
  if (z == 0) return d;
  const __m256i zl = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(z), bits), bits);
  return _mm256_andnot_ps(_mm256_castsi256_ps(zl), d);
}

__attribute__((target("avx2"))) void encode_block(const float* in, float* residual, size_t count,
                                                  float pending, double& sumsq, size_t& zeros,
                                                  uint8_t* signs, uint8_t* mask) {
  const size_t whole = count / 8;
  __m256 acc = _mm256_setzero_ps();
  __m256i zero_lanes = _mm256_setzero_si256();
  const __m256 p = _mm256_set1_ps(pending);
  for (size_t j = 0; j < whole; ++j) {
    encode8(_mm256_loadu_ps(in + 8 * j), residual ? residual + 8 * j : nullptr, p, acc, zero_lanes,
            signs + j, mask + j);
  }
  add_figures(acc, zero_lanes, sumsq, zeros);
  onebit_encode_tail(in + 8 * whole, residual ? residual + 8 * whole : nullptr, count % 8, pending,
                     sumsq, zeros, signs + whole, mask + whole);
}

__attribute__((target("avx2"))) void reduce_encode_block(
    const float* own, float divisor, const uint8_t* const* signs, const uint8_t* const* masks,
    const float* pos, size_t copies, size_t count, float* residual, float pending, double& sumsq,
    size_t& zeros, uint8_t* out_signs, uint8_t* out_mask) {
  __m256 acc = _mm256_setzero_ps();
  __m256i zero_lanes = _mm256_setzero_si256();
  const __m256 p = _mm256_set1_ps(pending), div = _mm256_set1_ps(divisor);
  for (size_t j = 0; j < count / 8; ++j) {
    __m256 sum = _mm256_div_ps(_mm256_loadu_ps(own + 8 * j), div);
    for (size_t k = 0; k < copies; ++k) {  // decode_whole's accumulate: d + sum
      sum = _mm256_add_ps(decoded8(signs[k][j], masks[k] ? masks[k][j] : 0, _mm256_set1_ps(pos[k])),
                          sum);
    }
    encode8(sum, residual + 8 * j, p, acc, zero_lanes, out_signs + j, out_mask + j);
  }
  add_figures(acc, zero_lanes, sumsq, zeros);
}

__attribute__((target("avx2"))) void settle_block(float* residual, size_t count, float scale) {
  const __m256 p = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(residual + i, settled(_mm256_loadu_ps(residual + i), p));
  }
  for (; i < count; ++i) residual[i] = onebit_settled(residual[i], scale);
}

__attribute__((target("avx2"))) size_t decode_whole(const uint8_t* signs, const uint8_t* mask,
                                                    size_t count, float pos, bool accumulate,
                                                    float* out) {
  const __m256 p = _mm256_set1_ps(pos);
  // Overwrites of kStreamFrom values and more skip the read of the lines they replace: the
  // compressed allreduce's last decode writes the whole tensor. With it the 64 MiB onebit call
  // on shm took 1.38-1.49x float32's time where it took 1.51-1.53x, taking turns 12 times
  // (bench/wire_speed.py), in the machine's fast state.
  const bool stream =
      !accumulate && count >= kStreamFrom && (reinterpret_cast<uintptr_t>(out) & 31) == 0;
  size_t j = 0;
  for (; 8 * j + 8 <= count; ++j) {
    const __m256 d = decoded8(signs[j], mask ? mask[j] : 0, p);
    float* o = out + 8 * j;
    if (accumulate) {
      _mm256_storeu_ps(o, _mm256_add_ps(d, _mm256_loadu_ps(o)));
    } else if (stream) {
      _mm256_stream_ps(o, d);
    } else {
      _mm256_storeu_ps(o, d);
    }
  }
  if (stream) _mm_sfence();
  return j;
}

#else

void encode_block(const float*, float*, size_t, float, double&, size_t&, uint8_t*, uint8_t*) {}
void reduce_encode_block(const float*, float, const uint8_t* const*, const uint8_t* const*,
                         const float*, size_t, size_t, float*, float, double&, size_t&, uint8_t*,
                         uint8_t*) {}
void settle_block(float*, size_t, float) {}
size_t decode_whole(const uint8_t*, const uint8_t*, size_t, float, bool, float*) {
  return 0;
}

#endif

}  // namespace pyring::onebit_avx2
