// Scratch memory of one collective at a time, taken by bump allocation: pinned host memory or
// device memory of one device (device/runtime.h), or plain host memory (no device).
//
// Pointers from take() stay valid until the next reset(). A call that outgrows the block gets
// a new block beside it; reset() then frees the blocks and allocates one of their total size,
// so that a call of a size seen before allocates nothing and takes no page faults. Used by one
// thread at a time (the thread running the collective).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/types.h"

namespace pyring {

class DeviceRuntime;

// The alignment of every scratch and staging region: enough for any vector load and for the
// device's copies.
constexpr size_t kScratchAlign = 256;
inline size_t scratch_aligned(size_t n) {
  return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

class ScratchArena {
 public:
  enum class Kind { kHost, kPinned, kDevice };
  // kHost needs no runtime (rt null, index ignored). `retire`, when given, takes the blocks
  // reset() replaces instead of freeing them (DeviceQueue::retire: never free device memory on
  // the thread running collectives); the destructor frees the rest itself.
  ScratchArena(Kind kind, DeviceRuntime* rt, int index,
               std::function<void(uint8_t*)> retire = nullptr);
  // The caller makes sure no queued copy or kernel still uses the memory.
  ~ScratchArena();
  ScratchArena(const ScratchArena&) = delete;
  ScratchArena& operator=(const ScratchArena&) = delete;

  // `bytes` of memory aligned to 256 bytes, valid until reset().
  uint8_t* take(size_t bytes);
  // Ends the current call's use. The caller makes sure no queued copy or kernel still uses
  // what take() returned (a device stream has drained).
  void reset();
  // Memory held, for stats.
  size_t capacity() const;

 private:
  struct Block {
    uint8_t* p;
    size_t bytes;
  };
  uint8_t* allocate(size_t bytes);
  void release(uint8_t* p, size_t bytes) noexcept;

  Kind kind_;
  DeviceRuntime* rt_;
  int index_;
  std::function<void(uint8_t*)> retire_;
  std::vector<Block> blocks_;  // blocks_[0] is the merged block of earlier calls
  size_t used_ = 0;            // in the last block
};

}  // namespace pyring
