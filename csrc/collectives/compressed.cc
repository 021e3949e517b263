#include "collectives/compressed.h"

#include <algorithm>
#include <cstring>

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

size_t max_bytes(Wire w, size_t n) {
  return w == Wire::kOnebit ? onebit_max_bytes(n) : 2 * n;
}

size_t encode(Wire w, const float* in, float* residual, size_t n, uint8_t* out, uint8_t* cache) {
  if (w == Wire::kOnebit) return onebit_encode(in, residual, n, out, cache);
  return half_encode(w, in, n, out);
}

// out = alpha * decoded, or out += alpha * decoded.
void decode(Wire w, const uint8_t* enc, size_t n, float alpha, bool accumulate, float* out,
            uint8_t* cache) {
  if (w == Wire::kOnebit) return onebit_decode(enc, n, alpha, accumulate, out, cache);
  half_decode(w, enc, n, alpha, accumulate, out);
}

// Memory reused across calls on one thread, so that a call of a size seen before takes no
// page faults (fresh vectors of tens of MiB cost more than the codec). Grown, never shrunk.
struct Buffers {
  std::vector<uint8_t> send, recv, mine, gathered;
  std::vector<float> acc, wide, parts;
};
thread_local Buffers buffers;

template <class T>
std::vector<T>& grown(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v;
}

// The mask cache of every stream, in WireState's layout.
struct Caches {
  std::vector<uint8_t*> enc, recv, gather;
  uint8_t* server = nullptr;
};

std::vector<size_t> cache_sizes(size_t n, int participants, int index) {
  const Chunks ch{n, static_cast<size_t>(participants)};
  const size_t own = ch.size(static_cast<size_t>(index));
  std::vector<size_t> sizes;
  for (int j = 0; j < participants; ++j) sizes.push_back(ch.size(static_cast<size_t>(j)));
  for (int j = 0; j < participants; ++j) sizes.push_back(own);
  sizes.push_back(own);
  for (int j = 0; j < participants; ++j) sizes.push_back(ch.size(static_cast<size_t>(j)));
  return sizes;
}

Caches split(WireState& s, size_t n, int participants, int index) {
  Caches c;
  uint8_t* at = s.masks.data();
  const std::vector<size_t> sizes = cache_sizes(n, participants, index);
  const size_t p = static_cast<size_t>(participants);
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (k < p) {
      c.enc.push_back(at);
    } else if (k < 2 * p) {
      c.recv.push_back(at);
    } else if (k == 2 * p) {
      c.server = at;
    } else {
      c.gather.push_back(at);
    }
    at += onebit_cache_bytes(sizes[k]);
  }
  return c;
}

// in[k] goes to peers[k] and out[k] comes from it; the entry of this rank is skipped. Both ends
// of a pair must agree on each size.
void swap(Communicator& comm, const std::vector<int>& peers, const std::vector<Span>& in,
          const std::vector<Span>& out, Deadline deadline) {
  Exchange ex(comm, CollectiveKind::kAllReduce, deadline);
  for (size_t k = 0; k < peers.size(); ++k) {
    if (peers[k] != comm.rank()) ex.recv(peers[k], out[k]);
  }
  for (size_t k = 0; k < peers.size(); ++k) {
    if (peers[k] != comm.rank()) ex.send(peers[k], in[k]);
  }
  ex.wait();
}

// Each participant's payload sizes, for the onebit wire whose sizes vary: sizes[k] is what
// this rank sends to parts[k]; returns what each sends to this rank.
std::vector<uint64_t> swap_sizes(Communicator& comm, const std::vector<int>& parts,
                                 std::vector<uint64_t> sizes, Deadline deadline) {
  std::vector<uint64_t> got(parts.size());
  std::vector<Span> in, out;
  for (size_t k = 0; k < parts.size(); ++k) {
    in.push_back(Span{reinterpret_cast<uint8_t*>(&sizes[k]), sizeof(uint64_t)});
    out.push_back(Span{reinterpret_cast<uint8_t*>(&got[k]), sizeof(uint64_t)});
  }
  swap(comm, parts, in, out, deadline);
  return got;
}

// The schedule of compressed.h over `parts` (this rank is parts[me]), on x in place.
void flat(Communicator& comm, float* x, size_t n, const std::vector<int>& parts, int me, Wire wire,
          float alpha, WireState* state, Deadline deadline) {
  if (wire != Wire::kOnebit) {
    return half_flat(comm, x, n, parts, me, wire, alpha, buffers.send, buffers.recv,
                     buffers.gathered, buffers.acc, deadline);
  }
  const size_t P = parts.size(), m = static_cast<size_t>(me);
  const Chunks ch{n, P};
  const size_t own = ch.size(m), own_off = ch.offset(m);
  Caches c;
  if (wire == Wire::kOnebit) {
    state->bind(n, static_cast<int>(P), me);
    c = split(*state, n, static_cast<int>(P), me);
  }
  auto cache = [&](const std::vector<uint8_t*>& v, size_t k) { return v.empty() ? nullptr : v[k]; };
  // 1. Every chunk encoded, each to its owner.
  std::vector<size_t> at(P + 1, 0);
  for (size_t j = 0; j < P; ++j) at[j + 1] = at[j] + max_bytes(wire, ch.size(j));
  std::vector<uint8_t>& send = grown(buffers.send, at[P]);
  std::vector<uint64_t> sizes(P);
  for (size_t j = 0; j < P; ++j) {
    float* residual = wire == Wire::kOnebit ? state->worker.data() + ch.offset(j) : nullptr;
    sizes[j] =
        encode(wire, x + ch.offset(j), residual, ch.size(j), send.data() + at[j], cache(c.enc, j));
  }
  std::vector<uint64_t> incoming(P, 2 * own);
  if (wire == Wire::kOnebit) incoming = swap_sizes(comm, parts, sizes, deadline);
  incoming[m] = sizes[m];
  std::vector<size_t> rat(P + 1, 0);
  for (size_t i = 0; i < P; ++i) rat[i + 1] = rat[i] + incoming[i];
  std::vector<uint8_t>& recv = grown(buffers.recv, rat[P]);
  std::vector<Span> in, out;
  for (size_t k = 0; k < P; ++k) {
    in.push_back(Span{send.data() + at[k], sizes[k]});
    out.push_back(Span{recv.data() + rat[k], incoming[k]});
  }
  std::memcpy(recv.data() + rat[m], send.data() + at[m], sizes[m]);
  swap(comm, parts, in, out, deadline);
  // 2. The owner adds the copies of its chunk in float32, in participant order.
  std::vector<float>& acc = grown(buffers.acc, own);
  for (size_t i = 0; i < P; ++i) {
    decode(wire, recv.data() + rat[i], own, alpha, i > 0, acc.data(), cache(c.recv, i));
  }
  // 3. Encoded again, to every participant, and every chunk decoded into x.
  std::vector<uint8_t>& mine = grown(buffers.mine, max_bytes(wire, own));
  const uint64_t mine_bytes =
      encode(wire, acc.data(), wire == Wire::kOnebit ? state->server.data() : nullptr, own,
             mine.data(), c.server);
  std::vector<uint64_t> back(P);
  for (size_t j = 0; j < P; ++j) back[j] = 2 * ch.size(j);
  if (wire == Wire::kOnebit)
    back = swap_sizes(comm, parts, std::vector<uint64_t>(P, mine_bytes), deadline);
  back[m] = mine_bytes;
  std::vector<size_t> bat(P + 1, 0);
  for (size_t j = 0; j < P; ++j) bat[j + 1] = bat[j] + back[j];
  std::vector<uint8_t>& gathered = grown(buffers.gathered, bat[P]);
  in.assign(P, Span{mine.data(), mine_bytes});
  out.clear();
  for (size_t j = 0; j < P; ++j) out.push_back(Span{gathered.data() + bat[j], back[j]});
  swap(comm, parts, in, out, deadline);
  std::memcpy(gathered.data() + bat[m], mine.data(), mine_bytes);
  for (size_t j = 0; j < P; ++j) {
    decode(wire, gathered.data() + bat[j], ch.size(j), 1.0f, false, x + ch.offset(j),
           cache(c.gather, j));
  }
  (void)own_off;
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
  std::vector<float>& parts = grown(buffers.parts, members * n);
  {
    Exchange ex(comm, CollectiveKind::kAllReduce, deadline);
    for (size_t k = 0; k < members; ++k) {
      ex.recv((*group)[k + 1],
              Span{reinterpret_cast<uint8_t*>(parts.data() + k * n), n * sizeof(float)});
    }
    ex.wait();
  }
  for (size_t k = 0; k < members; ++k) {  // in rank order: the same sum on every run
    const float* p = parts.data() + k * n;
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
    f = grown(buffers.wide, head).data();
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
