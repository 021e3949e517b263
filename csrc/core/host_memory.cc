#include "core/host_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/errors.h"
#include "core/scratch_arena.h"

namespace pyring {

uint8_t* host_alloc(size_t bytes) {
  if (bytes >= kMappedBytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    PYRING_CHECK(p != MAP_FAILED, Error, "out of host memory for ", bytes,
                 " bytes: mmap failed: ", std::strerror(errno));
    return static_cast<uint8_t*>(p);
  }
  void* p = std::aligned_alloc(kScratchAlign, scratch_aligned(bytes == 0 ? 1 : bytes));
  PYRING_CHECK(p != nullptr, Error, "out of host memory for ", bytes, " bytes");
  return static_cast<uint8_t*>(p);
}

void host_free(uint8_t* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes >= kMappedBytes) {
    munmap(p, bytes);
  } else {
    std::free(p);
  }
}

uint8_t* HostBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_ && p_ != nullptr) return p_;
  uint8_t* p = host_alloc(bytes);
  host_free(p_, bytes_);
  p_ = p;
  bytes_ = bytes;
  return p_;
}

}  // namespace pyring
