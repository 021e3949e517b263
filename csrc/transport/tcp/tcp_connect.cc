#include "transport/tcp/tcp_connect.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "core/errors.h"

namespace pyring {

namespace {

constexpr uint32_t kHelloMagic = 0x50595247;  // "PYRG"
constexpr size_t kSecretBytes = 32;

struct Hello {
  uint32_t magic;
  int32_t rank;
  uint8_t secret[kSecretBytes];
};

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

// Waits until `fd` is ready for `events` or throws TimeoutError naming `what`.
void wait_fd(int fd, short events, Deadline deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int ms = deadline.remaining_ms(100);
    int rc = poll(&p, 1, ms);
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) PYRING_CHECK_ERRNO(false, "poll during ", what);
    if (deadline.expired()) PYRING_THROW(TimeoutError, "Timed out during ", what);
  }
}

void write_all(int fd, const void* buf, size_t n, Deadline d, const std::string& what) {
  auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      wait_fd(fd, POLLOUT, d, what);
    } else {
      PYRING_CHECK_ERRNO(false, what, ": send");
    }
  }
}

void read_all(int fd, void* buf, size_t n, Deadline d, const std::string& what) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      PYRING_THROW(CommError, what, ": connection closed by the peer");
    } else if (errno == EAGAIN || errno == EINTR) {
      wait_fd(fd, POLLIN, d, what);
    } else {
      PYRING_CHECK_ERRNO(false, what, ": recv");
    }
  }
}

int connect_to(const TcpPeer& peer, int rank, Deadline deadline) {
  sockaddr_in addr = make_addr(peer.host, peer.port);
  std::string what = str_cat("connecting rank ", rank, " (this process) to rank ", peer.rank,
                             " at ", peer.host, ":", peer.port);
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    PYRING_CHECK_ERRNO(fd >= 0, "socket");
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      tune(fd);
      set_nonblocking(fd);
      return fd;
    }
    int err = errno;
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

std::map<int, int> tcp_establish(int rank, TcpListener& listener, const std::vector<TcpPeer>& peers,
                                 const std::string& secret, Deadline deadline) {
  PYRING_CHECK_ARG(secret.size() == kSecretBytes, "job secret must be ", kSecretBytes,
                   " bytes, got ", secret.size());
  std::map<int, int> fds;
  auto cleanup = [&] {
    for (auto& kv : fds) close(kv.second);
  };
  try {
    Hello hello{kHelloMagic, rank, {}};
    std::memcpy(hello.secret, secret.data(), kSecretBytes);
    size_t expected_accepts = 0;
    for (const auto& p : peers) {
      if (p.rank < rank) {
        ++expected_accepts;
        continue;
      }
      int fd = connect_to(p, rank, deadline);
      fds[p.rank] = fd;
      write_all(fd, &hello, sizeof(hello), deadline,
                str_cat("sending hello from rank ", rank, " to rank ", p.rank));
    }
    while (expected_accepts > 0) {
      wait_fd(
          listener.fd(), POLLIN, deadline,
          str_cat("rank ", rank, " waiting for ", expected_accepts, " lower rank(s) to connect"));
      int fd = accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) continue;
      Hello in{};
      try {
        read_all(fd, &in, sizeof(in), deadline, str_cat("reading hello at rank ", rank));
      } catch (const CommError&) {
        close(fd);
        continue;
      }
      bool wanted = false;
      for (const auto& p : peers) wanted |= (p.rank == in.rank && p.rank < rank);
      if (in.magic != kHelloMagic || std::memcmp(in.secret, secret.data(), kSecretBytes) != 0 ||
          !wanted || fds.count(in.rank)) {
        close(fd);  // not a peer of this job: drop it
        continue;
      }
      tune(fd);
      uint8_t ack = 'K';
      write_all(fd, &ack, 1, deadline, str_cat("acknowledging rank ", in.rank));
      fds[in.rank] = fd;
      --expected_accepts;
    }
    for (const auto& p : peers) {
      if (p.rank < rank) continue;
      uint8_t ack = 0;
      read_all(fds[p.rank], &ack, 1, deadline,
               str_cat("waiting for rank ", p.rank, " to accept rank ", rank));
      PYRING_CHECK(ack == 'K', CommError, "rank ", p.rank, " sent a bad acknowledgement");
    }
  } catch (...) {
    cleanup();
    throw;
  }
  return fds;
}

}  // namespace pyring
