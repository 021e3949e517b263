#include "core/single_copy.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <random>

namespace pyring {

namespace {

uint64_t make_key() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 0x9e3779b97f4a7c15ULL;
}

// Read by peers through process_vm_readv; never written after start-up.
const uint64_t g_key = make_key();

}  // namespace

SingleCopyDesc describe_single_copy(const void* data, size_t bytes) {
  return SingleCopyDesc{g_key, reinterpret_cast<uint64_t>(&g_key), reinterpret_cast<uint64_t>(data),
                        bytes, static_cast<int32_t>(getpid()),     0};
}

bool read_single_copy(const SingleCopyDesc& desc, void* out) {
  // The kernel caps one call near 2 GiB; the key travels with the first piece.
  constexpr size_t kPiece = size_t{1} << 30;
  uint64_t key = 0;
  auto* dst = static_cast<uint8_t*>(out);
  size_t done = 0;
  do {
    const size_t n = std::min(kPiece, static_cast<size_t>(desc.bytes) - done);
    iovec local[2] = {{&key, sizeof(key)}, {dst + done, n}};
    iovec remote[2] = {{reinterpret_cast<void*>(desc.key_addr), sizeof(key)},
                       {reinterpret_cast<void*>(desc.addr + done), n}};
    const int first = done == 0 ? 0 : 1;  // later pieces skip the key
    const ssize_t want = static_cast<ssize_t>(n + (first == 0 ? sizeof(key) : 0));
    if (process_vm_readv(desc.pid, local + first, 2 - first, remote + first, 2 - first, 0) !=
        want) {
      return false;
    }
    if (key != desc.key) return false;
    done += n;
  } while (done < desc.bytes);
  return true;
}

}  // namespace pyring
