#include "transport/shm/stream_copy.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#include <x86intrin.h>
#endif

namespace pyring {

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

void fence_nontemporal() {
  _mm_sfence();
}
#else
void copy_nontemporal(uint8_t* dst, const uint8_t* src, size_t n) {
  std::memcpy(dst, src, n);
}
void fence_nontemporal() {}
#endif

namespace {
#if defined(__x86_64__)
void copy_with(uint8_t* dst, const uint8_t* src, size_t n, bool streaming) {
  if (streaming) {
    copy_nontemporal(dst, src, n);
    _mm_sfence();
  } else {
    std::memcpy(dst, src, n);
  }
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

uint64_t SlotCopier::Samples::median() const {
  uint64_t sorted[kSamples];
  std::copy(ticks, ticks + kSamples, sorted);
  std::nth_element(sorted, sorted + kSamples / 2, sorted + kSamples);
  return sorted[kSamples / 2];
}

bool SlotCopier::pick_streaming() {
  ++count_;
  if (cost_[1].n < kSamples) return count_ % 2 == 0;
  far_ = cost_[1].median() * 2 < cost_[0].median();
  return count_ % kExploreEvery == 0 ? !far_ : far_;
}

bool SlotCopier::copy_large(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  if (mode_ != ShmCopy::kAuto || n < timed_from_) {
    const bool streaming = mode_ == ShmCopy::kAuto ? far_ : mode_ == ShmCopy::kStreaming;
    copy_with(dst, src, n, streaming);
    return streaming;
  }
  const bool streaming = pick_streaming();
  const uint64_t t0 = __rdtsc();
  copy_with(dst, src, n, streaming);
  Samples& s = cost_[streaming];
  s.ticks[s.n++ % kSamples] = (__rdtsc() - t0) * 1024 / n;
  return streaming;
#else
  std::memcpy(dst, src, n);
  return false;
#endif
}

}  // namespace pyring
