// Tree allreduce over the topology (core/topology.h words: address, shape, team).
//
// Schedule, for an active rank with teams T_0 .. T_k (lowest component first):
//   reduce-scatter over T_0, then over T_1 on the part it owns, ..., allreduce over T_k on
//   the part it owns, then allgather back down over T_{k-1} .. T_0.
// Each step shrinks the region by the team's size before it crosses the next (slower) level,
// so a group of G ranks sends 2(H-1)/H of the buffer across the level above it, with H the
// number of groups there, in G parallel flows, against the flat ring's 2(N-1)/N over every
// link it crosses. Lower levels go first because they are the faster links: reversing the
// order would put the whole buffer on the slow level.
// Uneven trees: ranks past the shape fold into their stand-in before the teams run (their
// whole input, reduced in rank order so results repeat exactly) and get the result back after.
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/driver.h"
#include "collectives/ring_phases.h"
#include "core/errors.h"
#include "core/link.h"
#include "kernels/reduce.h"

namespace pyring {

namespace {

void fold_out_of(Communicator& comm, const BufferView& in, const BufferView& out,
                 const PhaseInfo& info, Deadline deadline) {
  Link& target = comm.link(comm.tree_plan().fold_target);
  HeaderExchange header(comm.seq(), info.kind, info.dtype, info.op, info.count);
  header.post(&target, &target, comm.rank());
  // The stand-in answers only after it has received the whole input, so out may be in.
  target.post_send(static_cast<const uint8_t*>(in.data), in.bytes());
  target.post_recv(RecvSpec{out.bytes(), static_cast<uint8_t*>(out.data), nullptr});
  drive({&target}, deadline, comm.spin_us());
}

// acc (accumulation type) = in op every folded rank's input, in rank order.
void fold_into(Communicator& comm, const BufferView& in, uint8_t* acc, const PhaseInfo& info,
               Deadline deadline) {
  const DType dtype = info.dtype;
  const size_t esz = dtype_size(dtype), asz = dtype_size(accum_dtype(dtype));
  if (accum_dtype(dtype) != dtype) {
    widen(dtype, in.data, acc, in.count);
  } else if (acc != in.data) {
    std::memcpy(acc, in.data, in.bytes());
  }
  for (int peer : comm.tree_plan().folded) {
    Link& link = comm.link(peer);
    HeaderExchange header(comm.seq(), info.kind, dtype, info.op, info.count);
    header.post(&link, &link, comm.rank());
    RecvSpec spec;
    spec.bytes = in.bytes();
    const ReduceOp op = info.op;
    spec.on_piece = [=](const uint8_t* data, size_t off, size_t len) {
      PYRING_CHECK(off % esz == 0 && len % esz == 0, CommError, "piece of ", len,
                   " bytes from rank ", peer, " is not a whole number of elements");
      uint8_t* a = acc + off / esz * asz;
      reduce_accumulate(dtype, op, data, a, a, len / esz);
    };
    link.post_recv(std::move(spec));
    drive({&link}, deadline, comm.spin_us());
  }
}

}  // namespace

void tree_allreduce(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
                    Deadline deadline) {
  const int n = comm.size();
  const DType dtype = in.dtype;
  if (in.count == 0) return;
  if (n == 1) {
    finish_single(dtype, in.data, out.data, in.count);
    return;
  }
  const TreePlan& plan = comm.tree_plan();
  const PhaseInfo info{CollectiveKind::kAllReduce, dtype, op, in.count, -1, n};
  if (!plan.active) {
    fold_out_of(comm, in, out, info, deadline);
    return;
  }
  const DType acc_type = accum_dtype(dtype);
  auto* out_bytes = static_cast<uint8_t*>(out.data);
  uint8_t* acc = acc_type == dtype ? out_bytes : comm.scratch(in.count * dtype_size(acc_type));
  const uint8_t* src = static_cast<const uint8_t*>(in.data);
  DType src_type = dtype;
  if (!plan.folded.empty()) {
    fold_into(comm, in, acc, info, deadline);
    src = acc;
    src_type = acc_type;
  }
  const size_t levels = plan.teams.size();
  std::vector<SubRing> rings;
  std::vector<Parts> parts;
  size_t base = 0, count = in.count;
  for (size_t i = 0; i < levels; ++i) {
    const Team& team = plan.teams[i];
    rings.push_back(SubRing{team.ranks, team.pos});
    parts.push_back(Parts::even(base, count, team.ranks.size()));
    if (i + 1 == levels) break;
    rs_phase(comm, rings[i], parts[i], src, src_type, acc, nullptr, info, deadline);
    src = acc;
    src_type = acc_type;
    base = parts[i].off[static_cast<size_t>(team.pos)];
    count = parts[i].len[static_cast<size_t>(team.pos)];
  }
  if (levels == 0) {
    // Every rank folded into this one: src is the accumulated sum, in the accumulation type.
    finish_wide(dtype, op, src, out_bytes, in.count, n);
  } else {
    ar_phase(comm, rings.back(), parts.back(), src, src_type, acc, out_bytes, info, deadline);
    for (size_t i = levels - 1; i-- > 0;) ag_phase(comm, rings[i], parts[i], out_bytes, info,
                                                   deadline);
  }
  if (plan.folded.empty()) return;
  std::vector<Link*> links;
  for (int peer : plan.folded) {
    links.push_back(&comm.link(peer));
    links.back()->post_send(out_bytes, out.bytes());
  }
  drive(links, deadline, comm.spin_us());
}

}  // namespace pyring
