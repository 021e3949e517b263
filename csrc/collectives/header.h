// The header every collective sends ahead of its data on each link it uses.
//
// It carries the collective's sequence number on this communicator, its kind, dtype, op, count,
// root and wire (`variant`: 0 for full precision, 1 + the Wire of a compressed all_reduce), so
// that a rank whose neighbour runs a different collective (a different order,
// size or type, or stale bytes from a collective the neighbour abandoned) raises CommError
// naming both instead of combining unrelated bytes.
#pragma once

#include <cstdint>
#include <string>

#include "core/link.h"
#include "core/types.h"

namespace pyring {

struct WireHeader {
  uint32_t magic;
  uint32_t kind;
  uint64_t seq;
  uint64_t count;
  uint8_t dtype;
  uint8_t op;
  uint16_t variant;  // 0, or 1 + the Wire of a compressed all_reduce
  int32_t root;
};
static_assert(sizeof(WireHeader) == 32, "WireHeader is part of the wire format");

// "all_reduce #3 (count=..., dtype=..., op=...)" for any 32 bytes; "bytes that are not a
// collective header" when the magic is wrong. Total over every input (fuzzed: tests/fuzz/).
std::string describe_header(const WireHeader& h);

// Posts this rank's header to `to` (if not null) and the check of the header expected from
// `from` (if not null). Must be posted before the collective's data on the same links; lives
// on the collective's stack until drive() returns.
class HeaderExchange {
 public:
  HeaderExchange(uint64_t seq, CollectiveKind kind, DType dtype, ReduceOp op, uint64_t count,
                 int root = -1, uint16_t variant = 0);
  void post(Link* from, Link* to, int this_rank);

 private:
  WireHeader mine_{};
  WireHeader incoming_{};
  int this_rank_ = -1;
};

}  // namespace pyring
