#include "kernels/onebit.h"

#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pyring {

namespace {

// Packs the sign and zero bits of v[0, 8) into one byte each.
inline void pack8(const float* v, uint8_t* sign, uint8_t* zero) {
#if defined(__SSE2__)
  const __m128 a = _mm_loadu_ps(v), b = _mm_loadu_ps(v + 4), z = _mm_setzero_ps();
  // movemask reads the sign bit: -0.0 counts as negative, but its zero bit wins on decode.
  *sign = static_cast<uint8_t>(_mm_movemask_ps(a) | (_mm_movemask_ps(b) << 4));
  *zero = static_cast<uint8_t>(_mm_movemask_ps(_mm_cmpeq_ps(a, z)) |
                               (_mm_movemask_ps(_mm_cmpeq_ps(b, z)) << 4));
#else
  uint8_t s = 0, zr = 0;
  for (int k = 0; k < 8; ++k) {
    s |= static_cast<uint8_t>(std::signbit(v[k]) ? 1u << k : 0u);
    zr |= static_cast<uint8_t>(v[k] == 0.0f ? 1u << k : 0u);
  }
  *sign = s;
  *zero = zr;
#endif
}

inline float decode_one(uint8_t sign, uint8_t zero, int k, float scale) {
  if ((zero >> k) & 1u) return 0.0f;
  return ((sign >> k) & 1u) ? -scale : scale;
}

constexpr size_t kBlock = 4096;  // values per sweep: 16 KiB of float32 stays in L1/L2

}  // namespace

size_t onebit_bytes(const uint8_t* encoded, size_t n) {
  OnebitHeader h;
  std::memcpy(&h, encoded, sizeof(h));
  return sizeof(OnebitHeader) + (h.has_zeros ? 2 : 1) * ((n + 7) / 8);
}

size_t onebit_encode(const float* in, float* residual, size_t n, uint8_t* out) {
  // Sweep 1, block by block: v = in + residual (kept in residual), sum of squares, zeros.
  double sumsq = 0.0;
  size_t zeros = 0;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = b + kBlock < n ? b + kBlock : n;
    float acc = 0.0f;
    size_t z = 0;
    if (residual) {
      for (size_t i = b; i < e; ++i) {
        const float v = in[i] + residual[i];
        residual[i] = v;
        acc += v * v;
        z += v == 0.0f;
      }
    } else {
      for (size_t i = b; i < e; ++i) {
        acc += in[i] * in[i];
        z += in[i] == 0.0f;
      }
    }
    sumsq += acc;
    zeros += z;
  }
  const float* v = residual ? residual : in;
  const size_t nonzero = n - zeros;
  const float scale = nonzero ? static_cast<float>(std::sqrt(sumsq / double(nonzero))) : 0.0f;
  OnebitHeader h{scale, zeros ? 1u : 0u};
  std::memcpy(out, &h, sizeof(h));
  uint8_t* signs = out + sizeof(OnebitHeader);
  uint8_t* mask = signs + (n + 7) / 8;
  // Sweep 2: sign pack, zero mask and new residual = v - decode(v).
  const size_t whole = n / 8;
  for (size_t j = 0; j < whole; ++j) {
    const float* p = v + 8 * j;
    uint8_t s, zr;
    pack8(p, &s, &zr);
    signs[j] = s;
    if (zeros) mask[j] = zr;
    if (residual) {
      float* r = residual + 8 * j;
      for (int k = 0; k < 8; ++k) r[k] = p[k] - decode_one(s, zr, k, scale);
    }
  }
  if (n % 8) {
    float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const size_t left = n % 8;
    std::memcpy(tail, v + 8 * whole, left * sizeof(float));
    uint8_t s, zr;
    pack8(tail, &s, &zr);
    const uint8_t keep = static_cast<uint8_t>((1u << left) - 1u);
    signs[whole] = s & keep;
    if (zeros) mask[whole] = zr & keep;
    if (residual) {
      for (size_t k = 0; k < left; ++k) {
        residual[8 * whole + k] = tail[k] - decode_one(s, zr, static_cast<int>(k), scale);
      }
    }
  }
  return onebit_bytes(out, n);
}

void onebit_decode(const uint8_t* encoded, size_t n, float alpha, bool accumulate, float* out) {
  OnebitHeader h;
  std::memcpy(&h, encoded, sizeof(h));
  const uint8_t* signs = encoded + sizeof(OnebitHeader);
  const uint8_t* mask = h.has_zeros ? signs + (n + 7) / 8 : nullptr;
  const float pos = alpha * h.scale;
  for (size_t j = 0; j * 8 < n; ++j) {
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
