// A Link to a peer on the same host through shared-memory slot rings.
//
// Bytes to the peer go into the inbox for this rank inside the peer's segment; bytes from the
// peer arrive in the inbox for the peer inside this rank's segment. Each published or released
// slot wakes the other side if it sleeps on its `sleeping` futex word.
//
// Where a slot's data starts moves from lap to lap of the ring (rotation()): a store to a
// line the receiver's cache still holds from the last lap must first take it back across
// cores, and on the development VM that made copying 64 KiB into a slot 4x slower than
// copying it into lines the receiver no longer holds. With the rotation a run of equal
// messages spreads over the whole ring (by default 8 slots of 256 KiB: twice a core's L2).
#pragma once

#include <deque>
#include <memory>

#include "core/queued_link.h"
#include "transport/shm/shm_segment.h"
#include "transport/shm/stream_copy.h"

namespace pyring {

class ShmLink final : public QueuedLink {
 public:
  ShmLink(int peer, uint32_t my_local, uint32_t peer_local, std::shared_ptr<ShmSegment> mine,
          std::shared_ptr<ShmSegment> theirs, ShmCopy copy);

  const char* kind() const override { return "shm"; }
  std::atomic<uint32_t>* sleep_word() override { return &mine_->header()->sleeping; }
  void check_peer() override;
  void announce_closed() override;

 private:
  // Lap k / nslots of slot sequence number k starts its data (k / nslots % kLaps) steps of
  // slot_bytes / kLaps (a multiple of kRotateAlign; none in slots below kLaps * kRotateAlign)
  // into the slot.
  static constexpr size_t kLaps = 8;
  static constexpr size_t kRotateAlign = 4096;
  size_t rotation(uint64_t k) const;
  // Where slot k's `len` bytes start: at the rotation where they fit behind it, else at 0. The
  // sender starts at 0 only for data that does not fit behind the rotation, so both sides
  // agree from k and len alone.
  size_t data_start(uint64_t k, size_t len) const;
  bool progress_send() override;
  bool progress_recv() override;
  void before_progress() override;
  void abort_transport() override;
  void wake_peer();

  std::shared_ptr<ShmSegment> mine_;
  std::shared_ptr<ShmSegment> theirs_;
  InboxControl* out_;  // in the peer's segment
  InboxControl* in_;   // in this rank's segment
  uint32_t my_local_;
  uint32_t peer_local_;
  uint32_t nslots_;
  uint64_t slot_bytes_;
  size_t rotate_step_;
  uint64_t head_ = 0;       // next slot to publish to the peer
  uint64_t tail_seen_ = 0;  // last observed peer tail
  uint64_t tail_ = 0;       // next slot to read from the peer
  uint64_t head_seen_ = 0;  // last observed peer head
  size_t slot_offset_ = 0;  // bytes of slot tail_ already consumed
  SlotCopier copier_;
};

// True while process `pid` runs (not a zombie). Same pid namespace assumed.
bool process_alive(int pid);

// Throws PeerLost when rank `peer` gave up on the link whose inbox here is `in`, and CommError
// when it (owner of the segment with header `h`) closed its communicator or its process died.
void check_link_peer(int peer, const InboxControl* in, const SegmentHeader* h);
// Marks this rank's segment `mine` closed (Link::announce_closed) and wakes the owner of
// `theirs` if it sleeps.
void announce_segment_closed(SegmentHeader* mine, SegmentHeader* theirs);

}  // namespace pyring
