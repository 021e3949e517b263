#include "core/scratch_arena.h"

#include <algorithm>
#include <utility>

#include "core/errors.h"
#include "core/host_memory.h"
#include "device/runtime.h"

namespace pyring {

ScratchArena::ScratchArena(Kind kind, DeviceRuntime* rt, int index,
                           std::function<void(uint8_t*)> retire)
    : kind_(kind), rt_(rt), index_(index), retire_(std::move(retire)) {
  PYRING_CHECK_ARG(kind == Kind::kHost || rt != nullptr, "a device scratch arena needs a runtime");
}

ScratchArena::~ScratchArena() {
  for (const Block& b : blocks_) release(b.p, b.bytes);
}

uint8_t* ScratchArena::allocate(size_t bytes) {
  void* p = nullptr;
  switch (kind_) {
    case Kind::kHost:
      p = host_alloc(bytes);
      break;
    case Kind::kPinned:
      p = rt_->alloc_host(index_, bytes);
      break;
    case Kind::kDevice:
      p = device_alloc(*rt_, index_, bytes);
      break;
  }
  return static_cast<uint8_t*>(p);
}

void ScratchArena::release(uint8_t* p, size_t bytes) noexcept {
  switch (kind_) {
    case Kind::kHost:
      host_free(p, bytes);
      break;
    case Kind::kPinned:
      rt_->free_host(index_, p);
      break;
    case Kind::kDevice:
      device_free(*rt_, index_, p);
      break;
  }
}

uint8_t* ScratchArena::take(size_t bytes) {
  const size_t need = scratch_aligned(bytes == 0 ? 1 : bytes);
  if (blocks_.empty() || used_ + need > blocks_.back().bytes) {
    // A new block for the rest of this call: at least as large as the last one.
    const size_t size = blocks_.empty() ? need : std::max(need, blocks_.back().bytes);
    blocks_.push_back(Block{allocate(size), size});
    used_ = 0;
  }
  uint8_t* p = blocks_.back().p + used_;
  used_ += need;
  return p;
}

void ScratchArena::reset() {
  if (blocks_.size() > 1) {
    size_t total = 0;
    for (const Block& b : blocks_) total += b.bytes;
    for (const Block& b : blocks_) retire_ ? retire_(b.p) : release(b.p, b.bytes);
    blocks_.clear();
    blocks_.push_back(Block{allocate(total), total});
  }
  used_ = 0;
}

size_t ScratchArena::capacity() const {
  size_t total = 0;
  for (const Block& b : blocks_) total += b.bytes;
  return total;
}

}  // namespace pyring
