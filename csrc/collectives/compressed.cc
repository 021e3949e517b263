#include "collectives/compressed.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "collectives/collectives.h"
#include "collectives/compressed_half.h"
#include "collectives/driver.h"
#include "collectives/exchange.h"
#include "collectives/selector.h"
#include "core/errors.h"
#include "kernels/onebit.h"
#include "kernels/wire_cast.h"

namespace pyring {

namespace {

constexpr const char* kWireNames[kNumWires] = {"fp32", "fp16", "bf16", "onebit"};

// Memory reused across calls on one thread, so that a call of a size seen before takes no
// page faults (fresh vectors of tens of MiB cost more than the codec). Grown, never shrunk.
struct Buffers {
  std::vector<uint8_t> send, recv, mine, gathered;
  std::vector<float> acc, wide, parts;
};
thread_local Buffers buffers;

// Onebit segments: every chunk is cut into the same number, so that a segment index means the
// same thing on every rank; each (stream, segment) keeps its own mask cache.
constexpr size_t kOnebitSegmentElems = size_t{1} << 20;

size_t segments_of(size_t n, size_t participants) {
  const size_t widest = Chunks{n, participants}.size(0);
  return widest == 0 ? 1 : (widest + kOnebitSegmentElems - 1) / kOnebitSegmentElems;
}

// The mask caches in WireState's layout, each list indexed [j * S + s]: enc (chunk j, segment
// s, to its owner), recv (copy j of the owned chunk), server (the owned chunk's result, [s]),
// gather (chunk j's result).
struct Caches {
  std::vector<uint8_t*> enc, recv, server, gather;
};

// The element count of every cache, in layout order.
std::vector<size_t> cache_sizes(size_t n, int participants, int index) {
  const size_t P = static_cast<size_t>(participants), S = segments_of(n, P);
  const Chunks ch{n, P};
  const Chunks own{ch.size(static_cast<size_t>(index)), S};
  std::vector<size_t> sizes;
  for (size_t j = 0; j < P; ++j) {
    for (size_t s = 0; s < S; ++s) sizes.push_back(Chunks{ch.size(j), S}.size(s));
  }
  for (size_t j = 0; j < P; ++j) {
    for (size_t s = 0; s < S; ++s) sizes.push_back(own.size(s));
  }
  for (size_t s = 0; s < S; ++s) sizes.push_back(own.size(s));
  for (size_t j = 0; j < P; ++j) {
    for (size_t s = 0; s < S; ++s) sizes.push_back(Chunks{ch.size(j), S}.size(s));
  }
  return sizes;
}

Caches split(WireState& st, size_t n, int participants, int index) {
  Caches c;
  uint8_t* at = st.masks.data();
  const size_t PS = static_cast<size_t>(participants) * segments_of(n, participants);
  const std::vector<size_t> sizes = cache_sizes(n, participants, index);
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
// result on while later segments still travel.
void onebit_flat(Communicator& comm, float* x, size_t n, const std::vector<int>& parts, int me,
                 float alpha, WireState* state, Deadline deadline) {
  const size_t P = parts.size(), m = static_cast<size_t>(me), S = segments_of(n, P);
  const Chunks ch{n, P};
  auto seg = [&](size_t j) { return Chunks{ch.size(j), S}; };
  const Chunks mine = seg(m);
  state->bind(n, static_cast<int>(P), me);
  const Caches c = split(*state, n, static_cast<int>(P), me);
  Slots out, in, res, back;  // [j * S + s], [i * S + s], [s], [j * S + s]
  for (size_t j = 0; j < P; ++j) {
    for (size_t s = 0; s < S; ++s) {
      out.add(seg(j).size(s));
      in.add(mine.size(s));
      back.add(seg(j).size(s));
    }
  }
  for (size_t s = 0; s < S; ++s) res.add(mine.size(s));
  uint8_t* send = grown(buffers.send, out.total());
  uint8_t* recv = grown(buffers.recv, in.total());
  uint8_t* result = grown(buffers.mine, res.total());
  uint8_t* gathered = grown(buffers.gathered, back.total());
  float* acc = grown(buffers.acc, ch.size(m));
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
  // Phase A: segment s of chunk j encoded (the worker residual) and sent to its owner.
  for (size_t s = 0; s < S; ++s) {
    for (size_t k = 1; k <= P; ++k) {
      const size_t j = (m + k) % P, q = j * S + s;
      const size_t off = ch.offset(j) + seg(j).offset(s);
      out_size[q] = onebit_encode(x + off, state->worker.data() + off, seg(j).size(s),
                                  send + out.at[q], c.enc[q]);
      if (j == m) continue;
      sizes_up[s]->send(parts[j], span(&out_size[q], sizeof(uint64_t)));
      up[s]->send(parts[j], span(send + out.at[q], out_size[q]));
    }
  }
  // Phase B: each segment of the owned chunk, once its copies are in, added in float32 in
  // participant order, encoded again (the server residual) and sent to every participant.
  for (size_t s = 0; s < S; ++s) {
    sizes_up[s]->wait();
    for (size_t i = 0; i < P; ++i) {
      if (i != m) up[s]->recv(parts[i], span(recv + in.at[i * S + s], in_size[i * S + s]));
    }
    up[s]->wait();
    float* a = acc + mine.offset(s);
    for (size_t i = 0; i < P; ++i) {
      const uint8_t* from = i == m ? send + out.at[m * S + s] : recv + in.at[i * S + s];
      onebit_decode(from, mine.size(s), alpha, i > 0, a, c.recv[i * S + s]);
    }
    res_size[s] = onebit_encode(a, state->server.data() + mine.offset(s), mine.size(s),
                                result + res.at[s], c.server[s]);
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
      const uint8_t* from = j == m ? result + res.at[s] : gathered + back.at[j * S + s];
      onebit_decode(from, seg(j).size(s), 1.0f, false, x + ch.offset(j) + seg(j).offset(s),
                    c.gather[j * S + s]);
    }
  }
}

// The schedule of compressed.h over `parts` (this rank is parts[me]), on x in place.
void flat(Communicator& comm, float* x, size_t n, const std::vector<int>& parts, int me, Wire wire,
          float alpha, WireState* state, Deadline deadline) {
  if (wire == Wire::kOnebit) return onebit_flat(comm, x, n, parts, me, alpha, state, deadline);
  half_flat(comm, x, n, parts, me, wire, alpha, buffers.send, buffers.recv, buffers.gathered,
            buffers.acc, deadline);
}

// Full precision inside this rank's group, the schedule between the groups' leaders.
void hierarchical(Communicator& comm, float* x, size_t n,
                  const std::vector<std::vector<int>>& groups, Wire wire, float alpha,
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
  const Span whole{reinterpret_cast<uint8_t*>(x), n * sizeof(float)};
  if (rank != group->front()) {
    {
      Exchange ex(comm, CollectiveKind::kAllReduce, deadline);
      ex.send(group->front(), whole);
      ex.wait();
    }
    Exchange ex(comm, CollectiveKind::kAllReduce, deadline);
    ex.recv(group->front(), whole);
    ex.wait();
    return;
  }
  const size_t members = group->size() - 1;
  float* parts = grown(buffers.parts, members * n);
  {
    Exchange ex(comm, CollectiveKind::kAllReduce, deadline);
    for (size_t k = 0; k < members; ++k) {
      ex.recv((*group)[k + 1], Span{reinterpret_cast<uint8_t*>(parts + k * n), n * sizeof(float)});
    }
    ex.wait();
  }
  for (size_t k = 0; k < members; ++k) {  // in rank order: the same sum on every run
    const float* p = parts + k * n;
    for (size_t i = 0; i < n; ++i) x[i] += p[i];
  }
  flat(comm, x, n, leaders, me, wire, alpha, state, deadline);
  Exchange ex(comm, CollectiveKind::kAllReduce, deadline);
  for (size_t k = 0; k < members; ++k) ex.send((*group)[k + 1], whole);
  ex.wait();
}

}  // namespace

const char* wire_name(Wire w) {
  const int i = static_cast<int>(w);
  return i >= 0 && i < kNumWires ? kWireNames[i] : "an unknown wire";
}

Wire wire_from_int(int v) {
  PYRING_CHECK_ARG(v >= 0 && v < kNumWires, "wire code ", v, " out of range [0, ", kNumWires, ")");
  return static_cast<Wire>(v);
}

size_t WireState::mask_bytes(size_t n, int participants, int index) {
  size_t total = 0;
  for (size_t s : cache_sizes(n, participants, index)) total += onebit_cache_bytes(s);
  return total;
}

void WireState::bind(size_t n, int participants, int index) {
  const size_t own = Chunks{n, static_cast<size_t>(participants)}.size(static_cast<size_t>(index));
  const size_t masks_n = mask_bytes(n, participants, index);
  if (worker.empty() && server.empty() && masks.empty()) {
    worker.assign(n, 0.0f);
    server.assign(own, 0.0f);
    masks.assign(masks_n, 0);
    return;
  }
  if (masks.empty()) masks.assign(masks_n, 0);  // restored from a state saved without caches
  PYRING_CHECK_ARG(worker.size() == n && server.size() == own && masks.size() == masks_n,
                   "OneBitState holds residuals for ", worker.size(), " elements (server chunk ",
                   server.size(), ", ", masks.size(), " bytes of mask caches); this tensor has ", n,
                   " on ", participants, " participants (chunk ", own, ", ", masks_n,
                   " bytes): use one state per bucket");
}

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
  if (wire != Wire::kOnebit) return;
  PYRING_CHECK_ARG(state != nullptr, "all_reduce: wire onebit needs a state");
  if (comm.size() == 1) return;
  const std::vector<std::vector<int>> groups = compressed_groups(comm, algo);
  if (groups.empty()) return state->bind(x.count - exact_tail, comm.size(), comm.rank());
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].front() == comm.rank()) {
      return state->bind(x.count - exact_tail, static_cast<int>(groups.size()),
                         static_cast<int>(g));
    }
  }
}

void compressed_allreduce(Communicator& comm, const BufferView& x, size_t exact_tail, Wire wire,
                          ReduceOp op, WireState* state, Algo algo, Deadline deadline) {
  if (wire == Wire::kFp32) return allreduce(comm, x, x, op, algo, deadline);
  const DType dt = x.dtype;
  const size_t head = x.count - exact_tail;
  if (comm.size() == 1) return;  // sum and avg over one rank
  const std::vector<std::vector<int>> groups = select_compressed(comm, wire_name(wire), head, algo);
  float* f = static_cast<float*>(x.data);
  if (dt != DType::kFloat32) {
    f = grown(buffers.wide, head);
    if (dt == DType::kFloat64) {
      const double* d = static_cast<const double*>(x.data);
      for (size_t i = 0; i < head; ++i) f[i] = static_cast<float>(d[i]);
    } else {
      wire_cast(dt, DType::kFloat32, x.data, f, head);
    }
  }
  const float alpha = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(comm.size()) : 1.0f;
  if (groups.empty()) {
    std::vector<int> all(static_cast<size_t>(comm.size()));
    for (int r = 0; r < comm.size(); ++r) all[static_cast<size_t>(r)] = r;
    flat(comm, f, head, all, comm.rank(), wire, alpha, state, deadline);
  } else {
    hierarchical(comm, f, head, groups, wire, alpha, state, deadline);
  }
  if (dt == DType::kFloat64) {
    double* d = static_cast<double*>(x.data);
    for (size_t i = 0; i < head; ++i) d[i] = f[i];
  } else if (dt != DType::kFloat32) {
    wire_cast(DType::kFloat32, dt, f, x.data, head);
  }
  if (exact_tail > 0) {
    BufferView tail = x;
    tail.data = x.at(head);
    tail.count = exact_tail;
    allreduce(comm, tail, tail, op, Algo::kAuto, deadline);
  }
}

}  // namespace pyring
