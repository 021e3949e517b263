#include "collectives/codec_flat.h"

#include <algorithm>
#include <memory>

#include "collectives/driver.h"
#include "collectives/exchange.h"
#include "collectives/selector.h"

namespace pyring {

size_t codec_segments(size_t widest, double slowest_bytes_per_s) {
  auto ceil_div = [](size_t a, size_t b) { return (a + b - 1) / b; };
  if (slowest_bytes_per_s >= kCodecFineBelowBytesPerS) {
    return std::max<size_t>(1, ceil_div(widest, kCodecSegmentElems));
  }
  return std::clamp<size_t>(ceil_div(widest, kCodecFineSegmentElems), 1, kCodecFineSegments);
}

namespace {

// Segment s of a chunk of `size` values, cut into `count` at multiples of `block`: the last
// takes what is left (every segment but the last holds the same multiple of block).
struct Pieces {
  size_t size_, count, block;
  size_t each() const {
    const size_t even = (size_ + count - 1) / count;
    return (even + block - 1) / block * block;
  }
  size_t offset(size_t s) const { return std::min(size_, s * each()); }
  size_t size(size_t s) const { return offset(s + 1) - offset(s); }
};

// Encoded regions of `bytes(k)` for items k, back to back.
struct Layout {
  std::vector<size_t> at{0};
  void add(size_t bytes) { at.push_back(at.back() + bytes); }
  size_t total() const { return at.back(); }
};

}  // namespace

void codec_flat(Communicator& comm, WireCodec& codec, float* x, size_t n,
                const std::vector<int>& parts, int me, const Codec& wire, int divisor,
                WireState* state, Deadline deadline) {
  const size_t P = parts.size(), m = static_cast<size_t>(me);
  const Chunks ch{n, P};
  // Every chunk is cut into the same number of segments, so that a segment index means the
  // same thing on every rank.
  const size_t widest = ch.size(0);
  const double slowest = P < 2 ? kCodecFineBelowBytesPerS
                               : comm.options().links[slowest_class(comm, parts)].bytes_per_s;
  const size_t S = codec_segments(widest, slowest);
  auto seg = [&](size_t j) { return Pieces{ch.size(j), S, wire.block()}; };
  const Pieces mine = seg(m);
  Layout out, in, back;  // [j * S + s], [i * S + s], [j * S + s]
  for (size_t j = 0; j < P; ++j) {
    for (size_t s = 0; s < S; ++s) {
      out.add(wire.encoded_bytes(seg(j).size(s)));
      in.add(wire.encoded_bytes(mine.size(s)));
      back.add(wire.encoded_bytes(seg(j).size(s)));
    }
  }
  uint8_t* send = codec.wire(out.total());
  uint8_t* recv = codec.wire(in.total());
  uint8_t* result = codec.wire(back.total());
  float* acc = codec.values(ch.size(m));
  uint16_t* worker = nullptr;
  uint16_t* server = nullptr;
  if (wire.error_feedback()) {
    state->bind_codec(wire.name(), n, static_cast<int>(P), me);
    const std::shared_ptr<DeviceQueue> queue =
        codec.on_device() ? comm.device_queue(codec.site().device) : nullptr;
    const WireState::Residuals r = state->residuals(queue);
    worker = r.worker;
    server = r.server;
  }
  auto span = [](uint8_t* p, size_t bytes) { return Span{p, bytes}; };
  // Phase A: segment s of chunk j to its owner. Receives are posted first, one Exchange per
  // segment so that each can be waited for on its own. Messages of a pair match in the order
  // they were posted, so the receives follow the order of the sends: every segment of phase
  // A, then every segment of phase B.
  std::vector<std::unique_ptr<Exchange>> up, down;
  for (size_t s = 0; s < S; ++s) {
    up.push_back(std::make_unique<Exchange>(comm, CollectiveKind::kAllReduce, deadline));
    for (size_t i = 0; i < P; ++i) {
      const size_t q = i * S + s;
      if (i != m) up[s]->recv(parts[i], span(recv + in.at[q], in.at[q + 1] - in.at[q]));
    }
  }
  for (size_t s = 0; s < S; ++s) {
    down.push_back(std::make_unique<Exchange>(comm, CollectiveKind::kAllReduce, deadline));
    for (size_t j = 0; j < P; ++j) {
      const size_t q = j * S + s;
      if (j != m) down[s]->recv(parts[j], span(result + back.at[q], back.at[q + 1] - back.at[q]));
    }
  }
  // This rank's own chunk travels nowhere: it is not encoded, and enters its sum exact.
  for (size_t s = 0; s < S; ++s) {
    for (size_t k = 1; k < P; ++k) {
      const size_t j = (m + k) % P, q = j * S + s;
      const size_t off = ch.offset(j) + seg(j).offset(s);
      codec.encode(wire, x + off, worker ? worker + off : nullptr, seg(j).size(s),
                   send + out.at[q]);
      up[s]->send(parts[j], span(send + out.at[q], out.at[q + 1] - out.at[q]));
    }
  }
  // Phase B: each segment of the owned chunk, once its copies are in, added in float32 to this
  // rank's own values, encoded again (the server residual) and sent to every rank at once.
  for (size_t s = 0; s < S; ++s) {
    up[s]->wait();
    const size_t len = mine.size(s);
    float* a = acc + mine.offset(s);
    std::vector<const uint8_t*> copies;
    for (size_t i = 0; i < P; ++i) {
      if (i != m) copies.push_back(recv + in.at[i * S + s]);
    }
    codec.sum(wire, x + ch.offset(m) + mine.offset(s), divisor, copies.data(), copies.size(), len,
              a);
    const size_t q = m * S + s;
    codec.encode(wire, a, server ? server + mine.offset(s) : nullptr, len, result + back.at[q]);
    for (size_t i = 0; i < P; ++i) {
      if (i != m) down[s]->send(parts[i], span(result + back.at[q], back.at[q + 1] - back.at[q]));
    }
  }
  // Every segment of every chunk decoded as it lands.
  for (size_t s = 0; s < S; ++s) {
    down[s]->wait();
    for (size_t j = 0; j < P; ++j) {
      const size_t q = j * S + s;
      codec.decode(wire, result + back.at[q], seg(j).size(s), x + ch.offset(j) + seg(j).offset(s),
                   j == m);
    }
  }
}

}  // namespace pyring
