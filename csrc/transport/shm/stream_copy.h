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
// The placement changes while a job runs, so kAuto measures the copies that fill a slot or
// reach kTimedBytes (the pieces of large messages):
// - the first 2 * kSamples alternate between the methods;
// - a method's cost is the median ticks per KiB of its last kSamples copies (a copy the
//   scheduler interrupted does not count), a streaming copy timed up to its store fence;
// - streaming is used while it costs under half of memcpy, because the writer's clock does not
//   see that the reader then reads from memory instead of a cache;
// - the method not in use is retried every kExploreEvery-th copy.
// Smaller copies from kStreamBytes up (whole mid-size messages) stream. Timed alone they
// cannot tell, because the reader's cost is what differs. On the development machine,
// interleaved 2-rank allreduces (bench/results/interleaved_midstream_{quiet,membw}_vm.json):
// - cores near: streaming cost 5-67% at 8 KiB, 10-20% at 16 KiB, nothing measurable at 64 KiB;
// - under the membw load (cores far): streaming was 1.7x (8 KiB) to 3.4x (64 KiB) faster.
// Copies from kMinBytes to kStreamBytes take the timed copies' last choice (memcpy before
// there is one). Copies below kMinBytes, and every copy off x86-64, use memcpy.
class SlotCopier {
 public:
  static constexpr size_t kMinBytes = 4 * 1024;
  static constexpr size_t kStreamBytes = 8 * 1024;
  static constexpr size_t kTimedBytes = 128 * 1024;
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
