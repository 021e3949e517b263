#include "device/sim/sim_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/errors.h"

namespace pyring {

void* SimArena::alloc(size_t bytes, const char* where) {
  const size_t len = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
  const bool dedicated = len >= kDedicatedBytes;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& a : arenas_) {
    if (a->dedicated != dedicated || (dedicated && a->bytes != len)) continue;
    for (auto it = a->free.begin(); it != a->free.end(); ++it) {
      if (it->second < len) continue;
      const size_t off = it->first, left = it->second - len;
      a->free.erase(it);
      if (left > 0) a->free[off + len] = left;
      live_[a->base + off] = {a.get(), len};
      allocated_ += len;
      return a->base + off;
    }
  }
  auto a = std::make_unique<Arena>();
  a->dedicated = dedicated;
  a->bytes = dedicated ? len : kArenaBytes;
  a->fd = memfd_create("pyring-sim", MFD_CLOEXEC);
  PYRING_CHECK(a->fd >= 0, CudaError, "sim alloc on ", where,
               ": memfd_create: ", std::strerror(errno));
  void* base = MAP_FAILED;
  void* shadow = MAP_FAILED;
  if (ftruncate(a->fd, static_cast<off_t>(a->bytes)) == 0) {
    base = mmap(nullptr, a->bytes, PROT_NONE, MAP_SHARED, a->fd, 0);
    shadow = mmap(nullptr, a->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
  }
  if (base == MAP_FAILED || shadow == MAP_FAILED) {
    const int err = errno;
    if (base != MAP_FAILED) munmap(base, a->bytes);
    if (shadow != MAP_FAILED) munmap(shadow, a->bytes);
    ::close(a->fd);
    PYRING_THROW(CudaError, "sim alloc of ", bytes, " bytes on ", where, ": ", std::strerror(err));
  }
  a->base = static_cast<uint8_t*>(base);
  a->shadow = static_cast<uint8_t*>(shadow);
  by_base_[a->base] = a.get();
  if (a->bytes > len) a->free[len] = a->bytes - len;
  live_[a->base] = {a.get(), len};
  allocated_ += len;
  arenas_.push_back(std::move(a));
  return base;
}

void SimArena::free(void* p, bool unmap) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(static_cast<const uint8_t*>(p));
  if (it == live_.end()) return;
  Arena* a = it->second.first;
  size_t off = static_cast<size_t>(it->first - a->base), len = it->second.second;
  allocated_ -= len;
  live_.erase(it);
  if (a->dedicated && unmap) {
    // Truncated first: every mapping of the file, in any process, faults from here on. Where
    // truncating fails the file is only closed: nothing reuses it, and a late write is lost.
    const int truncated = ftruncate(a->fd, 0);
    static_cast<void>(truncated);
    munmap(a->base, a->bytes);
    munmap(a->shadow, a->bytes);
    ::close(a->fd);
    by_base_.erase(a->base);
    for (auto at = arenas_.begin(); at != arenas_.end(); ++at) {
      if (at->get() == a) {
        arenas_.erase(at);
        break;
      }
    }
    return;
  }
  auto next = a->free.lower_bound(off);
  if (next != a->free.end() && next->first == off + len) {
    len += next->second;
    next = a->free.erase(next);
  }
  if (next != a->free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      a->free.erase(prev);
    }
  }
  a->free[off] = len;
}

SimArenaRef SimArena::find(const void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto* q = static_cast<const uint8_t*>(p);
  auto it = live_.upper_bound(q);
  if (it == live_.begin()) return {};
  --it;
  if (q >= it->first + it->second.second) return {};
  const Arena* a = it->second.first;
  return SimArenaRef{a->fd, a->bytes, static_cast<size_t>(q - a->base)};
}

uint8_t* SimArena::host_view(const void* p) {
  const auto* q = static_cast<const uint8_t*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_base_.upper_bound(q);
  if (it == by_base_.begin()) return nullptr;
  --it;
  const Arena* a = it->second;
  if (q >= a->base + a->bytes) return nullptr;
  return a->shadow + (q - a->base);
}

size_t SimArena::allocated_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

}  // namespace pyring
