#include "transport/cuda_ipc/ipc_link.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <thread>

#include "core/errors.h"
#include "transport/shm/shm_link.h"

namespace pyring {

size_t inbox_index(const std::vector<int>& senders, int rank) {
  auto it = std::find(senders.begin(), senders.end(), rank);
  return it == senders.end() ? kNoInbox : static_cast<size_t>(it - senders.begin());
}

IpcState::IpcState(Device device_, uint32_t local_world_, std::vector<int> senders_,
                   uint32_t nslots_, size_t slot_bytes_, const std::string& control_label)
    : device(device_),
      rt(device_runtime(device_.kind)),
      local_world(local_world_),
      senders(std::move(senders_)),
      nslots(nslots_),
      slot_bytes(slot_bytes_),
      control_file(control_label) {
  PYRING_CHECK_ARG(slot_bytes > 0 && slot_bytes % kPieceAlign == 0 && slot_bytes <= UINT32_MAX,
                   "cuda_ipc slot size ", slot_bytes, " must be a positive multiple of ",
                   kPieceAlign, " below 4 GiB");
  PYRING_CHECK_ARG(!senders.empty(), "cuda_ipc needs at least one sender to give an inbox to");
  rt.require_stream_flags(device.index);
  region = static_cast<uint8_t*>(device_alloc(rt, device.index, inbox_offset(senders.size(), 0)));
  try {
    handle = rt.ipc_handle(device.index, region);
    control = ShmSegment::create(control_file, local_world, nslots, kIpcControlSlotBytes);
  } catch (...) {
    device_free(rt, device.index, region);
    throw;
  }
}

IpcState::~IpcState() {
  if (!control) {
    device_free(rt, device.index, region);
    return;
  }
  int holder = 0;
  if (importers_gone(kIpcUnmapWait, &holder)) {
    device_free(rt, device.index, region);
    return;
  }
  std::fprintf(stderr,
               "[pyring WARN] cuda_ipc: process %d still maps this rank's device region on %s "
               "after %lld s; it stays allocated (%zu bytes) rather than be reused under that "
               "process's copies\n",
               holder, device.str().c_str(), static_cast<long long>(kIpcUnmapWait.count()),
               inbox_offset(senders.size(), 0));
}

bool IpcState::importers_gone(std::chrono::milliseconds wait, int* holder) const {
  const Clock::time_point until = Clock::now() + wait;
  for (;;) {
    *holder = 0;
    for (uint32_t i = 0; i < local_world; ++i) {
      const int32_t pid = control->inbox_control(i)->importer.load(std::memory_order_acquire);
      if (pid != 0 && process_alive(pid)) *holder = pid;
    }
    if (*holder == 0) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

IpcLink::IpcLink(int peer, uint32_t my_local, uint32_t peer_local, std::shared_ptr<IpcState> mine,
                 std::shared_ptr<ShmSegment> theirs_control, uint8_t* theirs_region,
                 size_t send_inbox, size_t recv_inbox, IpcStream stream)
    : QueuedLink(peer),
      mine_(std::move(mine)),
      theirs_control_(std::move(theirs_control)),
      theirs_region_(theirs_region),
      stream_(std::move(stream)),
      out_(theirs_control_->inbox_control(my_local)),
      in_(mine_->control->inbox_control(peer_local)),
      my_local_(my_local),
      peer_local_(peer_local),
      send_inbox_(send_inbox),
      recv_inbox_(recv_inbox) {
  flags_ = static_cast<Flag*>(mine_->rt.alloc_host(index(), 2 * sizeof(Flag)));
  new (&flags_[0]) Flag(0);
  new (&flags_[1]) Flag(0);
  const char* prefix = std::getenv("PYRING_IPC_TRACE");
  if (prefix && *prefix) {
    trace_path_ = str_cat(prefix, ".", getpid(), ".", my_local_, "-", peer_local_, ".csv");
  }
  if (theirs_region_) out_->importer.store(static_cast<int32_t>(getpid()));
}

IpcLink::~IpcLink() {
  try {
    mine_->rt.synchronize(index(), stream_.stream);
  } catch (const std::exception&) {  // the device failed: nothing more will touch the flags
  }
  write_trace();
  if (theirs_region_) {
    mine_->rt.ipc_close(index(), theirs_region_);
    out_->importer.store(0);  // no copy of this link writes the peer's region any more
  }
  mine_->rt.free_host(index(), flags_);
}

void IpcLink::note(char event, uint64_t slot_seq, uint32_t bytes) {
  if (trace_path_.empty() || trace_.size() >= kIpcTraceEvents) return;
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  trace_.push_back(TracePoint{ns, event, static_cast<uint32_t>(slot_seq), bytes});
}

void IpcLink::write_trace() const noexcept {
  if (trace_path_.empty()) return;
  std::FILE* f = std::fopen(trace_path_.c_str(), "w");
  if (!f) return;  // a trace is a diagnostic: a path that cannot be written loses only it
  std::fputs("ns,event,slot,bytes\n", f);
  for (const TracePoint& t : trace_) {
    std::fprintf(f, "%lld,%c,%u,%u\n", static_cast<long long>(t.ns), t.event, t.slot, t.bytes);
  }
  std::fclose(f);
}

void IpcLink::post_send(const uint8_t* data, size_t bytes) {
  PYRING_CHECK(send_inbox_ != kNoInbox, CommError, "cuda_ipc: rank ", peer_,
               " gave this rank no inbox (device links carry data to the ring's right "
               "neighbour alone)");
  QueuedLink::post_send(data, bytes);
}

void IpcLink::post_recv(RecvSpec spec) {
  PYRING_CHECK(recv_inbox_ != kNoInbox, CommError, "cuda_ipc: this rank gave rank ", peer_,
               " no inbox (device links carry data from the ring's left neighbour alone)");
  QueuedLink::post_recv(std::move(spec));
}

bool IpcLink::progress_send() {
  bool moved = false;
  if (!copying_.empty()) {
    const uint64_t copied = flags_[0].load(std::memory_order_acquire);
    while (!copying_.empty() && copying_.front().value <= copied) {
      out_->lens[copying_.front().slot] = copying_.front().len;
      note('p', published_, copying_.front().len);
      copying_.pop_front();
      ++published_;
      moved = true;
    }
    if (moved) out_->head.store(published_, std::memory_order_seq_cst);
  }
  const size_t slot_bytes = mine_->slot_bytes;
  while (!sends_.empty()) {
    if (head_ - tail_seen_ >= mine_->nslots) {
      tail_seen_ = out_->tail.load(std::memory_order_acquire);
      if (head_ - tail_seen_ >= mine_->nslots) break;
    }
    const uint32_t slot = static_cast<uint32_t>(head_ % mine_->nslots);
    LinkSend& s = sends_.front();
    const size_t n = std::min(slot_bytes, s.bytes - s.done);
    mine_->rt.copy_async(index(), theirs_region_ + mine_->inbox_offset(send_inbox_, slot),
                         s.data + s.done, n, stream_.stream);
    mine_->rt.write_flag(index(), stream_.stream, &flags_[0], ++copies_queued_);
    copying_.push_back({copies_queued_, slot, static_cast<uint32_t>(n)});
    note('q', head_, static_cast<uint32_t>(n));
    ++head_;
    s.done += n;
    count_sent(n);
    if (s.done == s.bytes) sends_.pop_front();
    moved = true;
  }
  return moved;
}

bool IpcLink::progress_recv() {
  bool moved = false;
  if (!reading_.empty()) {
    const uint64_t read = flags_[1].load(std::memory_order_acquire);
    bool released = false;
    while (!reading_.empty() && reading_.front() <= read) {
      reading_.pop_front();
      note('f', released_, 0);
      ++released_;
      released = true;
    }
    if (released) in_->tail.store(released_, std::memory_order_seq_cst);
  }
  while (!recvs_.empty()) {
    if (tail_ == head_seen_) {
      head_seen_ = in_->head.load(std::memory_order_acquire);
      if (tail_ == head_seen_) break;
    }
    LinkRecv& r = recvs_.front();
    const uint32_t slot = static_cast<uint32_t>(tail_ % mine_->nslots);
    const size_t len = in_->lens[slot];
    PYRING_CHECK(len <= mine_->slot_bytes && len > slot_offset_, CommError,
                 "cuda_ipc stream from rank ", peer_, " is corrupt (slot of ", len, " bytes)");
    const size_t n = std::min(len - slot_offset_, r.spec.bytes - r.done);
    const uint8_t* src = mine_->region + mine_->inbox_offset(recv_inbox_, slot) + slot_offset_;
    if (r.spec.copy_to) {
      mine_->rt.copy_async(index(), r.spec.copy_to + r.done, src, n, stream_.stream);
      src = r.spec.copy_to + r.done;
    }
    if (r.spec.on_piece) r.spec.on_piece(src, r.done, n);
    r.done += n;
    count_received(n);
    slot_offset_ += n;
    moved = true;
    if (slot_offset_ == len) {
      // The slot is free once the work queued on it so far (copy, kernels) has run.
      note('r', tail_, static_cast<uint32_t>(len));
      slot_offset_ = 0;
      ++tail_;
      mine_->rt.write_flag(index(), stream_.stream, &flags_[1], ++reads_queued_);
      reading_.push_back(reads_queued_);
    }
    if (r.done == r.spec.bytes) recvs_.pop_front();
  }
  return moved;
}

void IpcLink::before_progress() {
  if (in_->sender_aborted.load(std::memory_order_relaxed) != 0) check_peer();
}

void IpcLink::after_idle_progress() {
  if (!copying_.empty() || !reading_.empty()) check_device();
}

void IpcLink::check_device() {
  const Clock::time_point now = Clock::now();
  if (now < next_device_check_) return;
  next_device_check_ = now + kDeviceCheckEvery;
  const std::string err = mine_->rt.stream_error(index(), stream_.stream);
  PYRING_CHECK(err.empty(), DeviceFault, mine_->device.str(), " stopped on ", err,
               " while the cuda_ipc link to rank ", peer_, " waited for its copies");
}

void IpcLink::check_peer() {
  check_link_peer(peer_, in_, theirs_control_->header());
}

void IpcLink::announce_closed() {
  announce_segment_closed(mine_->control->header(), theirs_control_->header());
}

void IpcLink::abort_transport() {
  out_->sender_aborted.store(1, std::memory_order_seq_cst);
}

}  // namespace pyring
