#include "transport/tcp/tcp_link.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/errors.h"
#include "transport/tcp/tcp_connect.h"

namespace pyring {

TcpLink::TcpLink(int peer, int fd, size_t staging_bytes)
    : QueuedLink(peer),
      fd_(fd),
      host_(peer_host(fd)),
      staging_(std::max<size_t>(kPieceAlign, staging_bytes / kPieceAlign * kPieceAlign)) {}

TcpLink::~TcpLink() {
  close(fd_);
}

void TcpLink::post_recv(RecvSpec spec) {
  if (spec.bytes > 0 && recvs_.empty()) since_ = Clock::now();
  QueuedLink::post_recv(std::move(spec));
}

namespace {

[[noreturn]] void fail(int peer, const std::string& host, const char* what, int err) {
  if (err == 0 || err == ECONNRESET || err == EPIPE) {
    throw PeerLost(peer, str_cat("connection to rank ", peer, " at ", host, " ",
                                 err ? "reset" : "closed", " by the peer during ", what));
  }
  PYRING_THROW(CommError, what, " on the connection to rank ", peer, " at ", host,
               " failed: ", strerror(err));
}

}  // namespace

size_t tcp_send_queued(int fd, int peer, const std::string& host, std::deque<TcpSend>& queue) {
  size_t sent = 0;
  while (!queue.empty()) {
    constexpr size_t kMaxIov = 16;
    iovec iov[kMaxIov];
    size_t n_iov = 0;
    for (auto it = queue.begin(); it != queue.end() && n_iov < kMaxIov; ++it, ++n_iov) {
      iov[n_iov].iov_base = const_cast<uint8_t*>(it->data + it->done);
      iov[n_iov].iov_len = it->bytes - it->done;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n_iov;
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      fail(peer, host, "send", errno);
    }
    sent += static_cast<size_t>(n);
    size_t left = static_cast<size_t>(n);
    while (left > 0) {
      TcpSend& s = queue.front();
      size_t take = std::min(left, s.bytes - s.done);
      s.done += take;
      left -= take;
      if (s.done == s.bytes) queue.pop_front();
    }
  }
  return sent;
}

size_t tcp_recv_some(int fd, int peer, const std::string& host, uint8_t* buf, size_t n) {
  for (;;) {
    ssize_t got = ::recv(fd, buf, n, MSG_DONTWAIT);
    if (got > 0) return static_cast<size_t>(got);
    if (got == 0) fail(peer, host, "recv", 0);
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (errno != EINTR) fail(peer, host, "recv", errno);
  }
}

bool TcpLink::progress_send() {
  size_t n = tcp_send_queued(fd_, peer_, host_, sends_);
  if (n > 0) count_sent(n);
  return n > 0;
}

bool TcpLink::progress_recv() {
  bool moved = false;
  while (!recvs_.empty()) {
    LinkRecv& r = recvs_.front();
    const size_t total = r.spec.bytes;
    size_t n;
    if (r.spec.copy_to) {
      n = tcp_recv_some(fd_, peer_, host_, r.spec.copy_to + r.received, total - r.received);
    } else {
      size_t want = std::min(staging_.size() - staged_, total - r.done - staged_);
      n = tcp_recv_some(fd_, peer_, host_, staging_.data() + staged_, want);
    }
    if (n == 0) break;
    moved = true;
    count_received(n);
    const auto now = Clock::now();
    const double gap = std::chrono::duration<double, std::micro>(now - since_).count();
    const bool first = per_read_ == 0;
    gap_us_ = first ? gap : 0.75 * gap_us_ + 0.25 * gap;
    per_read_ = first ? static_cast<double>(n) : 0.75 * per_read_ + 0.25 * static_cast<double>(n);
    since_ = now;
    if (r.spec.copy_to) {
      r.received += n;
      if (r.received - r.done >= staging_.size() || r.received == total) {
        if (r.spec.on_piece) r.spec.on_piece(r.spec.copy_to + r.done, r.done, r.received - r.done);
        r.done = r.received;
      }
    } else {
      staged_ += n;
      if (staged_ == staging_.size() || r.done + staged_ == total) {
        if (r.spec.on_piece) r.spec.on_piece(staging_.data(), r.done, staged_);
        r.done += staged_;
        staged_ = 0;
      }
    }
    if (r.done == total) recvs_.pop_front();
  }
  // A driver blocks in poll() only with the wake-up mark at most what the front receive needs.
  const size_t need = to_next_piece();
  if (wake_bytes_ > std::max<size_t>(need, 1)) wake_at(need);
  return moved;
}

size_t TcpLink::to_next_piece() const {
  if (recvs_.empty()) return 0;
  const LinkRecv& r = recvs_.front();
  return r.spec.copy_to
             ? std::min(r.spec.bytes - r.received, staging_.size() - (r.received - r.done))
             : std::min(staging_.size() - staged_, r.spec.bytes - r.done - staged_);
}

void TcpLink::wake_at(size_t bytes) {
  const int v = static_cast<int>(std::clamp<size_t>(bytes, 1, kWakeBytes));
  if (static_cast<size_t>(v) == wake_bytes_) return;
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) == 0) {
    wake_bytes_ = static_cast<size_t>(v);
  }
}

bool TcpLink::spin_worthwhile(int spin_us) {
  const size_t need = to_next_piece();
  if (need == 0) return true;
  const double reads = std::max(1.0, static_cast<double>(need) / std::max(per_read_, 1.0));
  if (gap_us_ * reads < std::min<double>(spin_us, kSpinForUs)) return true;
  wake_at(need);
  return false;
}

void TcpLink::announce_closed() {
  shutdown(fd_, SHUT_WR);  // the peer reads what was sent, then the end of the stream
}

void TcpLink::abort_transport() {
  shutdown(fd_, SHUT_RDWR);
}

}  // namespace pyring
