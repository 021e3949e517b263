#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace pyring {

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
// The placement changes while a job runs, so kAuto measures copies of kTimedBytes and more:
// - the first 2 * kSamples alternate between the methods;
// - a method's cost is the median ticks per KiB of its last kSamples copies (a copy the
//   scheduler interrupted does not count), a streaming copy timed up to its store fence;
// - streaming is used while it costs under half of memcpy, because the writer's clock does not
//   see that the reader then reads from memory instead of a cache;
// - the method not in use is retried every kExploreEvery-th copy.
// Copies from kMinBytes to kTimedBytes take the timed copies' last choice (memcpy before
// there is one): timed alone, they would favour streaming even when the cores are near.
// Copies below kMinBytes, and every copy off x86-64, use memcpy.
class SlotCopier {
 public:
  static constexpr size_t kMinBytes = 4 * 1024;
  static constexpr size_t kTimedBytes = 128 * 1024;
  static constexpr uint32_t kExploreEvery = 64;
  static constexpr uint32_t kSamples = 5;

  explicit SlotCopier(ShmCopy mode) : mode_(mode) {}
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
  bool pick_streaming();  // kAuto, a copy of kTimedBytes or more

  // Timestamp-counter ticks per KiB of a method's last kSamples copies.
  struct Samples {
    uint64_t ticks[kSamples] = {};
    uint32_t n = 0;  // samples taken
    uint64_t median() const;
  };

  ShmCopy mode_;
  Samples cost_[2];  // {memcpy, non-temporal}
  uint32_t count_ = 0;
  bool far_ = false;  // the timed copies' last choice, before exploration
};

}  // namespace pyring
