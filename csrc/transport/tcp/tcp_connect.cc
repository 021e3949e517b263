#include "transport/tcp/tcp_connect.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>

#include "core/errors.h"
#include "transport/tcp/tcp_handshake.h"

namespace pyring {

void watch_liveness(int fd, double deadline_s) {
  if (deadline_s <= 0) return;
  const double capped = std::min(deadline_s, 3600.0);
  int one = 1;
  int idle = std::max(1, static_cast<int>(capped / 2));
  int interval = std::max(1, static_cast<int>(capped / 8));
  int probes = 3;
  unsigned int user_ms = static_cast<unsigned int>(std::max(1000.0, capped * 1000));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof(user_ms));
}

std::string peer_host(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  char buf[INET_ADDRSTRLEN] = "?";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
      addr.sin_family == AF_INET) {
    inet_ntop(AF_INET, &addr.sin_addr, buf, sizeof(buf));
  }
  return buf;
}

namespace {

sockaddr_in make_addr(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  PYRING_CHECK_ARG(inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1, "not an IPv4 address: '",
                   host, "'");
  return addr;
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  PYRING_CHECK_ERRNO(flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0, "fcntl");
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Sends a handshake message whole into a fresh socket's empty buffer; false if it does not fit.
bool send_small(int fd, const void* buf, size_t n) {
  ssize_t w;
  do {
    w = ::send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (w < 0 && errno == EINTR);
  return w == static_cast<ssize_t>(n);
}

int connect_to(const TcpPeer& peer, int rank, Deadline deadline) {
  sockaddr_in addr = make_addr(peer.host, peer.port);
  std::string what = str_cat("connecting rank ", rank, " (this process) to rank ", peer.rank,
                             " at ", peer.host, ":", peer.port);
  for (;;) {
    // Non-blocking, so that an address that drops packets costs the deadline, not the
    // kernel's SYN retries.
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    PYRING_CHECK_ERRNO(fd >= 0, "socket");
    int err = 0;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int rc;
      do {
        rc = poll(&p, 1, deadline.remaining_ms(1000));
      } while (rc < 0 && errno == EINTR);
      socklen_t len = sizeof(err);
      err = rc > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 ? err : ETIMEDOUT;
    }
    if (err == 0) {
      tune(fd);
      return fd;
    }
    close(fd);
    if (deadline.expired()) {
      PYRING_THROW(TimeoutError, "Timed out ", what, ": ", strerror(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

TcpListener::TcpListener(const std::string& host) {
  sockaddr_in addr = make_addr(host, 0);
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PYRING_CHECK_ERRNO(fd_ >= 0, "socket");
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd_, 512) != 0) {
    int err = errno;
    close_now();
    PYRING_THROW(CommError, "cannot listen on ", host, ": ", strerror(err));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  set_nonblocking(fd_);
}

TcpListener::~TcpListener() {
  close_now();
}

void TcpListener::close_now() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

namespace {

// One connection being opened. Outgoing: this rank connected to `peer` and awaits its
// Challenge, then its Ack. Incoming: accepted, Challenge sent, awaiting a Hello until `until`.
struct Pending {
  enum Phase { kOutChallenge, kOutAck, kInHello } phase;
  int fd = -1;
  int peer = -1;   // outgoing only
  int stream = 0;  // outgoing only
  uint8_t buf[sizeof(Hello)] = {};
  size_t got = 0;
  size_t need = 0;
  Challenge challenge{};
  Hello hello{};
  Clock::time_point until{};
  size_t target = 0;  // outgoing: index into the peers
};

}  // namespace

std::map<int, std::vector<int>> tcp_establish(int rank, TcpListener& listener,
                                              const std::vector<TcpPeer>& peers,
                                              const std::string& secret, Deadline deadline,
                                              int log_level, int nstreams) {
  PYRING_CHECK_ARG(secret.size() == kSecretBytes, "job secret must be ", kSecretBytes,
                   " bytes, got ", secret.size());
  PYRING_CHECK_ARG(nstreams >= 1 && nstreams <= kMaxTcpStreams, "nstreams must be in 1..",
                   kMaxTcpStreams, ", got ", nstreams);
  std::map<int, std::vector<int>> fds;
  std::vector<Pending> pending;
  std::set<std::pair<int, int>> awaited;  // (lower rank, stream) not connected yet
  std::map<int, int> refusals;  // outgoing: times a peer closed the connection mid-handshake
  auto drop = [&](size_t i) {
    close(pending[i].fd);
    pending[i] = pending.back();
    pending.pop_back();
  };
  auto open_out = [&](size_t target, int stream) {
    const TcpPeer& p = peers[target];
    Pending c{Pending::kOutChallenge};
    c.fd = connect_to(p, rank, deadline);
    c.peer = p.rank;
    c.stream = stream;
    c.need = sizeof(Challenge);
    c.target = target;
    pending.push_back(c);
  };
  auto& dropped = listener.dropped();
  try {
    for (size_t i = 0; i < peers.size(); ++i) {
      fds[peers[i].rank].assign(static_cast<size_t>(nstreams), -1);
      for (int s = 0; s < nstreams; ++s) {
        if (peers[i].rank < rank) {
          awaited.insert({peers[i].rank, s});
        } else {
          open_out(i, s);
        }
      }
    }
    std::vector<pollfd> polled;
    auto outgoing = [&] {
      for (const auto& c : pending) {
        if (c.phase != Pending::kInHello) return true;
      }
      return false;
    };
    while (outgoing() || !awaited.empty()) {
      auto now = Clock::now();
      int wait_ms = deadline.remaining_ms(100);
      polled.clear();
      polled.push_back(pollfd{awaited.empty() ? -1 : listener.fd(), POLLIN, 0});
      for (const auto& c : pending) {
        polled.push_back(pollfd{c.fd, POLLIN, 0});
        if (c.phase == Pending::kInHello) {
          auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.until - now);
          wait_ms = std::max(0, std::min(wait_ms, static_cast<int>(left.count()) + 1));
        }
      }
      int rc = poll(polled.data(), polled.size(), wait_ms);
      if (rc < 0 && errno != EINTR) PYRING_CHECK_ERRNO(false, "poll during the tcp rendezvous");
      // Readable connections first, by index into `polled` (pending may shrink as we go).
      std::vector<int> ready;
      for (size_t i = 1; i < polled.size(); ++i) {
        if (rc > 0 && polled[i].revents) ready.push_back(polled[i].fd);
      }
      for (int fd : ready) {
        size_t i = 0;
        while (i < pending.size() && pending[i].fd != fd) ++i;
        if (i == pending.size()) continue;
        Pending& c = pending[i];
        ssize_t r = ::recv(c.fd, c.buf + c.got, c.need - c.got, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (r <= 0) {  // closed or reset before the handshake finished
          if (c.phase == Pending::kInHello) {
            ++(c.got ? dropped.garbage : dropped.silent);
            drop(i);
          } else {
            size_t target = c.target;
            int stream = c.stream;
            ++refusals[c.peer];
            drop(i);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            open_out(target, stream);
          }
          continue;
        }
        c.got += static_cast<size_t>(r);
        if (c.got < c.need) continue;
        if (c.phase == Pending::kOutChallenge) {
          PYRING_CHECK(check_challenge(c.buf, c.got), CommError, "rank ", c.peer, " at ",
                       peers[c.target].host, ":", peers[c.target].port,
                       " did not answer as a pyring rank of this version (connecting from rank ",
                       rank, ", this process)");
          std::memcpy(&c.challenge, c.buf, sizeof(Challenge));
          c.hello = make_hello(secret, c.challenge, rank, c.peer, c.stream, nstreams);
          const bool sent = send_small(c.fd, &c.hello, sizeof(Hello));
          // The Hello goes even so, for the acceptor to name both counts in its own error.
          PYRING_CHECK(c.challenge.nstreams == nstreams, CommError, "rank ", c.peer, " opens ",
                       c.challenge.nstreams, " tcp stream(s) per link and rank ", rank,
                       " (this process) ", nstreams,
                       ": set PYRING_SOCKET_NSTREAMS to the same value on every rank");
          PYRING_CHECK(sent, CommError, "sending the hello from rank ", rank, " to rank ", c.peer,
                       " failed");
          c.phase = Pending::kOutAck;
          c.got = 0;
          c.need = sizeof(Ack);
        } else if (c.phase == Pending::kOutAck) {
          PYRING_CHECK(check_ack(c.buf, c.got, secret, c.challenge, c.hello), CommError, "rank ",
                       c.peer, " at ", peers[c.target].host, ":", peers[c.target].port,
                       " failed authentication from rank ", rank,
                       " (this process): it does not hold this job's secret");
          tune(c.fd);
          fds[c.peer][static_cast<size_t>(c.stream)] = c.fd;
          pending[i] = pending.back();
          pending.pop_back();
        } else {
          Hello h{};
          auto verdict = check_hello(c.buf, c.got, secret, c.challenge, rank, &h);
          // Authentic: a rank of this job, which must stripe its links as this one does.
          PYRING_CHECK(verdict != HelloVerdict::kOk || h.nstreams == nstreams, CommError, "rank ",
                       h.from_rank, " opens ", h.nstreams, " tcp stream(s) per link and rank ",
                       rank, " (this process) ", nstreams,
                       ": set PYRING_SOCKET_NSTREAMS to the same value on every rank");
          const std::pair<int, int> key{h.from_rank, h.stream};
          if (verdict == HelloVerdict::kOk && !awaited.count(key)) {
            verdict = HelloVerdict::kNotExpected;
          }
          if (verdict == HelloVerdict::kOk) {
            c.hello = h;
            Ack ack = make_ack(secret, c.challenge, c.hello);
            if (send_small(c.fd, &ack, sizeof(ack))) {
              tune(c.fd);
              fds[h.from_rank][h.stream] = c.fd;
              awaited.erase(key);
              pending[i] = pending.back();
              pending.pop_back();
              continue;
            }
            verdict = HelloVerdict::kGarbage;
          }
          ++(verdict == HelloVerdict::kBadMac        ? dropped.bad_mac
             : verdict == HelloVerdict::kNotExpected ? dropped.not_expected
                                                     : dropped.garbage);
          drop(i);
        }
      }
      if (rc > 0 && (polled[0].revents & POLLIN)) {
        for (;;) {
          int fd = accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (fd < 0) break;
          size_t incoming = 0;
          for (const auto& c : pending) incoming += c.phase == Pending::kInHello;
          Pending c{Pending::kInHello};
          c.fd = fd;
          c.need = sizeof(Hello);
          c.challenge = make_challenge(nstreams);
          c.until = Clock::now() + std::chrono::milliseconds(kHelloTimeoutMs);
          if (incoming >= kMaxPendingHellos || !send_small(fd, &c.challenge, sizeof(c.challenge))) {
            ++dropped.overflow;
            close(fd);
            continue;
          }
          pending.push_back(c);
        }
      }
      now = Clock::now();
      for (size_t i = 0; i < pending.size();) {
        if (pending[i].phase == Pending::kInHello && now >= pending[i].until) {
          ++(pending[i].got ? dropped.garbage : dropped.silent);
          drop(i);
        } else {
          ++i;
        }
      }
      if (deadline.expired() && (outgoing() || !awaited.empty())) {
        std::string missing;
        std::set<int> listed;
        for (const auto& [r, s] : awaited) {
          if (listed.insert(r).second) missing += str_cat(missing.empty() ? "" : ", ", r);
        }
        for (const auto& c : pending) {
          if (c.phase != Pending::kInHello && listed.insert(c.peer).second) {
            missing += str_cat(missing.empty() ? "" : ", ", c.peer);
            if (refusals.count(c.peer)) {
              missing += str_cat(" (closed the handshake ", refusals[c.peer],
                                 " time(s): does it hold this job's secret?)");
            }
          }
        }
        PYRING_THROW(TimeoutError, "Timed out: rank ", rank,
                     " (this process) could not open authenticated tcp links to ranks ", missing,
                     "; dropped ", dropped.total(), " unknown connection(s) on port ",
                     listener.port());
      }
    }
    // Connections still in their hello when every peer is in are strangers.
    for (const auto& c : pending) ++(c.got ? dropped.garbage : dropped.silent);
    for (const auto& c : pending) close(c.fd);
    pending.clear();
  } catch (...) {
    for (auto& c : pending) close(c.fd);
    for (auto& kv : fds) {
      for (int fd : kv.second) {
        if (fd >= 0) close(fd);
      }
    }
    throw;
  }
  if (log_level >= 1 && dropped.total() > 0) {
    std::fprintf(stderr,
                 "[pyring INFO] rank %d: dropped %llu unknown connection(s) on port %d during the "
                 "rendezvous: %llu silent, %llu garbage, %llu failed authentication, %llu not "
                 "expected, %llu over the limit\n",
                 rank, static_cast<unsigned long long>(dropped.total()), listener.port(),
                 static_cast<unsigned long long>(dropped.silent),
                 static_cast<unsigned long long>(dropped.garbage),
                 static_cast<unsigned long long>(dropped.bad_mac),
                 static_cast<unsigned long long>(dropped.not_expected),
                 static_cast<unsigned long long>(dropped.overflow));
  }
  return fds;
}

}  // namespace pyring
