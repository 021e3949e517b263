// One rank's shared-memory segment: a header, then one inbox per local rank.
//
// Inbox i of rank r's segment carries bytes from local rank i to rank r as a ring of slots;
// the sender owns `head` and the slot contents, the receiver owns `tail`. The segment lives in
// an unnamed shared file of its rank (core/shared_file.h: nothing is left in /dev/shm however
// the ranks end), attached by its local peers through the file's address while the rank holds
// it. Both map it populated, so that no collective takes the page faults of a first write.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/shared_file.h"

namespace pyring {

constexpr uint32_t kMaxSlots = 64;

struct SegmentHeader {
  uint64_t magic;
  uint32_t local_world;
  uint32_t nslots;
  uint64_t slot_bytes;
  int32_t pid;
  // 1 while this rank's collective thread sleeps on it (futex word); peers reset it and wake.
  alignas(64) std::atomic<uint32_t> sleeping;
  // Non-zero once this rank closed its communicator, after everything it sent was published.
  alignas(64) std::atomic<uint32_t> closed;
};

// The lengths of the first 14 slots share head's cache line, so a receiver that sees a new
// head has the slot's length without another transfer between cores.
struct InboxControl {
  alignas(64) std::atomic<uint64_t> head;  // slots published by the sender
  uint32_t lens[kMaxSlots];                // bytes used in each slot, written before head
  alignas(64) std::atomic<uint64_t> tail;  // slots released by the receiver
  // Non-zero once the sender gave up on this link (ShmLink::abort): its other links stay up,
  // so that a rank whose link to one dead peer broke still reaches the others.
  std::atomic<uint32_t> sender_aborted;
  // cuda_ipc: the pid of the sender's process while it maps the receiver's device region
  // through this inbox (0: not mapped); the receiver frees the region only once it is 0, or
  // that process is dead (IpcState).
  std::atomic<int32_t> importer;
};

class ShmSegment {
 public:
  // Sizes `file` for the geometry, maps it and lays out the header; local peers attach by
  // file.id() while the file is open. Throws InvalidArgument for a bad geometry, CommError
  // where the memory cannot be had.
  static std::shared_ptr<ShmSegment> create(SharedFile& file, uint32_t local_world, uint32_t nslots,
                                            uint64_t slot_bytes);
  // Maps local rank `peer`'s segment at `address` (SharedFileId::str) and checks its geometry.
  static std::shared_ptr<ShmSegment> attach(int peer, const std::string& address,
                                            uint32_t local_world, uint32_t nslots,
                                            uint64_t slot_bytes);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base_); }
  InboxControl* inbox_control(uint32_t from) const;
  uint8_t* inbox_slot(uint32_t from, uint32_t slot) const;

  static size_t size_for(uint32_t local_world, uint32_t nslots, uint64_t slot_bytes);

 private:
  ShmSegment(void* base, size_t size);
  size_t inbox_stride() const;

  void* base_;
  size_t size_;
};

}  // namespace pyring
