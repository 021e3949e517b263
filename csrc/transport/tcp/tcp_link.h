// A Link to a peer over one authenticated, non-blocking TCP connection.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "core/link.h"

namespace pyring {

// A posted send: `done` of its `bytes` are handed to the kernel.
struct TcpSend {
  const uint8_t* data;
  size_t bytes;
  size_t done;
};

// Hands the front of `queue` to the non-blocking socket `fd` (several messages per sendmsg)
// until it would block or the queue is empty, popping what is done; returns the bytes sent.
// Throws PeerLost (closed or reset by the peer) or CommError naming `peer`.
size_t tcp_send_queued(int fd, int peer, std::deque<TcpSend>& queue);
// Reads at most `n` bytes into `buf`; returns how many, 0 when nothing is there. Throws as
// tcp_send_queued, also when the peer closed the connection.
size_t tcp_recv_some(int fd, int peer, uint8_t* buf, size_t n);

class TcpLink : public Link {
 public:
  // Takes ownership of the connected socket `fd`. Pieces of receives without copy_to are
  // delivered in `staging_bytes` units (a multiple of kPieceAlign).
  TcpLink(int peer, int fd, size_t staging_bytes);
  ~TcpLink() override;

  const char* kind() const override { return "tcp"; }
  void post_send(const uint8_t* data, size_t bytes) override;
  void post_recv(RecvSpec spec) override;
  bool progress() override;
  bool idle() const override { return sends_.empty() && recvs_.empty(); }
  bool sending() const override { return !sends_.empty(); }
  std::string pending() const override;
  int poll_fd() const override { return fd_; }
  bool wants_write() const override { return !sends_.empty(); }
  size_t connections() const override { return 1; }
  void check_peer() override {}
  void abort() override;

 private:
  struct Recv {
    RecvSpec spec;
    size_t done;      // bytes delivered to on_piece / copy_to
    size_t received;  // bytes read from the socket (>= done)
  };
  bool progress_send();
  bool progress_recv();

  int fd_;
  std::string host_;  // the peer's address, for errors
  std::vector<uint8_t> staging_;
  size_t staged_ = 0;
  std::deque<TcpSend> sends_;
  std::deque<Recv> recvs_;
  bool aborted_ = false;
};

}  // namespace pyring
