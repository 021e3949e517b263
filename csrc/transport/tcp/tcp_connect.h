// Listening, connecting and authenticating TCP links at communicator start.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/types.h"

namespace pyring {

// A listening socket bound to `host` (an IPv4 address) on an ephemeral port.
class TcpListener {
 public:
  explicit TcpListener(const std::string& host);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  int port() const { return port_; }
  int fd() const { return fd_; }
  void close_now();

  // Connections dropped during tcp_establish, by why. Written by the establishing thread.
  struct Dropped {
    uint64_t silent = 0;        // sent nothing before their hello deadline
    uint64_t garbage = 0;       // sent bytes that are not a pyring hello, or hung up midway
    uint64_t bad_mac = 0;       // a hello that fails authentication with the job's secret
    uint64_t not_expected = 0;  // authentic, but from a rank this one does not await
    uint64_t overflow = 0;      // beyond kMaxPendingHellos connections at once
    uint64_t total() const { return silent + garbage + bad_mac + not_expected + overflow; }
  };
  const Dropped& dropped() const { return dropped_; }
  Dropped& dropped() { return dropped_; }

 private:
  Dropped dropped_;
  int fd_ = -1;
  int port_ = 0;
};

struct TcpPeer {
  int rank;
  std::string host;
  int port;
};

// How long an accepted connection may take to send its hello, and how many may wait at once.
constexpr int kHelloTimeoutMs = 5000;
// Connections per tcp link at most (PYRING_SOCKET_NSTREAMS).
constexpr int kMaxTcpStreams = 16;
constexpr size_t kMaxPendingHellos = 256;

// A peer whose packets vanish without a reset (a cut cable, a dead host): data left
// unacknowledged for `deadline_s` fails the socket with ETIMEDOUT (TCP_USER_TIMEOUT), and an
// idle connection is probed from deadline_s / 2 on (keepalive), so that a silent partition is
// found within the deadline even between collectives. deadline_s <= 0 leaves the socket as is.
void watch_liveness(int fd, double deadline_s);
// The peer's IPv4 address of a connected socket ("?" when unknown), for errors.
std::string peer_host(int fd);

// Opens `nstreams` authenticated connections to every peer in `peers`: this rank connects to
// higher ranks and accepts lower ones (tcp_handshake.h). All handshakes run at once on this
// thread, each accepted connection with its own hello deadline, so a silent or slow stranger on
// the port delays no peer; whatever fails the handshake is closed and counted in
// listener.dropped(), and reported at log_level >= 1. A connector whose connection is closed
// before its Ack connects again until `deadline`. A peer that opens a different number of
// streams is a CommError naming both counts. Returns rank -> its connected non-blocking
// sockets, by stream number.
std::map<int, std::vector<int>> tcp_establish(int rank, TcpListener& listener,
                                              const std::vector<TcpPeer>& peers,
                                              const std::string& secret, Deadline deadline,
                                              int log_level = 0, int nstreams = 1);

}  // namespace pyring
