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
// kCached is memcpy; kStreaming uses non-temporal stores, which write whole lines without
// reading them first. When the reader's core shares a cache with the writer, memcpy is faster
// (the slot stays in cache for the reader). When it does not (a virtual machine whose vCPUs the
// host has put on different core complexes), every cached store must first take the line back
// from the reader's cache across the fabric, and memcpy runs several times slower than
// non-temporal stores. The placement can change while a job runs, so kAuto measures: each
// method's cost per byte is a running average of timed copies; streaming is used while it
// costs less than half of memcpy, and the method not in use is retried every kExploreEvery-th
// copy. Copies below kMinBytes, and every copy off x86-64, use memcpy.
class SlotCopier {
 public:
  static constexpr size_t kMinBytes = 64 * 1024;
  static constexpr uint32_t kExploreEvery = 64;

  explicit SlotCopier(ShmCopy mode) : mode_(mode) {}
  // Returns true when the copy used non-temporal stores.
  bool copy(uint8_t* dst, const uint8_t* src, size_t n) {
    if (n < kMinBytes) {
      std::memcpy(dst, src, n);
      return false;
    }
    return copy_large(dst, src, n);
  }
  // Orders the copies before it ahead of the stores after it (the publication of the slot).
  static void fence();

 private:
  bool copy_large(uint8_t* dst, const uint8_t* src, size_t n);
  bool pick_streaming();

  ShmCopy mode_;
  uint64_t cost_[2] = {0, 0};  // timestamp ticks per KiB, running average; 0 = unmeasured
  uint32_t count_ = 0;
};

}  // namespace pyring
