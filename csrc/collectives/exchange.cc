#include "collectives/exchange.h"

#include <exception>

#include "core/errors.h"
#include "core/p2p.h"

namespace pyring {

namespace {
// Acknowledgements travel with the collective's tag and this bit, so that they never match
// the descriptors and payloads that share the pair's stream.
constexpr int64_t kAckTag = int64_t{1} << 62;
// Lane 1's blocks carry bit 61: below the acknowledgement bit, above any sequence number.
constexpr int kLaneShift = 61;
// What a receiver answers a descriptor with. Unless kAckRead, the payload follows through the
// link; after kAckFailed the pair stops trying (kAckSize is the caller's error, which the
// payload's receive reports).
constexpr uint8_t kAckRead = 1, kAckFailed = 0, kAckSize = 2;
}  // namespace

struct Exchange::Block {
  Block(bool sender_, int peer_, const Span& span_) : sender(sender_), peer(peer_), span(span_) {}
  bool sender;
  int peer;
  Span span;
  SingleCopyDesc desc{};
  uint8_t ack = kAckRead;
  std::shared_ptr<Work> pending;  // a sender's ack receive, a receiver's descriptor receive
  bool handled = false;
};

Exchange::Exchange(Communicator& comm, CollectiveKind kind, Deadline deadline, int lane)
    : comm_(comm), kind_(kind), lane_(lane), deadline_(deadline) {
  PYRING_CHECK_ARG(lane >= 0 && lane < kLanes, "exchange lane ", lane, " out of range");
}

Exchange::~Exchange() = default;

P2pAddress Exchange::addr(int peer, bool ack) const {
  const auto tag = static_cast<int64_t>(comm_.seq()) | (ack ? kAckTag : 0) |
                   (lane_ > 0 ? int64_t{1} << (kLaneShift - lane_ + 1) : 0);
  return P2pAddress{peer, tag, P2pContext::kCollective, static_cast<uint8_t>(kind_)};
}

void Exchange::post_recv(int peer, void* data, size_t bytes, bool ack) {
  works_.push_back(comm_.p2p().recv(data, bytes, addr(peer, ack), deadline_, true));
}

void Exchange::post_send(int peer, const void* data, size_t bytes, bool ack) {
  works_.push_back(comm_.p2p().send(data, bytes, addr(peer, ack), deadline_, true));
}

void Exchange::recv(int peer, const Span& s) {
  if (!comm_.single_copy_with(peer, s.bytes)) {
    post_recv(peer, s.data, s.bytes, false);
    return;
  }
  auto b = std::make_unique<Block>(false, peer, s);
  post_recv(peer, &b->desc, sizeof(b->desc), false);
  b->pending = works_.back();
  blocks_.push_back(std::move(b));
}

void Exchange::send(int peer, const Span& s) {
  if (!comm_.single_copy_with(peer, s.bytes)) {
    post_send(peer, s.data, s.bytes, false);
    return;
  }
  auto b = std::make_unique<Block>(true, peer, s);
  b->desc = describe_single_copy(s.data, s.bytes);
  post_send(peer, &b->desc, sizeof(b->desc), false);
  post_recv(peer, &b->ack, sizeof(b->ack), true);
  b->pending = works_.back();
  blocks_.push_back(std::move(b));
}

bool Exchange::step() {
  for (auto& b : blocks_) {
    if (b->handled || !b->pending->is_completed()) continue;
    b->handled = true;
    if (b->pending->failed()) continue;  // wait() reports it
    if (!b->sender) {
      if (b->desc.bytes != b->span.bytes) {
        b->ack = kAckSize;
      } else {
        b->ack = read_single_copy(b->desc, b->span.data) ? kAckRead : kAckFailed;
        if (b->ack == kAckRead) comm_.add_single_copy_read(b->span.bytes);
      }
      post_send(b->peer, &b->ack, sizeof(b->ack), true);
      if (b->ack == kAckFailed) comm_.single_copy_failed(b->peer);
      if (b->ack != kAckRead) post_recv(b->peer, b->span.data, b->span.bytes, false);
    } else if (b->ack != kAckRead) {
      if (b->ack == kAckFailed) comm_.single_copy_failed(b->peer);
      post_send(b->peer, b->span.data, b->span.bytes, false);
    }
  }
  for (const auto& b : blocks_) {
    if (!b->handled) return false;
  }
  for (const auto& w : works_) {
    if (!w->is_completed()) return false;
  }
  return true;
}

void Exchange::wait() {
  comm_.p2p().drive_until_done([this] { return step(); });
  std::exception_ptr first;
  for (const auto& w : works_) {
    try {
      w->wait(-1);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace pyring
