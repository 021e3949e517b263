#include "collectives/compressed.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "collectives/codec_flat.h"
#include "collectives/collectives.h"
#include "collectives/driver.h"
#include "collectives/exchange.h"
#include "collectives/header.h"
#include "collectives/selector.h"
#include "collectives/wire_codec.h"
#include "core/errors.h"
#include "kernels/onebit.h"

namespace pyring {

namespace {

// The mask caches in WireState's layout, each list indexed [j * S + s]: enc (chunk j, segment
// s, to its owner), recv (copy j of the owned chunk), server (the owned chunk's result, [s]),
// gather (chunk j's result).
struct Caches {
  std::vector<uint8_t*> enc, recv, server, gather;
};

Caches split(WireState& st, size_t n, int participants, int index) {
  Caches c;
  uint8_t* at = st.masks.data();
  const size_t PS = static_cast<size_t>(participants) * onebit_segments(n, participants);
  const std::vector<size_t> sizes = onebit_cache_sizes(n, participants, index);
  for (size_t k = 0; k < sizes.size(); ++k) {
    auto& list = k < PS ? c.enc : k < 2 * PS ? c.recv : k < sizes.size() - PS ? c.server : c.gather;
    list.push_back(at);
    at += onebit_cache_bytes(sizes[k]);
  }
  return c;
}

// Slots of max_bytes(size(k)) for items k, laid out back to back.
struct Slots {
  std::vector<size_t> at{0};
  void add(size_t elems) { at.push_back(at.back() + onebit_max_bytes(elems)); }
  size_t total() const { return at.back(); }
};

// The onebit schedule over `parts` (this rank is parts[me]) on x in place, pipelined by
// segment: the payload of segment s follows its size (on lane 1 of the exchange), so a
// receiver posts each payload as its size lands; the owner reduces segment s and sends the
// result on while later segments still travel. The owner's own chunk travels nowhere, so it
// enters its sum exact, unencoded: its worker residual and its enc and recv mask caches stay
// unused (zero). The sum is divided by `divisor` (1: sum; the world size: avg).
void onebit_flat(Communicator& comm, WireCodec& codec, float* x, size_t n,
                 const std::vector<int>& parts, int me, int divisor, WireState* state,
                 Deadline deadline) {
  const size_t P = parts.size(), m = static_cast<size_t>(me), S = onebit_segments(n, P);
  const Chunks ch{n, P};
  auto seg = [&](size_t j) { return Chunks{ch.size(j), S}; };
  const Chunks mine = seg(m);
  state->bind(n, static_cast<int>(P), me);
  const Caches c = split(*state, n, static_cast<int>(P), me);
  Slots out, in, res, back;  // [j * S + s], [i * S + s], [s], [j * S + s]
  for (size_t j = 0; j < P; ++j) {
    for (size_t s = 0; s < S; ++s) {
      out.add(j == m ? 0 : seg(j).size(s));  // the own chunk is not encoded
      in.add(mine.size(s));
      back.add(seg(j).size(s));
    }
  }
  for (size_t s = 0; s < S; ++s) res.add(mine.size(s));
  uint8_t* send = codec.wire(out.total());
  uint8_t* recv = codec.wire(in.total());
  uint8_t* result = codec.wire(res.total());
  uint8_t* gathered = codec.wire(back.total());
  float* acc = codec.on_device() ? codec.values(ch.size(m)) : nullptr;  // the owner's sum
  const std::shared_ptr<DeviceQueue> queue =
      codec.on_device() ? comm.device_queue(codec.site().device) : nullptr;
  const WireState::Residuals resid = state->residuals(queue);
  uint16_t* const worker = resid.worker;
  uint16_t* const server = resid.server;
  // The deferred scale of worker segment q (= j * S + s) and server segment s (host memory).
  auto worker_pending = [&](size_t q) { return resid.pending + q; };
  auto server_pending = [&](size_t s) { return resid.pending + P * S + s; };
  std::vector<uint64_t> out_size(P * S), in_size(P * S), res_size(S), back_size(P * S);
  auto span = [](void* p, size_t bytes) { return Span{static_cast<uint8_t*>(p), bytes}; };
  auto make = [&](int lane) {
    std::vector<std::unique_ptr<Exchange>> v;
    for (size_t s = 0; s < S; ++s) {
      v.push_back(std::make_unique<Exchange>(comm, CollectiveKind::kAllReduce, deadline, lane));
    }
    return v;
  };
  auto sizes_up = make(1), sizes_down = make(1), up = make(0), down = make(0);
  // Every size receive up front (lane 1 matches in posting order: phase A's, then B's).
  for (size_t s = 0; s < S; ++s) {
    for (size_t i = 0; i < P; ++i) {
      if (i != m) sizes_up[s]->recv(parts[i], span(&in_size[i * S + s], sizeof(uint64_t)));
    }
  }
  for (size_t s = 0; s < S; ++s) {
    for (size_t j = 0; j < P; ++j) {
      if (j != m) sizes_down[s]->recv(parts[j], span(&back_size[j * S + s], sizeof(uint64_t)));
    }
  }
  // Phase A: segment s of every other chunk j encoded (the worker residual) and sent to j's
  // owner.
  for (size_t s = 0; s < S; ++s) {
    for (size_t k = 1; k < P; ++k) {
      const size_t j = (m + k) % P, q = j * S + s;
      const size_t off = ch.offset(j) + seg(j).offset(s);
      out_size[q] = codec.onebit_encode(x + off, worker + off, worker_pending(q), seg(j).size(s),
                                        send + out.at[q], c.enc[q]);
      sizes_up[s]->send(parts[j], span(&out_size[q], sizeof(uint64_t)));
      up[s]->send(parts[j], span(send + out.at[q], out_size[q]));
    }
  }
  // Phase B: each segment of the owned chunk, once its copies are in, added in float32 to this
  // rank's own values (in participant order), encoded again (the server residual) and sent to
  // every participant.
  for (size_t s = 0; s < S; ++s) {
    sizes_up[s]->wait();
    for (size_t i = 0; i < P; ++i) {
      if (i != m) up[s]->recv(parts[i], span(recv + in.at[i * S + s], in_size[i * S + s]));
    }
    up[s]->wait();
    std::vector<uint8_t*> copies, caches;
    for (size_t i = 0; i < P; ++i) {
      if (i == m) continue;
      copies.push_back(recv + in.at[i * S + s]);
      caches.push_back(c.recv[i * S + s]);
    }
    const float* own = x + ch.offset(m) + mine.offset(s);
    res_size[s] = codec.onebit_reduce_encode(own, divisor, copies.data(), caches.data(),
                                             copies.size(), mine.size(s), server + mine.offset(s),
                                             server_pending(s), result + res.at[s], c.server[s],
                                             acc ? acc + mine.offset(s) : nullptr);
    for (size_t i = 0; i < P; ++i) {
      if (i == m) continue;
      sizes_down[s]->send(parts[i], span(&res_size[s], sizeof(uint64_t)));
      down[s]->send(parts[i], span(result + res.at[s], res_size[s]));
    }
  }
  // Every segment of every chunk decoded as it lands.
  for (size_t s = 0; s < S; ++s) {
    sizes_down[s]->wait();
    for (size_t j = 0; j < P; ++j) {
      if (j != m) {
        down[s]->recv(parts[j], span(gathered + back.at[j * S + s], back_size[j * S + s]));
      }
    }
    down[s]->wait();
    for (size_t j = 0; j < P; ++j) {
      uint8_t* from = j == m ? result + res.at[s] : gathered + back.at[j * S + s];
      codec.onebit_decode(from, seg(j).size(s), 1.0f, false, x + ch.offset(j) + seg(j).offset(s),
                          c.gather[j * S + s], j == m);
    }
  }
}

// The schedule of compressed.h over `parts` (this rank is parts[me]), on x in place.
void flat(Communicator& comm, WireCodec& codec, float* x, size_t n, const std::vector<int>& parts,
          int me, Wire wire, int divisor, WireState* state, Deadline deadline) {
  const Codec& c = codec_of(wire);
  if (c.schedule() == Schedule::kOnebit) {
    return onebit_flat(comm, codec, x, n, parts, me, divisor, state, deadline);
  }
  codec_flat(comm, codec, x, n, parts, me, c, divisor, state, deadline);
}

// Full precision inside this rank's group, the schedule between the groups' leaders.
void hierarchical(Communicator& comm, WireCodec& codec, float* x, size_t n,
                  const std::vector<std::vector<int>>& groups, Wire wire, int divisor,
                  WireState* state, Deadline deadline) {
  const int rank = comm.rank();
  const std::vector<int>* group = nullptr;
  std::vector<int> leaders;
  int me = -1;
  for (const auto& g : groups) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) {
      group = &g;
      me = static_cast<int>(leaders.size());
    }
    leaders.push_back(g.front());
  }
  PYRING_CHECK(group != nullptr, Error, "rank ", rank, " is in no top-level group");
  const size_t bytes = n * sizeof(float);
  uint8_t* host = codec.wire(bytes);  // x on the host (itself on a host site)
  const Span whole{host, bytes};
  if (rank != group->front()) {
    codec.download(host, x, bytes);
    {
      Exchange ex(comm, CollectiveKind::kAllReduce, deadline);
      ex.send(group->front(), whole);
      ex.wait();
    }
    Exchange ex(comm, CollectiveKind::kAllReduce, deadline);
    ex.recv(group->front(), whole);
    ex.wait();
    codec.upload(x, host, bytes);
    return;
  }
  const size_t members = group->size() - 1;
  float* parts = reinterpret_cast<float*>(codec.wire(members * bytes));
  {
    Exchange ex(comm, CollectiveKind::kAllReduce, deadline);
    for (size_t k = 0; k < members; ++k) {
      ex.recv((*group)[k + 1], Span{reinterpret_cast<uint8_t*>(parts + k * n), bytes});
    }
    ex.wait();
  }
  // In rank order: the same sum on every run.
  for (size_t k = 0; k < members; ++k) codec.add(x, parts + k * n, n);
  flat(comm, codec, x, n, leaders, me, wire, divisor, state, deadline);
  codec.download(host, x, bytes);
  Exchange ex(comm, CollectiveKind::kAllReduce, deadline);
  for (size_t k = 0; k < members; ++k) ex.send((*group)[k + 1], whole);
  ex.wait();
}

}  // namespace

void check_compressed(const Communicator& comm, const BufferView& x, size_t exact_tail, Wire wire,
                      ReduceOp op, WireState* state, Algo algo) {
  PYRING_CHECK_ARG(op == ReduceOp::kSum || op == ReduceOp::kAvg, "all_reduce: wire ",
                   wire_name(wire), " takes op sum or avg, got ", op_name(op));
  const DType dt = x.dtype;
  PYRING_CHECK_ARG(dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kFloat16 ||
                       dt == DType::kBFloat16,
                   "all_reduce: wire ", wire_name(wire), " takes a floating tensor, got ",
                   dtype_name(dt));
  PYRING_CHECK_ARG(exact_tail <= x.count, "all_reduce: exact_tail ", exact_tail, " exceeds the ",
                   x.count, " elements");
  const Codec& c = codec_of(wire);
  if (!c.error_feedback()) return;
  PYRING_CHECK_ARG(state != nullptr, "all_reduce: wire ", c.name(),
                   " keeps error feedback and needs a state");
  if (comm.size() == 1) return;
  const std::vector<std::vector<int>> groups = compressed_groups(comm, algo);
  auto bind = [&](int participants, int index) {
    const size_t n = x.count - exact_tail;
    if (c.schedule() == Schedule::kOnebit) return state->bind(n, participants, index);
    state->bind_codec(c.name(), n, participants, index);
  };
  if (groups.empty()) return bind(comm.size(), comm.rank());
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].front() == comm.rank()) {
      return bind(static_cast<int>(groups.size()), static_cast<int>(g));
    }
  }
}

void compressed_allreduce(Communicator& comm, const BufferView& x, size_t exact_tail, Wire wire,
                          ReduceOp op, WireState* state, Algo algo, Deadline deadline) {
  if (codec_of(wire).schedule() == Schedule::kExact) {
    return allreduce(comm, x, x, op, algo, deadline);
  }
  const DType dt = x.dtype;
  const size_t head = x.count - exact_tail;
  if (comm.size() == 1) return;  // sum and avg over one rank
  HeaderExchange header(comm.seq(), CollectiveKind::kAllReduce, dt, op, x.count, comm.call_root(),
                        static_cast<uint16_t>(static_cast<int>(wire) + 1));
  check_ring_header(comm, header, deadline);
  const std::vector<std::vector<int>> groups = select_compressed(comm, wire_name(wire), head, algo);
  std::shared_ptr<DeviceQueue> queue;
  if (!x.device.is_cpu()) {
    PYRING_CHECK_ARG(dt != DType::kFloat64, "all_reduce: wire ", wire_name(wire),
                     " on a device takes float32, float16 or bfloat16, got float64");
    queue = comm.device_queue(x.device);
  }
  WireCodec codec = queue ? WireCodec(*queue) : WireCodec(comm.host_arena());
  float* f = static_cast<float*>(x.data);
  if (dt != DType::kFloat32) {
    f = codec.values(head);
    codec.to_float(x.data, dt, f, head);
  }
  const int divisor = op == ReduceOp::kAvg ? comm.size() : 1;
  if (groups.empty()) {
    std::vector<int> all(static_cast<size_t>(comm.size()));
    for (int r = 0; r < comm.size(); ++r) all[static_cast<size_t>(r)] = r;
    flat(comm, codec, f, head, all, comm.rank(), wire, divisor, state, deadline);
  } else {
    hierarchical(comm, codec, f, head, groups, wire, divisor, state, deadline);
  }
  if (dt != DType::kFloat32) codec.from_float(f, dt, x.data, head);
  if (exact_tail > 0) {
    BufferView tail = x;
    tail.count = exact_tail;
    tail.device = Device{};
    tail.stream = 0;
    tail.data = codec.wire(tail.bytes());
    codec.download(tail.data, x.at(head), tail.bytes());
    allreduce(comm, tail, tail, op, Algo::kAuto, deadline);
    codec.upload(x.at(head), tail.data, tail.bytes());
  }
  codec.finish();
}

}  // namespace pyring
