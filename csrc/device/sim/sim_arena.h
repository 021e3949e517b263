// The sim device's memory: shared-memory files (memfd) of at least kArenaBytes each, carved
// first-fit into allocations. Freed memory stays mapped until the process exits (as a real
// device's would stay addressable), so a copy queued before a free never faults.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace pyring {

struct SimArenaRef {
  int fd = -1;  // the arena's file, open for the process's lifetime
  size_t arena_bytes = 0;
  size_t offset = 0;  // of the address inside the arena
};

class SimArena {
 public:
  static constexpr size_t kArenaBytes = 64 << 20;
  static constexpr size_t kAlign = 256;

  // Throws CudaError when no file can be made or mapped.
  void* alloc(size_t bytes, const char* where);
  void free(void* p);
  // The arena holding `p` (any address inside an allocation); fd -1 when none does.
  SimArenaRef find(const void* p);
  size_t allocated_bytes();

 private:
  struct Arena {
    uint8_t* base = nullptr;
    size_t bytes = 0;
    int fd = -1;
    std::map<size_t, size_t> free;  // offset -> bytes, coalesced
  };
  std::mutex mu_;
  std::vector<std::unique_ptr<Arena>> arenas_;                // guarded by mu_
  std::map<const uint8_t*, std::pair<Arena*, size_t>> live_;  // address -> (arena, bytes)
  size_t allocated_ = 0;                                      // guarded by mu_
};

}  // namespace pyring
