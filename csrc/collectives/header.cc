#include "collectives/header.h"

#include <cstring>
#include <string>

#include "codecs/codec.h"
#include "core/errors.h"

namespace pyring {

namespace {
constexpr uint32_t kHeaderMagic = 0x50524831;  // "PRH1"
}  // namespace

std::string describe_header(const WireHeader& h) {
  if (h.magic != kHeaderMagic) return "bytes that are not a collective header";
  std::string s = str_cat(collective_kind_name(h.kind), " #", h.seq);
  if (h.kind == static_cast<uint32_t>(CollectiveKind::kBarrier)) return s;
  s += str_cat(" (count=", h.count,
               ", dtype=", h.dtype < kNumDTypes ? dtype_name(static_cast<DType>(h.dtype)) : "?");
  if (h.kind == static_cast<uint32_t>(CollectiveKind::kAllReduce) ||
      h.kind == static_cast<uint32_t>(CollectiveKind::kReduceScatter)) {
    s += str_cat(", op=", h.op < kNumReduceOps ? op_name(static_cast<ReduceOp>(h.op)) : "?");
  }
  if (h.variant > 0) {
    s += str_cat(", wire=", wire_name(static_cast<Wire>(static_cast<int>(h.variant) - 1)));
  }
  if (h.root >= 0) {
    const bool to_root = h.kind == static_cast<uint32_t>(CollectiveKind::kAllReduce) ||
                         h.kind == static_cast<uint32_t>(CollectiveKind::kGather);
    s += str_cat(to_root ? ", dst=" : ", src=", h.root);
  }
  return s + ")";
}

HeaderExchange::HeaderExchange(uint64_t seq, CollectiveKind kind, DType dtype, ReduceOp op,
                               uint64_t count, int root, uint16_t variant) {
  mine_.magic = kHeaderMagic;
  mine_.kind = static_cast<uint32_t>(kind);
  mine_.seq = seq;
  mine_.count = count;
  mine_.dtype = static_cast<uint8_t>(dtype);
  mine_.op = static_cast<uint8_t>(op);
  mine_.variant = variant;
  mine_.root = root;
}

void HeaderExchange::post(Link* from, Link* to, int this_rank) {
  this_rank_ = this_rank;
  if (to) to->post_send(reinterpret_cast<const uint8_t*>(&mine_), sizeof(mine_));
  if (!from) return;
  RecvSpec spec;
  spec.bytes = sizeof(incoming_);
  spec.copy_to = reinterpret_cast<uint8_t*>(&incoming_);
  int peer = from->peer();
  spec.on_piece = [this, peer](const uint8_t*, size_t off, size_t len) {
    if (off + len < sizeof(incoming_)) return;
    if (std::memcmp(&incoming_, &mine_, sizeof(mine_)) != 0) {
      PYRING_THROW(CommError, "rank ", peer, " sent ", describe_header(incoming_), " but rank ",
                   this_rank_, " (this process) runs ", describe_header(mine_),
                   ": every rank must call the same collectives in the same order with the "
                   "same sizes");
    }
  };
  from->post_recv(std::move(spec));
}

}  // namespace pyring
