// A Link to a peer over one authenticated, non-blocking TCP connection.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "core/queued_link.h"
#include "core/types.h"

namespace pyring {

// The most bytes a blocked receiver of a slow link waits for before poll() wakes it
// (SO_RCVLOWAT): a wake-up per packet, tens of thousands a second, would keep a core busy.
constexpr size_t kWakeBytes = 64 << 10;

// The longest expected wait worth polling for: a wake-up from poll() costs tens of
// microseconds (about 40 on the machines measured), so polling longer than a few of them
// trades a core for little latency.
constexpr double kSpinForUs = 100;

// A posted send: `done` of its `bytes` are handed to the kernel.
using TcpSend = LinkSend;

// Hands the front of `queue` to the non-blocking socket `fd` (several messages per sendmsg)
// until it would block or the queue is empty, popping what is done; returns the bytes sent.
// Throws PeerLost (closed or reset by the peer) or CommError naming `peer` and its address
// `host` (kept by the link: a socket the kernel has failed no longer has a peer name).
size_t tcp_send_queued(int fd, int peer, const std::string& host, std::deque<TcpSend>& queue);
// Reads at most `n` bytes into `buf`; returns how many, 0 when nothing is there. Throws as
// tcp_send_queued, also when the peer closed the connection.
size_t tcp_recv_some(int fd, int peer, const std::string& host, uint8_t* buf, size_t n);

class TcpLink final : public QueuedLink {
 public:
  // Takes ownership of the connected socket `fd`. Pieces of receives without copy_to are
  // delivered in `staging_bytes` units (a multiple of kPieceAlign).
  TcpLink(int peer, int fd, size_t staging_bytes);
  ~TcpLink() override;

  const char* kind() const override { return "tcp"; }
  void post_recv(RecvSpec spec) override;
  int poll_fd() const override { return fd_; }
  bool wants_write() const override { return !sends_.empty(); }
  size_t connections() const override { return 1; }
  void check_peer() override {}
  void announce_closed() override;
  // True while the front receive's next piece is expected within spin_us and kSpinForUs,
  // judged by how recent bytes arrived (reads needed times the time between reads), or when
  // nothing is being received.
  bool spin_worthwhile(int spin_us) override;

 private:
  bool progress_send() override;
  bool progress_recv() override;  // recvs_: `received` bytes read from the socket (>= done)
  std::string where() const override { return " at " + host_; }
  void abort_transport() override;
  // Bytes the front receive needs before it can deliver its next piece (0: none posted).
  size_t to_next_piece() const;
  // Sets SO_RCVLOWAT to `bytes` (at least 1) unless it is already.
  void wake_at(size_t bytes);

  int fd_;
  std::string host_;  // the peer's address, for errors
  std::vector<uint8_t> staging_;
  size_t staged_ = 0;
  // How bytes arrive, smoothed over recent reads: the time from the previous read (or from
  // posting a receive to an empty queue) to a read, and the bytes a read returns. 0 until
  // the first read.
  double gap_us_ = 0;
  double per_read_ = 0;
  Clock::time_point since_{};
  size_t wake_bytes_ = 1;  // the socket's SO_RCVLOWAT
};

}  // namespace pyring
