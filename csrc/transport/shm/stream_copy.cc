#include "transport/shm/stream_copy.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#include <x86intrin.h>
#endif

namespace pyring {

namespace {
#if defined(__x86_64__)
void copy_nontemporal(uint8_t* dst, const uint8_t* src, size_t n) {
  size_t head = (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  size_t body = n / 64 * 64;
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + body, src + body, n - body);
}
#endif
}  // namespace

const char* shm_copy_name(ShmCopy c) {
  switch (c) {
    case ShmCopy::kAuto:
      return "auto";
    case ShmCopy::kCached:
      return "cached";
    case ShmCopy::kStreaming:
      return "streaming";
  }
  return "?";
}

bool SlotCopier::pick_streaming() {
  if (mode_ != ShmCopy::kAuto) return mode_ == ShmCopy::kStreaming;
  if (cost_[0] == 0 || cost_[1] == 0) return cost_[0] != 0;
  bool streaming = cost_[1] * 2 < cost_[0];
  if (++count_ % kExploreEvery == 0) streaming = !streaming;
  return streaming;
}

bool SlotCopier::copy_large(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  const bool streaming = pick_streaming();
  const uint64_t t0 = __rdtsc();
  if (streaming) {
    copy_nontemporal(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
  uint64_t per_kib = (__rdtsc() - t0) * 1024 / n + 1;
  uint64_t& c = cost_[streaming];
  // A copy the scheduler interrupted moves the average by at most 3/8 of itself.
  if (c != 0) per_kib = std::min(per_kib, 4 * c);
  c = c == 0 ? per_kib : c - c / 8 + per_kib / 8;
  return streaming;
#else
  std::memcpy(dst, src, n);
  return false;
#endif
}

void SlotCopier::fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace pyring
