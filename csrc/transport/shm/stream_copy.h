#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace pyring {

// Copies n bytes with non-temporal stores (whole lines written without being read first; off
// x86-64, memcpy). The caller fences (_mm_sfence) before publishing them to another thread.
void copy_nontemporal(uint8_t* dst, const uint8_t* src, size_t n);
// Orders the non-temporal stores before the stores that follow (x86-64: sfence).
void fence_nontemporal();

// How a rank copies its sends into a peer's shm slots; the bindings export the names in code
// order (pyring._C.SHM_COPY_NAMES).
enum class ShmCopy : int { kAuto = 0, kCached = 1, kStreaming = 2 };
constexpr int kNumShmCopies = 3;
const char* shm_copy_name(ShmCopy c);

// Copies into memory that another process reads next (a peer's shm slot).
//
// kCached is memcpy. kStreaming uses non-temporal stores, which write whole lines without
// reading them first. memcpy is faster while the reader's core shares a cache with the writer
// (the slot stays in cache for the reader). When it does not (a virtual machine whose vCPUs the
// host has put on different core complexes), every cached store must first take its line back
// from the reader's cache across the fabric, and memcpy runs several times slower.
//
// The placement changes while a job runs, so kAuto measures the copies of kTimedBytes and
// more (or that fill a slot):
// - the first 2 * kSamples alternate between the methods;
// - a method's cost is the median ticks per KiB of its last kSamples copies (a copy the
//   scheduler interrupted does not count), a streaming copy timed up to its store fence;
// - streaming is used while it costs under half of memcpy, because the writer's clock does not
//   see that the reader then reads from memory instead of a cache;
// - the method not in use is retried every kExploreEvery-th copy.
// Copies from kMinBytes to kTimedBytes take the timed copies' last choice (memcpy before
// there is one). Copies below kMinBytes, and every copy off x86-64, use memcpy.
//
// Mid-size copies (8-128 KiB) used to stream always: the shm link wrote each message at the
// start of its slot, so a run of equal messages kept storing into lines the reader held, and
// streaming was 1.7x (8 KiB) to 3.4x (64 KiB) faster with the cores far. Since the link
// rotates where a slot's data starts (shm_link.h), memcpy into a slot finds lines the reader
// no longer holds: with the cores near, a 2-rank 64 KiB allreduce took 5.3 us with memcpy and
// 10.8 us streaming; with the cores far, streaming is still the faster by 3x and more, which
// the timed copies see (memcpy then costs the writer several times more).
class SlotCopier {
 public:
  static constexpr size_t kMinBytes = 4 * 1024;
  static constexpr size_t kTimedBytes = 8 * 1024;
  static constexpr uint32_t kExploreEvery = 64;
  static constexpr uint32_t kSamples = 5;

  SlotCopier(ShmCopy mode, size_t slot_bytes)
      : mode_(mode), timed_from_(slot_bytes < kTimedBytes ? slot_bytes : kTimedBytes) {}
  // Returns true when the copy used non-temporal stores. Either way, the copied bytes are
  // ordered before every store that follows (the publication of the slot).
  bool copy(uint8_t* dst, const uint8_t* src, size_t n) {
    if (n < kMinBytes) {
      std::memcpy(dst, src, n);
      return false;
    }
    return copy_large(dst, src, n);
  }

 private:
  bool copy_large(uint8_t* dst, const uint8_t* src, size_t n);
  bool pick_streaming();  // kAuto, a timed copy

  // Timestamp-counter ticks per KiB of a method's last kSamples copies.
  struct Samples {
    uint64_t ticks[kSamples] = {};
    uint32_t n = 0;  // samples taken
    uint64_t median() const;
  };

  ShmCopy mode_;
  size_t timed_from_;  // kAuto times copies of this size and more
  Samples cost_[2];    // {memcpy, non-temporal}
  uint32_t count_ = 0;
  bool far_ = false;  // the timed copies' last choice, before exploration
};

}  // namespace pyring
