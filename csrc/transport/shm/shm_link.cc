#include "transport/shm/shm_link.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/errors.h"

namespace pyring {

namespace {
void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}
}  // namespace

bool process_alive(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');
  if (!close_paren || close_paren[1] == '\0') return true;
  char state = close_paren[2];
  return state != 'Z' && state != 'X';
}

ShmLink::ShmLink(int peer, uint32_t my_local, uint32_t peer_local, std::shared_ptr<ShmSegment> mine,
                 std::shared_ptr<ShmSegment> theirs, ShmCopy copy)
    : QueuedLink(peer),
      mine_(std::move(mine)),
      theirs_(std::move(theirs)),
      out_(theirs_->inbox_control(my_local)),
      in_(mine_->inbox_control(peer_local)),
      my_local_(my_local),
      peer_local_(peer_local),
      nslots_(mine_->header()->nslots),
      slot_bytes_(mine_->header()->slot_bytes),
      rotate_step_((slot_bytes_ / kLaps) / kRotateAlign * kRotateAlign),
      copier_(copy, slot_bytes_) {}

size_t ShmLink::rotation(uint64_t k) const {
  return static_cast<size_t>((k / nslots_) % kLaps) * rotate_step_;
}

size_t ShmLink::data_start(uint64_t k, size_t len) const {
  const size_t rot = rotation(k);
  return len <= slot_bytes_ - rot ? rot : 0;
}

void ShmLink::wake_peer() {
  auto& sleeping = theirs_->header()->sleeping;
  if (sleeping.load(std::memory_order_seq_cst) != 0 && sleeping.exchange(0) != 0) {
    futex_wake_all(&sleeping);
  }
}

bool ShmLink::progress_send() {
  bool moved = false;
  while (!sends_.empty()) {
    if (head_ - tail_seen_ >= nslots_) {
      tail_seen_ = out_->tail.load(std::memory_order_acquire);
      if (head_ - tail_seen_ >= nslots_) break;
    }
    uint32_t slot = static_cast<uint32_t>(head_ % nslots_);
    // Where the first send's rest would start: at 0 only where it does not fit behind the
    // rotation, so that what is packed behind it (never past cap) starts there too.
    const LinkSend& first = sends_.front();
    const size_t start = data_start(head_, first.bytes - first.done);
    const size_t cap = slot_bytes_ - start;
    uint8_t* dst = theirs_->inbox_slot(my_local_, slot) + start;
    // Small messages share a slot (a header and the data behind it), starting at multiples of
    // kPieceAlign so that every message's pieces stay whole elements.
    size_t fill = 0;
    do {
      LinkSend& s = sends_.front();
      size_t n = std::min<size_t>(cap - fill, s.bytes - s.done);
      if (copier_.copy(dst + fill, s.data + s.done, n)) count_streamed(n);
      fill += n;
      s.done += n;
      if (s.done < s.bytes) break;
      sends_.pop_front();
    } while (!sends_.empty() && fill % kPieceAlign == 0 && fill < cap);
    out_->lens[slot] = static_cast<uint32_t>(fill);
    ++head_;
    out_->head.store(head_, std::memory_order_seq_cst);
    wake_peer();
    count_sent(fill);
    moved = true;
  }
  return moved;
}

bool ShmLink::progress_recv() {
  bool moved = false;
  while (!recvs_.empty()) {
    if (tail_ == head_seen_) {
      head_seen_ = in_->head.load(std::memory_order_acquire);
      if (tail_ == head_seen_) break;
    }
    LinkRecv& r = recvs_.front();
    uint32_t slot = static_cast<uint32_t>(tail_ % nslots_);
    size_t len = in_->lens[slot];
    PYRING_CHECK(len <= slot_bytes_ && len > slot_offset_, CommError, "shm stream from rank ",
                 peer_, " is corrupt (slot of ", len, " bytes)");
    size_t n = std::min(len - slot_offset_, r.spec.bytes - r.done);
    const uint8_t* src =
        mine_->inbox_slot(peer_local_, slot) + data_start(tail_, len) + slot_offset_;
    if (r.spec.copy_to) {
      std::memcpy(r.spec.copy_to + r.done, src, n);
      src = r.spec.copy_to + r.done;
    }
    if (r.spec.on_piece) r.spec.on_piece(src, r.done, n);
    r.done += n;
    count_received(n);
    slot_offset_ += n;
    moved = true;
    if (slot_offset_ == len) {
      slot_offset_ = 0;
      ++tail_;
      in_->tail.store(tail_, std::memory_order_seq_cst);
      wake_peer();
    }
    if (r.done == r.spec.bytes) recvs_.pop_front();
  }
  return moved;
}

void ShmLink::before_progress() {
  if (in_->sender_aborted.load(std::memory_order_relaxed) != 0) check_peer();
}

void check_link_peer(int peer, const InboxControl* in, const SegmentHeader* h) {
  if (in->sender_aborted.load(std::memory_order_acquire) != 0) {
    throw PeerLost(peer, str_cat("rank ", peer, " gave up on the communicator"), true);
  }
  PYRING_CHECK(h->closed.load(std::memory_order_acquire) == 0, CommError, "rank ", peer,
               " closed its communicator");
  PYRING_CHECK(process_alive(h->pid), CommError, "rank ", peer, " (pid ", h->pid, ") died");
}

void announce_segment_closed(SegmentHeader* mine, SegmentHeader* theirs) {
  mine->closed.store(1, std::memory_order_seq_cst);
  theirs->sleeping.store(0, std::memory_order_seq_cst);
  futex_wake_all(&theirs->sleeping);
}

void ShmLink::check_peer() {
  check_link_peer(peer_, in_, theirs_->header());
}

void ShmLink::announce_closed() {
  announce_segment_closed(mine_->header(), theirs_->header());
}

void ShmLink::abort_transport() {
  out_->sender_aborted.store(1, std::memory_order_seq_cst);
  theirs_->header()->sleeping.store(0, std::memory_order_seq_cst);
  futex_wake_all(&theirs_->header()->sleeping);
}

}  // namespace pyring
