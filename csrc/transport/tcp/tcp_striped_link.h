// A Link to a peer over several authenticated TCP connections (PYRING_SOCKET_NSTREAMS): for
// paths where one flow does not fill the link (per-flow rate limits, one NIC queue per flow).
//
// Each direction's byte stream is cut at every kStripeBytes of its offset (counted from the
// link's first byte), stripe i going on connection i % n. The cut depends on offsets alone,
// not on how either end splits the stream into messages, so a receive may gather what the peer
// sent as several messages (the ring forwards pieces of what it receives). Receives deliver
// their pieces in message order whatever order the connections land them in: a copy_to
// receive lands in place and delivers its contiguous prefix; another lands in a window of the
// link's (at least n stripes and the staging size long, at the message's undelivered start)
// and delivers it once full or at the message's end, so pieces keep kPieceAlign multiples. The
// connections are polled through one epoll descriptor.
#pragma once

#include <deque>
#include <exception>
#include <string>
#include <vector>

#include "core/link.h"
#include "transport/tcp/tcp_link.h"

namespace pyring {

// The unit of the round-robin over a link's connections.
constexpr size_t kStripeBytes = 64 * 1024;

class TcpStripedLink : public Link {
 public:
  // Takes ownership of the connected sockets `fds`, in stream order (the peer's order too).
  // A copy_to receive delivers pieces of at least `staging_bytes` (but the last); another, of
  // the window's length, max(staging_bytes, n * kStripeBytes) (but the last).
  TcpStripedLink(int peer, std::vector<int> fds, size_t staging_bytes);
  ~TcpStripedLink() override;

  const char* kind() const override { return "tcp"; }
  void post_send(const uint8_t* data, size_t bytes) override;
  void post_recv(RecvSpec spec) override;
  bool progress() override;
  bool idle() const override { return !sending() && recvs_.empty(); }
  bool sending() const override;
  std::string pending() const override;
  // The epoll descriptor: readable when a stream has bytes, or has room while it has bytes to
  // send (as of the last progress()).
  int poll_fd() const override { return epoll_fd_; }
  bool wants_write() const override { return sending(); }
  size_t connections() const override { return streams_.size(); }
  void abort() override;
  void announce_closed() override;

 private:
  struct Recv;
  // The bytes of one receive that travel on one connection: one stripe, or part of one.
  struct Part {
    Recv* recv;
    size_t offset;  // in the message
    size_t bytes;
    size_t landed;  // read from the socket
  };
  struct Recv {
    RecvSpec spec;
    std::deque<Part> parts;  // in message order
    size_t first_open = 0;   // parts before it have landed
    size_t delivered = 0;    // handed to on_piece
    // The landed prefix: bytes up to it have all been read.
    size_t prefix() const;
  };
  struct Stream {
    int fd;
    std::deque<TcpSend> sends;
    std::deque<Part*> recvs;  // its parts not yet landed, in order
    bool out_armed = false;
    // Why it stopped reading (the peer closed it, or it broke). Raised once its front part is
    // the link's first missing byte: what the other connections carried before it still
    // arrives.
    std::exception_ptr failed;
  };
  bool receive(Stream& s);
  bool deliver();
  void raise_if_stuck() const;
  void arm_writes();

  std::vector<Stream> streams_;
  std::string host_;             // the peer's address, for errors
  std::deque<Recv> recvs_;       // undelivered, in order
  std::vector<uint8_t> window_;  // the front receive's bytes from `delivered`, when staged
  size_t piece_bytes_;
  uint64_t sent_ = 0;      // bytes posted to send so far: where the next send starts
  uint64_t received_ = 0;  // bytes posted to receive so far
  int epoll_fd_ = -1;
  bool aborted_ = false;
};

}  // namespace pyring
