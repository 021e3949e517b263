#include "transport/tcp/tcp_striped_link.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/errors.h"
#include "transport/tcp/tcp_connect.h"

namespace pyring {

namespace {

size_t align_down(size_t n) {
  return n / kPieceAlign * kPieceAlign;
}

// Calls fn(offset in the span, length, connection) for the stripes of a span of `bytes` that
// starts `start` bytes into a direction's stream.
template <typename Fn>
void cut(uint64_t start, size_t bytes, size_t n, Fn fn) {
  for (size_t off = 0; off < bytes;) {
    const uint64_t at = start + off;
    const size_t len = std::min<uint64_t>(bytes - off, kStripeBytes - at % kStripeBytes);
    fn(off, len, static_cast<size_t>(at / kStripeBytes % n));
    off += len;
  }
}

}  // namespace

size_t TcpStripedLink::Recv::prefix() const {
  return first_open < parts.size() ? parts[first_open].offset + parts[first_open].landed
                                   : spec.bytes;
}

TcpStripedLink::TcpStripedLink(int peer, std::vector<int> fds, size_t staging_bytes)
    : Link(peer), piece_bytes_(std::max(kPieceAlign, align_down(staging_bytes))) {
  streams_.resize(fds.size());
  for (size_t k = 0; k < fds.size(); ++k) streams_[k].fd = fds[k];
  if (!fds.empty()) host_ = peer_host(fds[0]);
  try {
    PYRING_CHECK_ARG(!fds.empty(), "a striped tcp link needs at least one connection");
    window_.resize(std::max(piece_bytes_, fds.size() * kStripeBytes));
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    PYRING_CHECK_ERRNO(epoll_fd_ >= 0, "epoll_create1");
    for (size_t k = 0; k < streams_.size(); ++k) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = k;
      PYRING_CHECK_ERRNO(epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, streams_[k].fd, &ev) == 0,
                         "epoll_ctl");
    }
  } catch (...) {
    for (auto& s : streams_) close(s.fd);
    if (epoll_fd_ >= 0) close(epoll_fd_);
    throw;
  }
}

TcpStripedLink::~TcpStripedLink() {
  for (auto& s : streams_) close(s.fd);
  close(epoll_fd_);
}

void TcpStripedLink::post_send(const uint8_t* data, size_t bytes) {
  cut(sent_, bytes, streams_.size(),
      [&](size_t off, size_t len, size_t k) { streams_[k].sends.push_back({data + off, len, 0}); });
  sent_ += bytes;
}

void TcpStripedLink::post_recv(RecvSpec spec) {
  if (spec.bytes == 0) return;
  const size_t bytes = spec.bytes;
  recvs_.push_back({std::move(spec), {}});
  Recv& r = recvs_.back();
  cut(received_, bytes, streams_.size(), [&](size_t off, size_t len, size_t k) {
    r.parts.push_back({&r, off, len, 0});
    streams_[k].recvs.push_back(&r.parts.back());
  });
  received_ += bytes;
}

bool TcpStripedLink::sending() const {
  for (const auto& s : streams_) {
    if (!s.sends.empty()) return true;
  }
  return false;
}

// Reads what connection `s` has for its parts, in order: into copy_to, or into the window while
// the part belongs to the front receive and falls inside the window; otherwise it waits.
bool TcpStripedLink::receive(Stream& s) {
  bool moved = false;
  while (!s.recvs.empty() && !s.failed) {
    Part& p = *s.recvs.front();
    Recv& r = *p.recv;
    const size_t at = p.offset + p.landed;
    uint8_t* dst;
    size_t room = p.bytes - p.landed;
    if (r.spec.copy_to) {
      dst = r.spec.copy_to + at;
    } else {
      if (&r != &recvs_.front() || at >= r.delivered + window_.size()) break;
      dst = window_.data() + (at - r.delivered);
      room = std::min(room, r.delivered + window_.size() - at);
    }
    size_t n;
    try {
      n = tcp_recv_some(s.fd, peer_, host_, dst, room);
    } catch (const CommError&) {
      s.failed = std::current_exception();
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.fd, nullptr);  // an EOF would keep it readable
      break;
    }
    if (n == 0) break;
    moved = true;
    count_received(n);
    p.landed += n;
    if (p.landed < p.bytes) continue;
    s.recvs.pop_front();
    while (r.first_open < r.parts.size() &&
           r.parts[r.first_open].landed == r.parts[r.first_open].bytes) {
      ++r.first_open;
    }
  }
  return moved;
}

// Hands landed bytes to on_piece in message order: a copy_to receive's landed prefix once it
// is piece_bytes_ long or reaches the end; another's window once full or at the end.
bool TcpStripedLink::deliver() {
  bool any = false;
  while (!recvs_.empty()) {
    Recv& r = recvs_.front();
    const size_t prefix = r.prefix();
    const bool ends = prefix == r.spec.bytes;
    const size_t ready = prefix - r.delivered;
    size_t len = 0;
    const uint8_t* data = nullptr;
    if (r.spec.copy_to) {
      if (ready >= piece_bytes_ || (ends && ready > 0)) {
        len = ends ? ready : align_down(ready);
        data = r.spec.copy_to + r.delivered;
      }
    } else if (ready > 0 && (ends || ready == window_.size())) {
      len = ready;
      data = window_.data();
    }
    if (len > 0) {
      if (r.spec.on_piece) r.spec.on_piece(data, r.delivered, len);
      r.delivered += len;
      any = true;
    }
    if (r.delivered < r.spec.bytes) break;
    recvs_.pop_front();
  }
  return any;
}

// Raises a connection's failure once nothing can come before what it still owes: its front
// part is the link's first missing byte, or it has bytes to send.
void TcpStripedLink::raise_if_stuck() const {
  const Part* first = nullptr;
  if (!recvs_.empty() && recvs_.front().first_open < recvs_.front().parts.size()) {
    first = &recvs_.front().parts[recvs_.front().first_open];
  }
  for (const auto& s : streams_) {
    if (s.failed && (!s.sends.empty() || (!s.recvs.empty() && s.recvs.front() == first))) {
      std::rethrow_exception(s.failed);
    }
  }
}

void TcpStripedLink::arm_writes() {
  for (size_t k = 0; k < streams_.size(); ++k) {
    Stream& s = streams_[k];
    const bool want = !s.sends.empty();
    if (want == s.out_armed || s.failed) continue;
    epoll_event ev{};
    ev.events = EPOLLIN | (want ? static_cast<uint32_t>(EPOLLOUT) : 0u);
    ev.data.u64 = k;
    PYRING_CHECK_ERRNO(epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, s.fd, &ev) == 0, "epoll_ctl");
    s.out_armed = want;
  }
}

bool TcpStripedLink::progress() {
  PYRING_CHECK(!aborted_, CommError, "link to rank ", peer_, " was aborted");
  bool moved = false;
  for (auto& s : streams_) {
    const size_t n = tcp_send_queued(s.fd, peer_, host_, s.sends);
    if (n > 0) count_sent(n);
    moved |= n > 0;
  }
  // Delivering empties the window, which lets the connections read on.
  for (;;) {
    bool read = false;
    for (auto& s : streams_) read |= receive(s);
    const bool delivered = deliver();
    moved |= read || delivered;
    if (!(read && delivered)) break;
  }
  raise_if_stuck();
  arm_writes();
  return moved;
}

std::string TcpStripedLink::pending() const {
  size_t send_left = 0, recv_left = 0;
  for (const auto& s : streams_) {
    for (const auto& q : s.sends) send_left += q.bytes - q.done;
  }
  for (const auto& r : recvs_) recv_left += r.spec.bytes - r.delivered;
  return str_cat("tcp link to rank ", peer_, " at ", host_, " (", streams_.size(),
                 " connections): ", send_left, " bytes left to send, ", recv_left,
                 " bytes left to receive");
}

void TcpStripedLink::announce_closed() {
  for (auto& s : streams_) shutdown(s.fd, SHUT_WR);
}

void TcpStripedLink::abort() {
  aborted_ = true;
  for (auto& s : streams_) shutdown(s.fd, SHUT_RDWR);
}

}  // namespace pyring
