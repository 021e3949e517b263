// The sim device's memory: shared-memory files (memfd). Allocations below kDedicatedBytes are
// carved first-fit from files of kArenaBytes; larger ones get a file of their own. Memory freed
// by free(p, false) (a caching allocator's stream-ordered free) stays mapped, and a large one's
// file is kept for an allocation of the same size, so a copy queued before such a free never
// faults. free(p, true) (cudaFree, after the device has drained) unmaps a large allocation and
// truncates its file: a late access from this process or from one that opened it through an
// IPC handle faults (SIGSEGV here, SIGBUS there) instead of landing in reused memory.
//
// Device addresses are not host addresses: each file is mapped twice, once with no access (the
// addresses alloc hands out, so that host code reading device memory faults, as on a GPU) and
// once readable and writable (host_view: what the sim's streams run their operations on).
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
  static constexpr size_t kDedicatedBytes = 1 << 20;

  // Throws CudaError when no file can be made or mapped.
  void* alloc(size_t bytes, const char* where);
  void free(void* p, bool unmap);
  // Where the sim's own operations reach device address `p` (any address inside an arena);
  // null when `p` is not sim device memory of this process.
  uint8_t* host_view(const void* p);
  // The arena holding `p` (any address inside an allocation); fd -1 when none does.
  SimArenaRef find(const void* p);
  size_t allocated_bytes();

 private:
  struct Arena {
    uint8_t* base = nullptr;    // the device addresses: no access
    uint8_t* shadow = nullptr;  // the same file, readable and writable
    size_t bytes = 0;
    int fd = -1;
    bool dedicated = false;         // one allocation's own file (kDedicatedBytes or more)
    std::map<size_t, size_t> free;  // offset -> bytes, coalesced
  };
  std::mutex mu_;
  std::vector<std::unique_ptr<Arena>> arenas_;                // guarded by mu_
  std::map<const uint8_t*, Arena*> by_base_;                  // guarded by mu_
  std::map<const uint8_t*, std::pair<Arena*, size_t>> live_;  // address -> (arena, bytes)
  size_t allocated_ = 0;                                      // guarded by mu_
};

}  // namespace pyring
