// A Link that carries device memory to a process of the same host, several on one GPU included.
//
// Each rank registers, once at init, a device receive region with one inbox of `nslots` slots
// per sender (DeviceSetup::senders: the ring's left neighbour alone), and publishes its IPC
// handle with the list of senders; a link carries data only the way an inbox was given for
// (a send or receive the other way is refused with CommError); the slot ring's control (head, tail,
// slot lengths) lives in a small shared-memory segment of the receiver, read and written only by
// the two progress threads (host code; no kernel ever spins on another process's flag).
// - Send: a slot the receiver released is filled by a device copy, queued on the link's
//   stream (the device queue's), into the receiver's inbox; once the stream raises this link's
//   "copied" flag the slot is published (head).
// - Receive: a published slot is handed to on_piece as device memory (the caller queues its
//   kernels on the same stream) or copied to copy_to; once the stream raises the "read" flag
//   behind that work, the slot is released (tail).
// Pieces are cut at slot boundaries (multiples of kPieceAlign bytes), one message per slot.
//
// With PYRING_IPC_TRACE=PREFIX each link notes when each slot's copy was queued ('q') and
// published ('p'), and when each slot from the peer was handed on ('r') and released ('f'),
// in steady-clock nanoseconds (one clock for every process of the host), and writes them when
// it closes to PREFIX.<pid>.<my local rank>-<peer's>.csv ("ns,event,slot,bytes"); at most
// kIpcTraceEvents per link.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/queued_link.h"
#include "core/types.h"
#include "device/runtime.h"
#include "transport/shm/shm_segment.h"

namespace pyring {

// The control segment's slot size: its slots are never used, only their lengths and counters.
constexpr uint64_t kIpcControlSlotBytes = 8;
// How long a closing rank waits for its senders to unmap its region before leaving it allocated.
constexpr std::chrono::seconds kIpcUnmapWait{10};
constexpr size_t kIpcTraceEvents = 1 << 20;

// This rank's resources for the transport, made before the rendezvous (Transport::prepare).
// The region is freed only once no sender maps it (each sender's link clears its inbox's
// `importer` after its stream has drained and it has unmapped the region) or every sender that
// does is dead; a sender still mapping it after kIpcUnmapWait leaves it allocated, with a
// warning: freed memory that a peer's queued copies still write would corrupt what reuses it.
struct IpcState {
  IpcState(Device device, uint32_t local_world, std::vector<int> senders, uint32_t nslots,
           size_t slot_bytes, const std::string& control_label);
  ~IpcState();
  // Whether every sender has unmapped the region or died, waiting up to `wait`; the pid of
  // one that has not in *holder.
  bool importers_gone(std::chrono::milliseconds wait, int* holder) const;
  IpcState(const IpcState&) = delete;
  IpcState& operator=(const IpcState&) = delete;

  // The offset in the region of inbox `inbox` (an index into senders), slot `slot`.
  size_t inbox_offset(size_t inbox, uint32_t slot) const {
    return (inbox * nslots + slot) * slot_bytes;
  }

  Device device;
  DeviceRuntime& rt;
  uint32_t local_world;
  std::vector<int> senders;  // global ranks, one inbox each, in this order
  uint32_t nslots;
  size_t slot_bytes;
  uint8_t* region = nullptr;  // device memory: one inbox of nslots slots per sender
  IpcHandle handle;
  SharedFile control_file;  // the control segment's memory; closed at Transport::release
  std::shared_ptr<ShmSegment> control;  // nslots lengths, head and tail per inbox
};

// The stream and its owner the link queues its copies on.
struct IpcStream {
  StreamId stream = 0;
  std::shared_ptr<void> owner;  // keeps the stream alive while the link is
};

// The index of `rank` in `senders`, or kNoInbox.
constexpr size_t kNoInbox = SIZE_MAX;
size_t inbox_index(const std::vector<int>& senders, int rank);

class IpcLink final : public QueuedLink {
 public:
  // theirs_region: the peer's region, opened by ipc_open (closed by the destructor), or null
  // where send_inbox is kNoInbox.
  // send_inbox: this rank's inbox in the peer's region; recv_inbox: the peer's in this rank's
  // (kNoInbox: the link carries nothing that way).
  IpcLink(int peer, uint32_t my_local, uint32_t peer_local, std::shared_ptr<IpcState> mine,
          std::shared_ptr<ShmSegment> theirs_control, uint8_t* theirs_region, size_t send_inbox,
          size_t recv_inbox, IpcStream stream);
  // Waits for the stream, then unmaps the peer's region (and says so in its inbox's
  // `importer`) and frees the flags.
  ~IpcLink() override;

  const char* kind() const override { return "cuda_ipc"; }
  void post_send(const uint8_t* data, size_t bytes) override;
  void post_recv(RecvSpec spec) override;
  void check_peer() override;
  void announce_closed() override;

 private:
  struct Copy {  // a slot whose copy is queued, published once copied_ reaches `value`
    uint64_t value;
    uint32_t slot;
    uint32_t len;
  };
  struct TracePoint {
    int64_t ns;
    char event;
    uint32_t slot;
    uint32_t bytes;
  };
  bool progress_send() override;
  bool progress_recv() override;
  void before_progress() override;
  void after_idle_progress() override;
  size_t in_flight() const override { return copying_.size(); }  // slots being copied
  std::string where() const override { return " on " + mine_->device.str(); }
  void abort_transport() override;
  // Throws DeviceFault when this link's stream has stopped on a fault (its flags never rise
  // again); asks the device at most once per kDeviceCheckEvery.
  void check_device();
  static constexpr std::chrono::microseconds kDeviceCheckEvery{200};
  void note(char event, uint64_t slot_seq, uint32_t bytes);
  void write_trace() const noexcept;
  int index() const { return mine_->device.index; }

  std::shared_ptr<IpcState> mine_;
  std::shared_ptr<ShmSegment> theirs_control_;
  uint8_t* theirs_region_;
  IpcStream stream_;
  InboxControl* out_;  // in the peer's control segment
  InboxControl* in_;   // in this rank's
  uint32_t my_local_;
  uint32_t peer_local_;
  size_t send_inbox_;
  size_t recv_inbox_;
  Flag* flags_ = nullptr;  // [0] copied: copies into the peer's slots; [1] read: this rank's reads
  uint64_t copies_queued_ = 0;
  uint64_t reads_queued_ = 0;
  uint64_t head_ = 0;       // slots whose copy is queued
  uint64_t published_ = 0;  // slots published to the peer
  uint64_t tail_seen_ = 0;  // last observed peer tail
  uint64_t tail_ = 0;       // next slot to read from the peer
  uint64_t head_seen_ = 0;  // last observed peer head
  uint64_t released_ = 0;   // slots released to the peer
  size_t slot_offset_ = 0;  // bytes of slot tail_ already handed on
  std::deque<Copy> copying_;
  std::deque<uint64_t> reading_;  // read-flag values after which the next slots are free
  Clock::time_point next_device_check_{};
  std::string trace_path_;  // empty: not tracing
  std::vector<TracePoint> trace_;
};

}  // namespace pyring
