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

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct TcpPeer {
  int rank;
  std::string host;
  int port;
};

// Opens one connection to every peer in `peers`: this rank connects to higher ranks and accepts
// lower ones. Each connection starts with a hello carrying the rank and the job's secret; a
// connection with a wrong secret is dropped. Returns rank -> connected non-blocking socket.
std::map<int, int> tcp_establish(int rank, TcpListener& listener, const std::vector<TcpPeer>& peers,
                                 const std::string& secret, Deadline deadline);

}  // namespace pyring
