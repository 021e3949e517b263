#include "collectives/compressed_half.h"

#include <algorithm>
#include <memory>

#include "collectives/driver.h"
#include "collectives/exchange.h"
#include "collectives/selector.h"
#include "kernels/wire_cast.h"

namespace pyring {

namespace {

DType half_dtype(Wire w) {
  return w == Wire::kFp16 ? DType::kFloat16 : DType::kBFloat16;
}

}  // namespace

void half_decode(Wire w, const uint8_t* enc, size_t n, float* out) {
  wire_cast(half_dtype(w), DType::kFloat32, enc, out, n);
}

void half_sum(Wire w, const float* own, int divisor, const uint8_t* const* copies, size_t count,
              size_t n, float* out) {
  constexpr size_t kBlock = 2048;  // the running sum and a decoded block stay in L1
  const float div = static_cast<float>(divisor);
  const DType dt = half_dtype(w);
  float s[kBlock], t[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = std::min(kBlock, n - b);
    for (size_t i = 0; i < len; ++i) s[i] = own[b + i];
    for (size_t k = 0; k < count; ++k) {
      wire_cast(dt, DType::kFloat32, copies[k] + 2 * b, t, len);
      for (size_t i = 0; i < len; ++i) s[i] = t[i] + s[i];  // accumulate's operand order
    }
    if (divisor != 1) {
      for (size_t i = 0; i < len; ++i) out[b + i] = s[i] / div;
    } else {
      for (size_t i = 0; i < len; ++i) out[b + i] = s[i];
    }
  }
}

size_t half_encode(Wire w, const float* in, size_t n, uint8_t* out) {
  wire_cast(DType::kFloat32, half_dtype(w), in, out, n);
  return 2 * n;
}

size_t half_segments(size_t widest, double slowest_bytes_per_s) {
  auto ceil_div = [](size_t a, size_t b) { return (a + b - 1) / b; };
  if (slowest_bytes_per_s >= kHalfFineBelowBytesPerS) {
    return std::max<size_t>(1, ceil_div(widest, kHalfSegmentElems));
  }
  return std::clamp<size_t>(ceil_div(widest, kHalfFineSegmentElems), 1, kHalfFineSegments);
}

void half_flat(Communicator& comm, WireCodec& codec, float* x, size_t n,
               const std::vector<int>& parts, int me, Wire wire, int divisor, Deadline deadline) {
  const size_t P = parts.size(), m = static_cast<size_t>(me);
  const Chunks ch{n, P};
  const size_t own = ch.size(m);
  // Every chunk is cut into the same number of segments, so that a segment index means the
  // same thing on every rank.
  const size_t widest = ch.size(0);
  const double slowest = P < 2 ? kHalfFineBelowBytesPerS
                               : comm.options().links[slowest_class(comm, parts)].bytes_per_s;
  const size_t S = half_segments(widest, slowest);
  auto seg = [&](size_t j) { return Chunks{ch.size(j), S}; };
  uint8_t* send = codec.wire(2 * n);        // chunk j at 2 * offset(j)
  uint8_t* recv = codec.wire(2 * P * own);  // copy i of the owned chunk at 2 * i * own
  uint8_t* back = codec.wire(2 * n);        // chunk j's result at 2 * offset(j)
  float* acc = codec.values(own);
  const Chunks mine = seg(m);
  // Phase A: segment s of chunk j to its owner. Receives are posted first, one Exchange per
  // segment so that each can be waited for on its own. Messages of a pair match in the order
  // they were posted, so the receives follow the order of the sends: every segment of phase
  // A, then every segment of phase B.
  std::vector<std::unique_ptr<Exchange>> up, down;
  for (size_t s = 0; s < S; ++s) {
    up.push_back(std::make_unique<Exchange>(comm, CollectiveKind::kAllReduce, deadline));
    for (size_t i = 0; i < P; ++i) {
      if (i != m) {
        up[s]->recv(parts[i], Span{recv + 2 * (i * own + mine.offset(s)), 2 * mine.size(s)});
      }
    }
  }
  for (size_t s = 0; s < S; ++s) {
    down.push_back(std::make_unique<Exchange>(comm, CollectiveKind::kAllReduce, deadline));
    for (size_t i = 0; i < P; ++i) {
      const Chunks c = seg(i);
      if (i != m) {
        down[s]->recv(parts[i], Span{back + 2 * (ch.offset(i) + c.offset(s)), 2 * c.size(s)});
      }
    }
  }
  // This rank's own chunk travels nowhere: it is not encoded, and enters its sum exact.
  for (size_t s = 0; s < S; ++s) {
    for (size_t k = 1; k < P; ++k) {
      const size_t j = (m + k) % P;
      const Chunks c = seg(j);
      const size_t off = ch.offset(j) + c.offset(s);
      codec.half_encode(wire, x + off, c.size(s), send + 2 * off);
      up[s]->send(parts[j], Span{send + 2 * off, 2 * c.size(s)});
    }
  }
  // Phase B: each segment of the owned chunk, once its copies are in, added in float32 to this
  // rank's own values, encoded again and sent to every rank at once.
  for (size_t s = 0; s < S; ++s) {
    up[s]->wait();
    const size_t len = mine.size(s);
    float* a = acc + mine.offset(s);
    std::vector<const uint8_t*> copies;
    for (size_t i = 0; i < P; ++i) {
      if (i != m) copies.push_back(recv + 2 * (i * own + mine.offset(s)));
    }
    codec.half_sum(wire, x + ch.offset(m) + mine.offset(s), divisor, copies.data(), copies.size(),
                   len, a);
    uint8_t* out = back + 2 * (ch.offset(m) + mine.offset(s));
    codec.half_encode(wire, a, len, out);
    for (size_t i = 0; i < P; ++i) {
      if (i != m) down[s]->send(parts[i], Span{out, 2 * len});
    }
  }
  // Every segment of every chunk decoded as it lands.
  for (size_t s = 0; s < S; ++s) {
    down[s]->wait();
    for (size_t j = 0; j < P; ++j) {
      const Chunks c = seg(j);
      const size_t off = ch.offset(j) + c.offset(s);
      codec.half_decode(wire, back + 2 * off, c.size(s), x + off, j == m);
    }
  }
}

}  // namespace pyring
