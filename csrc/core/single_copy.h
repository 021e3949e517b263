// Single-copy transfers between processes of one host: the receiver reads the sender's buffer
// straight into its own (process_vm_readv), instead of both copying through a shared segment.
//
// Contract:
// - A SingleCopyDesc names a buffer of the calling process; it stays valid while that buffer
//   does. It carries the process's pid and a random per-process key with the key's address.
// - read_single_copy() reads the key and the buffer from the named process in one call and
//   succeeds only when all bytes were read and the key matches: a pid that names another
//   process (another pid namespace, a reused pid), a kernel or sandbox that forbids the call,
//   or a short read all return false, and `out` then holds unspecified bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyring {

struct SingleCopyDesc {
  uint64_t key;
  uint64_t key_addr;
  uint64_t addr;
  uint64_t bytes;
  int32_t pid;
  uint32_t reserved;
};
static_assert(sizeof(SingleCopyDesc) == 40, "SingleCopyDesc travels between processes");

SingleCopyDesc describe_single_copy(const void* data, size_t bytes);
// Reads desc.bytes bytes into `out`; see the contract for false.
bool read_single_copy(const SingleCopyDesc& desc, void* out);

}  // namespace pyring
