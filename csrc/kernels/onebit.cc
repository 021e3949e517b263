#include "kernels/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/errors.h"
#include "kernels/elementwise.h"
#include "kernels/onebit_avx2.h"
#include "kernels/onebit_blocks.h"
#include "kernels/simd.h"

namespace pyring {

using onebit_blocks::decode_span;
using onebit_blocks::encode_block;
using onebit_blocks::encode_block_kept;
using onebit_blocks::kBlock;
using onebit_blocks::settle_block;

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

// Writes the header of a segment of n values with the sweeps' figures; returns it.
OnebitHeader header_of(double sumsq, size_t zeros, size_t n) {
  const size_t nonzero = n - zeros;
  const float scale = nonzero ? static_cast<float>(std::sqrt(sumsq / double(nonzero))) : 0.0f;
  return OnebitHeader{scale, zeros ? kMaskFollows : kNoZeros, 0u, static_cast<uint32_t>(n)};
}

}  // namespace

void onebit_settled_copy(const uint16_t* residual, size_t n, float pending, float* out) {
  const size_t done = host_avx2() ? onebit_avx2::settled_kept_whole(residual, n, pending, out) : 0;
  for (size_t i = done; i < n; ++i) {
    out[i] = onebit_settled(onebit_kept_value(residual[i]), pending);
  }
}

size_t onebit_encode_deferred(const float* in, uint16_t* residual, float* pending, size_t n,
                              uint8_t* out, uint8_t* cache) {
  PYRING_CHECK_ARG((residual == nullptr) == (pending == nullptr),
                   "onebit_encode_deferred: a kept residual goes with its pending scale");
  // One sweep, block by block: the signs and zero bits do not depend on the scale, and the
  // residual keeps v until the scale is known (the next call).
  const float was = residual ? *pending : 0.0f;
  double sumsq = 0.0;
  size_t zeros = 0;
  uint8_t* signs = out + sizeof(OnebitHeader);
  uint8_t* mask = signs + (n + 7) / 8;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = std::min(kBlock, n - b);
    if (residual) {
      encode_block_kept(in + b, residual + b, len, was, sumsq, zeros, signs + b / 8, mask + b / 8);
    } else {
      encode_block(in + b, nullptr, len, 0.0f, sumsq, zeros, signs + b / 8, mask + b / 8);
    }
  }
  const OnebitHeader h = header_of(sumsq, zeros, n);
  if (residual) *pending = h.scale;
  std::memcpy(out, &h, sizeof(h));
  return onebit_cache_encoded(out, n, cache);
}

size_t onebit_encode(const float* in, float* residual, size_t n, uint8_t* out, uint8_t* cache) {
  // The residual keeps v through the sweep, then becomes v - decode(v) once the scale is known.
  double sumsq = 0.0;
  size_t zeros = 0;
  uint8_t* signs = out + sizeof(OnebitHeader);
  uint8_t* mask = signs + (n + 7) / 8;
  for (size_t b = 0; b < n; b += kBlock) {
    encode_block(in + b, residual ? residual + b : nullptr, std::min(kBlock, n - b), 0.0f, sumsq,
                 zeros, signs + b / 8, mask + b / 8);
  }
  const OnebitHeader h = header_of(sumsq, zeros, n);
  if (residual && h.scale != 0.0f) settle_block(residual, n, h.scale);
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

size_t onebit_reduce_encode(const float* own, int divisor, const uint8_t* const* copies,
                            uint8_t* const* caches, size_t count, size_t n, uint16_t* residual,
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
  // L1), encoded as onebit_encode_deferred does with a kept residual; the AVX2 path keeps it
  // in registers.
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
    encode_block_kept(sum, residual + b, len, was, sumsq, zeros, out_signs + b / 8,
                      out_mask + b / 8);
  }
  const OnebitHeader h = header_of(sumsq, zeros, n);
  *pending = h.scale;
  std::memcpy(out, &h, sizeof(h));
  return onebit_cache_encoded(out, n, cache);
}

}  // namespace pyring
