#include "kernels/wire_cast.h"

#include "core/errors.h"
#include "kernels/half.h"
#include "kernels/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pyring {

namespace {

template <class From, class To, class Fn>
void cast_typed(const void* in, void* out, size_t n, Fn fn) {
  const auto* src = static_cast<const From*>(in);
  auto* dst = static_cast<To*>(out);
  for (size_t i = 0; i < n; ++i) dst[i] = fn(src[i]);
}

#if defined(__x86_64__)

// to_half (kernels/half.h) on eight lanes with the same integer and float steps, so the same
// bits (the compiler leaves the scalar form's branches unvectorized). Returns the lanes done.
__attribute__((target("avx2"))) size_t to_half_avx2(const float* in, Half* out, size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000));
    const __m256i abs = _mm256_and_si256(u, abs_mask);
    // Normal: round to nearest even at bit 13, rebias.
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(abs, 13), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(abs, _mm256_set1_epi32(0xfff)), odd);
    __m256i r = _mm256_srli_epi32(_mm256_sub_epi32(rounded, _mm256_set1_epi32(0x38000000)), 13);
    // Subnormal or zero: abs * 2^24, truncated, rounded to nearest even by the remainder.
    const __m256 a = _mm256_mul_ps(_mm256_castsi256_ps(abs), _mm256_set1_ps(16777216.0f));
    __m256i q = _mm256_cvttps_epi32(a);
    const __m256 rem = _mm256_sub_ps(a, _mm256_cvtepi32_ps(q));
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256 q_odd = _mm256_castsi256_ps(
        _mm256_cmpeq_epi32(_mm256_and_si256(q, _mm256_set1_epi32(1)), _mm256_set1_epi32(1)));
    const __m256 up = _mm256_or_ps(_mm256_cmp_ps(rem, half, _CMP_GT_OQ),
                                   _mm256_and_ps(_mm256_cmp_ps(rem, half, _CMP_EQ_OQ), q_odd));
    q = _mm256_sub_epi32(q, _mm256_castps_si256(up));  // up is -1 where set
    const __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x38800000), abs);
    r = _mm256_blendv_epi8(r, q, sub);
    const __m256i inf = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x477ff000 - 1));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7c00), inf);
    const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7e00), nan);
    r = _mm256_or_si256(r, sign);
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
  }
  return i;
}

// to_float(Half) on eight lanes, the same bits. Returns the lanes done.
__attribute__((target("avx2"))) size_t from_half_avx2(const Half* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16);
    const __m256i exp = _mm256_and_si256(_mm256_srli_epi32(h, 10), _mm256_set1_epi32(0x1f));
    const __m256i man = _mm256_and_si256(h, _mm256_set1_epi32(0x3ff));
    const __m256i man13 = _mm256_slli_epi32(man, 13);
    __m256i r = _mm256_or_si256(
        _mm256_slli_epi32(_mm256_add_epi32(exp, _mm256_set1_epi32(112)), 23), man13);
    const __m256i special = _mm256_or_si256(_mm256_set1_epi32(0x7f800000), man13);
    r = _mm256_blendv_epi8(r, special, _mm256_cmpeq_epi32(exp, _mm256_set1_epi32(0x1f)));
    // Subnormal or zero: man * 2^-24, exact.
    const __m256 small = _mm256_mul_ps(_mm256_cvtepi32_ps(man), _mm256_set1_ps(1.0f / 16777216.0f));
    r = _mm256_blendv_epi8(r, _mm256_castps_si256(small),
                           _mm256_cmpeq_epi32(exp, _mm256_setzero_si256()));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_or_si256(r, sign));
  }
  return i;
}

#else

size_t to_half_avx2(const float*, Half*, size_t) {
  return 0;
}
size_t from_half_avx2(const Half*, float*, size_t) {
  return 0;
}

#endif

}  // namespace

bool is_wire_cast(DType from, DType to) {
  const bool narrow = to == DType::kFloat16 || to == DType::kBFloat16;
  const bool widen = from == DType::kFloat16 || from == DType::kBFloat16;
  return (from == DType::kFloat32 && narrow) || (widen && to == DType::kFloat32);
}

void check_wire_cast(const char* fn, DType from, DType to) {
  PYRING_CHECK_ARG(is_wire_cast(from, to), fn, ": no cast from ", dtype_name(from), " to ",
                   dtype_name(to), " (the wire casts are float32 <-> float16/bfloat16)");
}

void wire_cast(DType from, DType to, const void* in, void* out, size_t n) {
  check_wire_cast("wire_cast", from, to);
  if (from == DType::kFloat32 && to == DType::kFloat16) {
    const size_t done =
        host_avx2() ? to_half_avx2(static_cast<const float*>(in), static_cast<Half*>(out), n) : 0;
    return cast_typed<float, Half>(static_cast<const float*>(in) + done,
                                   static_cast<Half*>(out) + done, n - done,
                                   [](float f) { return to_half(f); });
  }
  if (from == DType::kFloat32 && to == DType::kBFloat16) {
    return cast_typed<float, BFloat16>(in, out, n, [](float f) { return to_bfloat16(f); });
  }
  if (from == DType::kFloat16 && to == DType::kFloat32) {
    const size_t done =
        host_avx2() ? from_half_avx2(static_cast<const Half*>(in), static_cast<float*>(out), n) : 0;
    return cast_typed<Half, float>(static_cast<const Half*>(in) + done,
                                   static_cast<float*>(out) + done, n - done,
                                   [](Half h) { return to_float(h); });
  }
  if (from == DType::kBFloat16 && to == DType::kFloat32) {
    return cast_typed<BFloat16, float>(in, out, n, [](BFloat16 h) { return to_float(h); });
  }
}

}  // namespace pyring
