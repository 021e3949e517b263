#include "core/p2p.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "core/errors.h"
#include "core/p2p_state.h"
#include "core/thread_name.h"

namespace pyring {

namespace {
constexpr uint32_t kFrameMagic = 0x50325052;  // "RP2P"
constexpr auto kExpireEvery = std::chrono::milliseconds(1);
// How long close() drives its kClosing frames out: a peer whose inbox stays full meanwhile
// takes this rank's close for a failure.
constexpr auto kGoodbyeTime = std::chrono::milliseconds(50);

std::string where(const P2pAddress& a, bool is_send) {
  std::string peer = a.peer < 0 ? std::string("any rank") : str_cat("rank ", a.peer);
  if (a.context == P2pContext::kCollective) {
    return str_cat("part of collective #", a.tag, is_send ? " to " : " from ", peer);
  }
  return str_cat(is_send ? "send to " : "recv from ", peer, " with tag ", a.tag);
}

// Whether a receive posted for `a` takes the message `f` from `peer`.
bool accepts(const P2pAddress& a, int peer, const P2pFrame& f) {
  return (a.peer < 0 || a.peer == peer) && a.tag == f.tag &&
         static_cast<uint8_t>(a.context) == f.context;
}

template <class E, class... Args>
std::exception_ptr error(const Args&... args) {
  return std::make_exception_ptr(E(str_cat(args...)));
}
}  // namespace

P2pEngine::P2pEngine(int rank, std::vector<std::unique_ptr<Link>> links,
                     std::shared_ptr<void> keepalive, int spin_us)
    : rank_(rank), spin_us_(spin_us), links_(std::move(links)), keepalive_(std::move(keepalive)) {
  peers_.resize(links_.size());
  bool tcp = false;
  for (size_t p = 0; p < links_.size(); ++p) {
    Link* l = links_[p].get();
    peers_[p].link = l;
    if (!l) continue;
    if (l->poll_fd() >= 0) tcp = true;
    if (l->sleep_word()) sleep_word_ = l->sleep_word();
  }
  if (tcp) event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

P2pEngine::~P2pEngine() {
  close("communicator closed");
  if (event_fd_ >= 0) ::close(event_fd_);
}

void P2pEngine::start() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t p = 0; p < peers_.size(); ++p) {
    if (peers_[p].link) post_frame_recv_locked(static_cast<int>(p));
  }
  thread_ = std::thread([this] {
    name_this_thread(kP2pThreadName);
    loop();
  });
}

uint64_t P2pEngine::bytes_sent() const {
  uint64_t n = 0;
  for (const auto& l : links_) n += l ? l->bytes_sent() : 0;
  return n;
}

uint64_t P2pEngine::bytes_received() const {
  uint64_t n = 0;
  for (const auto& l : links_) n += l ? l->bytes_received() : 0;
  return n;
}

std::shared_ptr<Work> P2pEngine::make_work(const char* name, size_t bytes, const P2pAddress& a) {
  CollectiveDesc desc;
  desc.name = name;
  desc.count = bytes;
  desc.dtype = DType::kUInt8;
  auto work = std::make_shared<Work>(desc, nullptr, runner_);
  std::weak_ptr<P2pEngine> self = weak_from_this();
  work->set_helper([self](const Work& w) {
    if (auto engine = self.lock()) engine->help(w);
  });
  PYRING_CHECK_ARG(a.peer >= -1 && a.peer < size() && a.peer != rank_, name, ": peer rank ", a.peer,
                   " is out of range for rank ", rank_, " of ", size(),
                   a.peer == rank_ ? " (it is this rank)" : "");
  return work;
}

std::shared_ptr<Work> P2pEngine::send(const void* data, size_t bytes, const P2pAddress& to,
                                      Deadline deadline, bool helped) {
  auto work = make_work("send", bytes, to);
  PYRING_CHECK_ARG(to.peer >= 0, "send: the destination must be a rank, got ", to.peer);
  std::lock_guard<std::mutex> lock(mu_);
  PYRING_CHECK(closed_.empty(), CommError, where(to, true), ": ", closed_);
  Peer& p = peers_[static_cast<size_t>(to.peer)];
  PYRING_CHECK(p.link, CommError, where(to, true), ": no point-to-point link to rank ", to.peer);
  PYRING_CHECK(p.broken.empty(), CommError, where(to, true), ": the link is broken: ", p.broken);
  auto op = std::make_shared<Op>();
  op->work = work;
  op->is_send = true;
  op->addr = to;
  op->data = static_cast<uint8_t*>(const_cast<void*>(data));
  op->bytes = bytes;
  op->deadline = deadline;
  op->frame = P2pFrame{kFrameMagic, static_cast<uint8_t>(to.context), to.kind, 0, to.tag, bytes, 0};
  p.link->post_send(reinterpret_cast<const uint8_t*>(&op->frame), sizeof(P2pFrame));
  p.link->post_send(op->data, bytes);
  p.posted_bytes += sizeof(P2pFrame) + bytes;
  op->end = p.posted_bytes;
  p.sends.push_back(op);
  ++in_flight_;
  progress_locked();
  if (!op->done && !helped) wake();
  return work;
}

std::shared_ptr<Work> P2pEngine::recv(void* data, size_t bytes, const P2pAddress& from,
                                      Deadline deadline, bool helped) {
  auto work = make_work("recv", bytes, from);
  std::lock_guard<std::mutex> lock(mu_);
  PYRING_CHECK(closed_.empty(), CommError, where(from, false), ": ", closed_);
  if (from.peer >= 0) {
    PYRING_CHECK(peers_[static_cast<size_t>(from.peer)].link, CommError, where(from, false),
                 ": no point-to-point link");
  }
  auto op = std::make_shared<Op>();
  op->work = work;
  op->addr = from;
  op->data = static_cast<uint8_t*>(data);
  op->bytes = bytes;
  op->deadline = deadline;
  ++in_flight_;
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if (accepts(from, (*it)->peer, (*it)->frame)) {
      auto held = *it;
      held_.erase(it);
      if (auto err = check_locked(held->peer, op, held->frame)) {
        finish_locked(op, err);  // the message is dropped
      } else if (held->complete) {
        if (op->bytes) std::memcpy(op->data, held->data.data(), op->bytes);
        finish_locked(op, nullptr);
      } else {
        held->claimed = op;
        op->landing = held->peer;
        peers_[static_cast<size_t>(held->peer)].landing.push_back(op);
      }
      return work;
    }
  }
  // What arrived whole before the link broke (or before the peer gave up) was claimable
  // above; nothing more comes.
  for (int i = 0; from.peer < 0 && i < size(); ++i) {
    if (auto err = failed_for_any_source_locked(i, from)) {
      --in_flight_;
      std::rethrow_exception(err);
    }
  }
  if (from.peer >= 0) {
    const Peer& p = peers_[static_cast<size_t>(from.peer)];
    if (!p.broken.empty()) {
      --in_flight_;
      PYRING_THROW(CommError, where(from, false), ": the link is broken: ", p.broken);
    }
    if (p.gave_up && from.context == P2pContext::kCollective) {
      --in_flight_;
      throw PeerLost(from.peer, str_cat("rank ", from.peer, " gave up on the communicator"), true);
    }
  }
  recvs_.push_back(op);
  progress_locked();
  if (!op->done && !helped) wake();
  return work;
}

void P2pEngine::post_frame_recv_locked(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  RecvSpec spec;
  spec.bytes = sizeof(P2pFrame);
  spec.copy_to = reinterpret_cast<uint8_t*>(&p.incoming);
  spec.on_piece = [this, peer](const uint8_t*, size_t offset, size_t len) {
    if (offset + len == sizeof(P2pFrame)) on_frame_locked(peer);
  };
  p.link->post_recv(std::move(spec));
}

void P2pEngine::on_frame_locked(int peer) {
  const P2pFrame f = peers_[static_cast<size_t>(peer)].incoming;
  PYRING_CHECK(f.magic == kFrameMagic, CommError, "point-to-point stream from rank ", peer,
               " is corrupt (bad frame)");
  if (f.context == static_cast<uint8_t>(P2pContext::kControl) && f.kind == kClosing) {
    peers_[static_cast<size_t>(peer)].said_goodbye = true;
    post_frame_recv_locked(peer);
    return;
  }
  std::shared_ptr<Op> match;
  for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
    if (accepts((*it)->addr, peer, f)) {
      match = *it;
      recvs_.erase(it);
      break;
    }
  }
  if (match) {
    land_locked(peer, match, f);
  } else {
    hold_locked(peer, f);
  }
  post_frame_recv_locked(peer);
}

// The mismatch of receive `op` with the message `f` from `peer`, if any; records the source.
std::exception_ptr P2pEngine::check_locked(int peer, const std::shared_ptr<Op>& op,
                                           const P2pFrame& f) {
  op->work->set_source(peer);
  if (op->addr.context == P2pContext::kCollective && f.kind != op->addr.kind) {
    return error<CommError>(where(op->addr, false), ": rank ", peer, " runs ",
                            collective_kind_name(f.kind), " where this rank runs ",
                            collective_kind_name(op->addr.kind),
                            " (ranks called collectives in different orders)");
  }
  if (f.bytes != op->bytes) {
    return error<Error>(where(op->addr, false), ": rank ", peer, " sent ", f.bytes,
                        " bytes but the receive expects ", op->bytes);
  }
  return nullptr;
}

void P2pEngine::land_locked(int peer, const std::shared_ptr<Op>& op, const P2pFrame& f) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  RecvSpec spec;
  spec.bytes = f.bytes;
  if (auto err = check_locked(peer, op, f)) {
    finish_locked(op, err);  // the payload is read and dropped
  } else if (f.bytes == 0) {
    finish_locked(op, nullptr);
  } else {
    op->landing = peer;
    op->into_user = true;
    p.landing.push_back(op);
    spec.copy_to = op->data;
    spec.on_piece = [this, op](const uint8_t*, size_t offset, size_t len) {
      if (offset + len == op->bytes) finish_locked(op, nullptr);
    };
  }
  p.link->post_recv(std::move(spec));
}

void P2pEngine::hold_locked(int peer, const P2pFrame& f) {
  auto h = std::make_shared<Held>();
  h->peer = peer;
  h->frame = f;
  h->data.reserve(f.bytes);
  h->complete = f.bytes == 0;
  held_.push_back(h);
  if (f.bytes == 0) return;
  RecvSpec spec;
  spec.bytes = f.bytes;
  spec.copy_to = h->data.data();
  spec.on_piece = [this, h](const uint8_t*, size_t offset, size_t len) {
    if (offset + len != h->frame.bytes) return;
    h->complete = true;
    if (h->claimed && !h->claimed->done) {
      std::memcpy(h->claimed->data, h->data.data(), h->frame.bytes);
      finish_locked(h->claimed, nullptr);
    }
    if (h->frame.context == static_cast<uint8_t>(P2pContext::kControl) &&
        h->frame.kind == kAbortCause) {
      fail_collective_recvs_locked(h->peer);
    }
  };
  peers_[static_cast<size_t>(peer)].link->post_recv(std::move(spec));
}

void P2pEngine::finish_locked(const std::shared_ptr<Op>& op, std::exception_ptr err) {
  if (op->done) return;
  op->done = true;
  --in_flight_;
  op->work->finish(err);
}

void P2pEngine::finish_sent_locked(Peer& p) {
  while (!p.sends.empty() && p.link->bytes_sent() >= p.sends.front()->end) {
    finish_locked(p.sends.front(), nullptr);
    p.sends.pop_front();
  }
}

bool P2pEngine::progress_locked() {
  bool moved = false;
  for (size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    if (!p.link || !p.broken.empty()) continue;
    try {
      moved |= p.link->progress();
    } catch (const std::exception& e) {
      break_peer_locked(static_cast<int>(i), e.what());
      continue;
    }
    finish_sent_locked(p);
    while (!p.landing.empty() && p.landing.front()->done) p.landing.pop_front();
  }
  if (in_flight_ > 0 && ++passes_ % 64 == 0) {
    auto now = Clock::now();
    if (now - last_expire_ >= kExpireEvery) {
      last_expire_ = now;
      expire_locked();
    }
  }
  return moved;
}

void P2pEngine::expire_locked() {
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    const auto& op = *it;
    if (!op->deadline.expired()) {
      ++it;
      continue;
    }
    finish_locked(op, error<TimeoutError>("Timed out: ", where(op->addr, false), " (", op->bytes,
                                          " bytes) got no message"));
    it = recvs_.erase(it);
  }
  for (size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    for (const auto& op : p.landing) {
      if (op->done || !op->deadline.expired()) continue;
      if (!op->into_user) {
        // Only the held copy is still arriving: the receive can go.
        finish_locked(op, error<TimeoutError>("Timed out: ", where(op->addr, false),
                                              " while its message was arriving"));
        continue;
      }
      // The link writes into the caller's buffer: it can never be used again.
      break_peer_locked(static_cast<int>(i), str_cat("Timed out: ", where(op->addr, false),
                                                     " while its message was arriving"));
      break;
    }
    if (!p.sends.empty() && p.sends.front()->deadline.expired()) {
      const auto& op = p.sends.front();
      break_peer_locked(static_cast<int>(i),
                        str_cat("Timed out: ", where(op->addr, true), " (", op->bytes,
                                " bytes) did not leave: rank ", i, " does not receive"));
    }
  }
}

void P2pEngine::break_peer_locked(int peer, const std::string& why) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.broken.empty()) return;
  p.broken = why;
  try {
    p.link->abort();
  } catch (const std::exception&) {
  }
  // The error that broke the link, for the ops it took down.
  auto fail = [&](const std::shared_ptr<Op>& op) {
    bool timed_out = why.rfind("Timed out", 0) == 0;
    finish_locked(op, timed_out ? error<TimeoutError>(why)
                                : error<CommError>(where(op->addr, op->is_send),
                                                   ": the link is broken: ", why));
  };
  finish_sent_locked(p);  // their bytes left before the link broke
  for (const auto& op : p.sends) fail(op);
  p.sends.clear();
  for (const auto& op : p.landing) fail(op);
  p.landing.clear();
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    if ((*it)->addr.peer == peer) {
      fail(*it);
    } else if (auto err = (*it)->addr.peer < 0 ? failed_for_any_source_locked(peer, (*it)->addr)
                                               : nullptr) {
      finish_locked(*it, err);
    } else {
      ++it;
      continue;
    }
    it = recvs_.erase(it);
  }
  for (auto it = held_.begin(); it != held_.end();) {
    it = (*it)->peer == peer && !(*it)->complete ? held_.erase(it) : std::next(it);
  }
}

std::exception_ptr P2pEngine::failed_for_any_source_locked(int peer, const P2pAddress& a) {
  const Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.link || p.broken.empty() || (p.said_goodbye && !p.gave_up)) return nullptr;
  return error<CommError>(where(a, false), ": rank ", peer, " failed (", p.broken,
                          "); a receive from any source cannot tell whether its message would "
                          "have come from it");
}

void P2pEngine::say_goodbye_locked() {
  goodbye_ =
      P2pFrame{kFrameMagic, static_cast<uint8_t>(P2pContext::kControl), kClosing, 0, 0, 0, 0};
  std::vector<size_t> to;
  for (size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    if (!p.link || !p.broken.empty()) continue;
    p.link->post_send(reinterpret_cast<const uint8_t*>(&goodbye_), sizeof(P2pFrame));
    p.posted_bytes += sizeof(P2pFrame);
    to.push_back(i);
  }
  const auto until = Clock::now() + kGoodbyeTime;
  for (;;) {
    bool left = true;
    for (size_t i : to) {
      const Peer& p = peers_[i];
      left &= !p.broken.empty() || p.link->bytes_sent() >= p.posted_bytes;
    }
    if (left || Clock::now() >= until) return;
    if (!progress_locked()) cpu_relax();
  }
}

void P2pEngine::close(const std::string& why) {
  if (!stop_.exchange(true)) {
    sleeping_.store(true);
    wake();
    if (thread_.joinable()) thread_.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.empty()) return;
  closed_ = why;
  auto fail = [&](const std::shared_ptr<Op>& op) {
    finish_locked(op, error<CommError>(where(op->addr, op->is_send), ": ", why));
  };
  for (auto& p : peers_) {
    for (const auto& op : p.sends) fail(op);
    for (const auto& op : p.landing) fail(op);
    p.sends.clear();
    p.landing.clear();
  }
  for (const auto& op : recvs_) fail(op);
  recvs_.clear();
  held_.clear();
  if (abort_cause_.empty()) say_goodbye_locked();
  for (auto& p : peers_) {
    if (p.link) p.link->announce_closed();
  }
  runner_->stop();
}

// Abort announcements: why a rank gave up, sent to its peers on the p2p links.
void P2pEngine::announce_abort(const std::string& cause) {
  std::vector<int> to;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_cause_.empty() || !closed_.empty()) return;
    abort_cause_ = cause.empty() ? std::string("(no cause given)") : cause;
    for (size_t p = 0; p < peers_.size(); ++p) {
      if (peers_[p].link && peers_[p].broken.empty()) to.push_back(static_cast<int>(p));
    }
  }
  for (int p : to) {
    try {
      send(abort_cause_.data(), abort_cause_.size(),
           P2pAddress{p, 0, P2pContext::kControl, kAbortCause}, Deadline::after(5.0), false);
    } catch (const Error&) {  // a peer already unreachable learns nothing
    }
  }
}

std::string P2pEngine::announced_by(int peer, std::chrono::milliseconds wait) {
  const auto until = Clock::now() + wait;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& h : held_) {
        if (h->peer == peer && h->complete &&
            h->frame.context == static_cast<uint8_t>(P2pContext::kControl) &&
            h->frame.kind == kAbortCause) {
          return std::string(reinterpret_cast<const char*>(h->data.data()), h->frame.bytes);
        }
      }
    }
    if (Clock::now() >= until) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void P2pEngine::fail_collective_recvs_locked(int peer) {
  peers_[static_cast<size_t>(peer)].gave_up = true;
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    const std::shared_ptr<Op>& op = *it;
    if (op->addr.peer == peer && op->addr.context == P2pContext::kCollective) {
      finish_locked(op, std::make_exception_ptr(PeerLost(
                            peer, str_cat("rank ", peer, " gave up on the communicator"), true)));
      it = recvs_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace pyring
