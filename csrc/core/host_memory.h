// Host memory for buffers of message size that pyring allocates on its own threads (scratch,
// held point-to-point messages).
//
// Contract: host_alloc(bytes) returns memory aligned to kScratchAlign, or throws Error when the
// system has none; host_free(p, bytes) takes the same `bytes`. Allocations of kMappedBytes or
// more are pages mapped for them alone and given back to the system when freed. Smaller ones
// come from malloc. glibc trims only its main arena's top, so a large buffer freed on a
// progress thread would otherwise keep its pages resident in that thread's arena, and resident
// memory would grow with whichever thread happened to run the largest call.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyring {

constexpr size_t kMappedBytes = size_t{256} << 10;

uint8_t* host_alloc(size_t bytes);
void host_free(uint8_t* p, size_t bytes) noexcept;

// One host_alloc'd buffer, owned. reserve() keeps the contents only when it need not grow.
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes) { reserve(bytes); }
  ~HostBuffer() { host_free(p_, bytes_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  // At least `bytes` of memory (contents unspecified after growing).
  uint8_t* reserve(size_t bytes);
  uint8_t* data() const { return p_; }
  size_t capacity() const { return bytes_; }

 private:
  uint8_t* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace pyring
