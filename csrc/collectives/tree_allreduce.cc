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
#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/driver.h"
#include "collectives/ring_phases.h"
#include "core/errors.h"
#include "core/link.h"
#include "kernels/dispatch.h"

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
  kern::widen(info.site, dtype, in.data, acc, in.count);
  for (int peer : comm.tree_plan().folded) {
    Link& link = comm.link(peer);
    HeaderExchange header(comm.seq(), info.kind, dtype, info.op, info.count);
    header.post(&link, &link, comm.rank());
    RecvSpec spec;
    spec.bytes = in.bytes();
    const ReduceOp op = info.op;
    const KernelSite site = info.site;
    spec.on_piece = [=](const uint8_t* data, size_t off, size_t len) {
      PYRING_CHECK(off % esz == 0 && len % esz == 0, CommError, "piece of ", len,
                   " bytes from rank ", peer, " is not a whole number of elements");
      uint8_t* a = acc + off / esz * asz;
      kern::accumulate(site, dtype, op, data, a, a, len / esz);
    };
    link.post_recv(std::move(spec));
    drive({&link}, deadline, comm.spin_us());
  }
}

void run_slices(Communicator& comm, const TreePlan& plan, const uint8_t* src, DType src_type,
                uint8_t* acc, uint8_t* out, size_t count, const PhaseInfo& info,
                Deadline deadline) {
  const size_t levels = plan.teams.size();
  const DType acc_type = accum_dtype(info.dtype);
  const size_t bytes = count * dtype_size(info.dtype);
  const size_t slices = tree_slices(bytes, levels);
  const Chunks cuts{count, slices};
  std::vector<SubRing> rings;
  for (const Team& t : plan.teams) rings.push_back(SubRing{t.ranks, t.pos});
  std::vector<std::vector<Parts>> parts(slices);
  auto down = [&](size_t k, const std::vector<Link*>& background) {
    for (size_t i = levels - 1; i-- > 0;) {
      post_ag(comm, rings[i], parts[k][i], out, info).complete(comm, deadline, background);
    }
  };
  Posted top;
  for (size_t k = 0; k < slices; ++k) {
    parts[k] = Parts::per_team(plan, cuts.offset(k), cuts.size(k));
    const uint8_t* from = src;
    DType from_type = src_type;
    for (size_t i = 0; i + 1 < levels; ++i) {
      post_rs(comm, rings[i], parts[k][i], from, from_type, acc, nullptr, info)
          .complete(comm, deadline, top.links());
      from = acc;
      from_type = acc_type;
    }
    if (k > 0) top.complete(comm, deadline);
    Posted next = post_ar(comm, rings.back(), parts[k].back(), from, from_type, acc, out, info);
    if (k > 0) down(k - 1, next.links());
    top = std::move(next);
  }
  top.complete(comm, deadline);
  down(slices - 1, {});
}

}  // namespace

size_t tree_slices(size_t bytes, size_t teams) {
  if (teams < 2) return 1;
  return std::max<size_t>(1, std::min(kTreeMaxSlices, bytes / kTreeSliceBytes));
}

void tree_allreduce(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
                    Deadline deadline) {
  const int n = comm.size();
  const DType dtype = in.dtype;
  if (nothing_to_exchange(comm, in, out)) return;
  const TreePlan& plan = comm.tree_plan();
  const PhaseInfo info{CollectiveKind::kAllReduce, dtype, op, in.count, comm.call_root(), n,
                       KernelSite::of(in)};
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
  if (levels == 0) {
    // Every rank folded into this one: src is the accumulated sum, in the accumulation type.
    kern::finish_wide(info.site, dtype, op, src, out_bytes, in.count, n);
  } else {
    run_slices(comm, plan, src, src_type, acc, out_bytes, in.count, info, deadline);
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
