// float16 and bfloat16 storage types with round-to-nearest-even conversion from float. Every
// function is PYRING_HD: the CPU kernels and the CUDA kernels share them, so the CPU tests
// cover the arithmetic of both.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PYRING_HD __host__ __device__ __forceinline__
#else
#define PYRING_HD inline
#endif

namespace pyring {

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

PYRING_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
PYRING_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

PYRING_HD float to_float(BFloat16 h) {
  return bits_to_float(static_cast<uint32_t>(h.bits) << 16);
}

// Branch-free, so that host loops over it vectorize: NaN stays a quiet NaN.
PYRING_HD BFloat16 to_bfloat16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return BFloat16{static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded)};
}

PYRING_HD float to_float(Half h) {
  uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    float v = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

PYRING_HD Half to_half(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return Half{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow: inf
  if (abs < 0x38800000u) {
    // Subnormal or zero: scale so that the half ulp (2^-24) becomes 1, round to nearest even.
    float a = bits_to_float(abs) * 16777216.0f;
    uint32_t q = static_cast<uint32_t>(a);
    float rem = a - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return Half{static_cast<uint16_t>(sign | q)};
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return Half{static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
}

}  // namespace pyring
