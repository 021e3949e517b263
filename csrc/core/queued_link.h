// The generic half of a Link (core/link.h): the queues of posted sends and receives in posting
// order (a zero-byte message is a no-op), whether anything is queued, the abort state, the
// account of what is left for timeout messages, and progress(): refused once aborted, the
// peer's state checked, then the transport's send and receive steps. A transport keeps only
// what moves bytes: progress_send() on the front of sends_, progress_recv() on the front of
// recvs_.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "core/link.h"

namespace pyring {

// A posted send: `done` of its `bytes` handed on.
struct LinkSend {
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  size_t done = 0;
};

// A posted receive: `done` bytes delivered to on_piece / copy_to; `received` bytes read ahead
// of them where the transport reads before it delivers (tcp), else unused.
struct LinkRecv {
  RecvSpec spec;
  size_t done = 0;
  size_t received = 0;
};

class QueuedLink : public Link {
 public:
  using Link::Link;

  void post_send(const uint8_t* data, size_t bytes) override;
  void post_recv(RecvSpec spec) override;
  bool progress() override;
  bool idle() const override { return !sending() && recvs_.empty(); }
  bool sending() const override { return !sends_.empty() || in_flight() > 0; }
  std::string pending() const override;
  // Later calls on this link fail; then abort_transport() tells the peer.
  void abort() override;

 protected:
  // Move what they can without blocking; true if any byte moved.
  virtual bool progress_send() = 0;
  virtual bool progress_recv() = 0;
  // Before each progress: throws when the peer is known to have given up.
  virtual void before_progress() {}
  // After a progress that moved nothing: throws when what is awaited cannot come (a device
  // fault).
  virtual void after_idle_progress() {}
  // Sends handed on but not yet done with their memory (cuda_ipc: slots being copied).
  virtual size_t in_flight() const { return 0; }
  // Where the peer is, for pending(): " at HOST", " on DEVICE", or "".
  virtual std::string where() const { return ""; }
  virtual void abort_transport() {}

  std::deque<LinkSend> sends_;
  std::deque<LinkRecv> recvs_;
  bool aborted_ = false;
};

}  // namespace pyring
