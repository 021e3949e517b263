#include "kernels/onebit_avx2.h"

#include <cmath>

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

// v + settled(residual), stored back in the residual.
__attribute__((target("avx2"))) inline __m256 fed(__m256 v, float* residual, __m256 p) {
  v = _mm256_add_ps(v, settled(_mm256_loadu_ps(residual), p));
  _mm256_storeu_ps(residual, v);
  return v;
}

// A kept residual's eight values (kernels/onebit.h).
__attribute__((target("avx2"))) inline __m256 kept_load(const uint16_t* residual) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(residual));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

// onebit_kept of eight values, in the low half of each lane: half.h's to_bfloat16, lane by
// lane.
__attribute__((target("avx2"))) inline __m256i kept_bits(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i bias =
      _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}

// v + settled(kept residual), rounded as the residual keeps it and stored there; returns the
// rounded value, the one encoded.
__attribute__((target("avx2"))) inline __m256 fed_kept(__m256 v, uint16_t* residual, __m256 p) {
  const __m256i b = kept_bits(_mm256_add_ps(v, settled(kept_load(residual), p)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(residual),
                   _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
}

// The eight values v into the block's running figures: their squares into acc, their zeros
// into zero_lanes (-1 each), their sign and zero bytes.
__attribute__((target("avx2"))) inline void figures8(__m256 v, __m256& acc, __m256i& zero_lanes,
                                                     uint8_t* sign, uint8_t* mask) {
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

// Lane k of entry b is the float sign bit where bit k of byte b is set, else 0: one load
// turns a sign byte into its eight lanes' signs, and an arithmetic shift turns a zero byte
// into its lanes' masks (a third of the instructions of deriving them from the byte).
struct SignTable {
  alignas(32) uint32_t lanes[256][8];
  SignTable() {
    for (int b = 0; b < 256; ++b) {
      for (int k = 0; k < 8; ++k) lanes[b][k] = (b >> k) & 1 ? 0x80000000u : 0u;
    }
  }
};
const SignTable kSigns;

__attribute__((target("avx2"))) inline __m256i sign_lanes(uint8_t b) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(kSigns.lanes[b]));
}

// Eight decoded values: bit k of sign byte s to lane k as -pos where set, else +pos; 0 where
// bit k of zero byte z is set.
__attribute__((target("avx2"))) inline __m256 decoded8(uint8_t s, __m256 p) {
  return _mm256_or_ps(_mm256_castsi256_ps(sign_lanes(s)), p);
}
__attribute__((target("avx2"))) inline __m256 decoded8(uint8_t s, uint8_t z, __m256 p) {
  const __m256 d = decoded8(s, p);
  if (z == 0) return d;
  return _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_srai_epi32(sign_lanes(z), 31)), d);
}

__attribute__((target("avx2"))) void encode_block(const float* in, float* residual, size_t count,
                                                  float pending, double& sumsq, size_t& zeros,
                                                  uint8_t* signs, uint8_t* mask) {
  const size_t whole = count / 8;
  __m256 acc = _mm256_setzero_ps();
  __m256i zero_lanes = _mm256_setzero_si256();
  const __m256 p = _mm256_set1_ps(pending);
  for (size_t j = 0; j < whole; ++j) {
    __m256 v = _mm256_loadu_ps(in + 8 * j);
    if (residual) v = fed(v, residual + 8 * j, p);
    figures8(v, acc, zero_lanes, signs + j, mask + j);
  }
  add_figures(acc, zero_lanes, sumsq, zeros);
  onebit_encode_tail(in + 8 * whole, residual ? residual + 8 * whole : nullptr, count % 8, pending,
                     sumsq, zeros, signs + whole, mask + whole);
}

__attribute__((target("avx2"))) void encode_block_kept(const float* in, uint16_t* residual,
                                                       size_t count, float pending, double& sumsq,
                                                       size_t& zeros, uint8_t* signs,
                                                       uint8_t* mask) {
  __m256 acc = _mm256_setzero_ps();
  __m256i zero_lanes = _mm256_setzero_si256();
  const __m256 p = _mm256_set1_ps(pending);
  for (size_t j = 0; j < count / 8; ++j) {
    figures8(fed_kept(_mm256_loadu_ps(in + 8 * j), residual + 8 * j, p), acc, zero_lanes, signs + j,
             mask + j);
  }
  add_figures(acc, zero_lanes, sumsq, zeros);
}

namespace {

// own[i] / divisor for eight values: a product where 1 / divisor is exact (a power of two:
// the same float as the quotient), the quotient itself otherwise (three ranks and more
// averaging over a count that is not one). Division costs several times a product's
// throughput and ran once per eight values of every owned chunk.
enum class Scaling { kNone, kProduct, kQuotient };

Scaling scaling_of(float divisor) {
  if (divisor == 1.0f) return Scaling::kNone;
  int e = 0;
  return std::frexp(divisor, &e) == 0.5f ? Scaling::kProduct : Scaling::kQuotient;
}

template <Scaling kScaling>
__attribute__((target("avx2"))) inline __m256 scaled(__m256 v, __m256 div, __m256 inv) {
  if constexpr (kScaling == Scaling::kNone) return v;
  if constexpr (kScaling == Scaling::kProduct) return _mm256_mul_ps(v, inv);
  return _mm256_div_ps(v, div);
}

// onebit_reduce_encode's block: its arguments.
struct ReduceBlock {
  const float* own;
  float divisor;
  const uint8_t* const* signs;
  const uint8_t* const* masks;
  const float* pos;
  size_t copies;
  size_t count;
  uint16_t* residual;
  float pending;
  uint8_t* out_signs;
  uint8_t* out_mask;
};

constexpr size_t kHeldCopies = 16;  // up to this many copies, their scales are broadcast once

// kCopies: the block's copies where it is one of the few instantiated (the inner loop then
// unrolls), 0 for any other count.
template <Scaling kScaling, size_t kCopies>
__attribute__((target("avx2"))) void reduce_encode_scaled(const ReduceBlock& b, double& sumsq,
                                                          size_t& zeros) {
  const size_t copies = kCopies ? kCopies : b.copies;
  __m256 acc = _mm256_setzero_ps();
  __m256i zero_lanes = _mm256_setzero_si256();
  const __m256 p = _mm256_set1_ps(b.pending), div = _mm256_set1_ps(b.divisor),
               inv = _mm256_set1_ps(1.0f / b.divisor);
  __m256 held[kHeldCopies];
  const bool all_held = copies <= kHeldCopies;
  for (size_t k = 0; all_held && k < copies; ++k) held[k] = _mm256_set1_ps(b.pos[k]);
  for (size_t j = 0; j < b.count / 8; ++j) {
    __m256 sum = scaled<kScaling>(_mm256_loadu_ps(b.own + 8 * j), div, inv);
    for (size_t k = 0; k < copies; ++k) {  // decode_whole's accumulate: d + sum
      const __m256 pk = all_held ? held[k] : _mm256_set1_ps(b.pos[k]);
      const uint8_t s = b.signs[k][j];
      sum = _mm256_add_ps(b.masks[k] ? decoded8(s, b.masks[k][j], pk) : decoded8(s, pk), sum);
    }
    figures8(fed_kept(sum, b.residual + 8 * j, p), acc, zero_lanes, b.out_signs + j,
             b.out_mask + j);
  }
  add_figures(acc, zero_lanes, sumsq, zeros);
}

template <Scaling kScaling>
__attribute__((target("avx2"))) void reduce_encode_counted(const ReduceBlock& b, double& sumsq,
                                                           size_t& zeros) {
  switch (b.copies) {
    case 1:
      return reduce_encode_scaled<kScaling, 1>(b, sumsq, zeros);
    case 2:
      return reduce_encode_scaled<kScaling, 2>(b, sumsq, zeros);
    case 3:
      return reduce_encode_scaled<kScaling, 3>(b, sumsq, zeros);
    default:
      return reduce_encode_scaled<kScaling, 0>(b, sumsq, zeros);
  }
}

}  // namespace

__attribute__((target("avx2"))) void reduce_encode_block(
    const float* own, float divisor, const uint8_t* const* signs, const uint8_t* const* masks,
    const float* pos, size_t copies, size_t count, uint16_t* residual, float pending, double& sumsq,
    size_t& zeros, uint8_t* out_signs, uint8_t* out_mask) {
  const ReduceBlock b{own,   divisor,  signs,   masks,     pos,     copies,
                      count, residual, pending, out_signs, out_mask};
  switch (scaling_of(divisor)) {
    case Scaling::kNone:
      return reduce_encode_counted<Scaling::kNone>(b, sumsq, zeros);
    case Scaling::kProduct:
      return reduce_encode_counted<Scaling::kProduct>(b, sumsq, zeros);
    case Scaling::kQuotient:
      return reduce_encode_counted<Scaling::kQuotient>(b, sumsq, zeros);
  }
}

__attribute__((target("avx2"))) void settle_block(float* residual, size_t count, float scale) {
  const __m256 p = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(residual + i, settled(_mm256_loadu_ps(residual + i), p));
  }
  for (; i < count; ++i) residual[i] = onebit_settled(residual[i], scale);
}

__attribute__((target("avx2"))) size_t settled_kept_whole(const uint16_t* residual, size_t count,
                                                          float scale, float* out) {
  const __m256 p = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, settled(kept_load(residual + i), p));
  return i;
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
  const size_t whole = count / 8;
  if (accumulate) {
    for (size_t j = 0; j < whole; ++j) {
      const __m256 d = mask ? decoded8(signs[j], mask[j], p) : decoded8(signs[j], p);
      _mm256_storeu_ps(out + 8 * j, _mm256_add_ps(d, _mm256_loadu_ps(out + 8 * j)));
    }
  } else if (stream && mask == nullptr) {
    for (size_t j = 0; j < whole; ++j) _mm256_stream_ps(out + 8 * j, decoded8(signs[j], p));
  } else if (stream) {
    for (size_t j = 0; j < whole; ++j)
      _mm256_stream_ps(out + 8 * j, decoded8(signs[j], mask[j], p));
  } else {
    for (size_t j = 0; j < whole; ++j) {
      _mm256_storeu_ps(out + 8 * j, mask ? decoded8(signs[j], mask[j], p) : decoded8(signs[j], p));
    }
  }
  if (stream) _mm_sfence();
  return whole;
}

#else

void encode_block(const float*, float*, size_t, float, double&, size_t&, uint8_t*, uint8_t*) {}
void encode_block_kept(const float*, uint16_t*, size_t, float, double&, size_t&, uint8_t*,
                       uint8_t*) {}
void reduce_encode_block(const float*, float, const uint8_t* const*, const uint8_t* const*,
                         const float*, size_t, size_t, uint16_t*, float, double&, size_t&, uint8_t*,
                         uint8_t*) {}
size_t settled_kept_whole(const uint16_t*, size_t, float, float*) {
  return 0;
}
void settle_block(float*, size_t, float) {}
size_t decode_whole(const uint8_t*, const uint8_t*, size_t, float, bool, float*) {
  return 0;
}

#endif

}  // namespace pyring::onebit_avx2
