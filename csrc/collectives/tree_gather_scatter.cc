// Tree reduce-scatter and allgather over an even topology (no rank folds).
//
// The blocks are permuted into address order (core/topology.h), where the ranks of every team
// own adjacent runs at every level. Reduce-scatter then runs over the lowest team first, each
// phase keeping only the part whose ranks share this rank's component, so each slower level
// carries (s-1)/s of an already reduced region: a group sends (H-1)/H of the buffer across
// the top level, against the flat ring's (N-1)/N. Allgather is the mirror image, highest team
// first. The permutations are one copy of the buffer each way.
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/ring_phases.h"
#include "core/errors.h"

namespace pyring {

void tree_reduce_scatter(Communicator& comm, const BufferView& in, const BufferView& out,
                         ReduceOp op, Deadline deadline) {
  const int n = comm.size();
  const DType dtype = in.dtype;
  const size_t m = out.count;
  if (nothing_to_exchange(comm, in, out)) return;
  const std::vector<int>& order = comm.address_order();
  PYRING_CHECK_ARG(!order.empty(), "the tree reduce-scatter needs an even topology, not ",
                   comm.topology().str());
  const TreePlan& plan = comm.tree_plan();
  const size_t esz = dtype_size(dtype), block = m * esz;
  const DType acc_type = accum_dtype(dtype);
  uint8_t* perm = comm.scratch(accum_offset(in.bytes()) + in.count * dtype_size(acc_type));
  uint8_t* acc = perm + accum_offset(in.bytes());
  for (size_t i = 0; i < order.size(); ++i) {
    std::memcpy(perm + i * block, in.at(static_cast<size_t>(order[i]) * m), block);
  }
  const PhaseInfo info{
      CollectiveKind::kReduceScatter, dtype, op, in.count, -1, n, KernelSite::of(in)};
  const std::vector<Parts> parts = Parts::per_team(plan, 0, in.count);
  const uint8_t* src = perm;
  DType src_type = dtype;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Team& t = plan.teams[i];
    const bool last = i + 1 == parts.size();
    rs_phase(comm, SubRing{t.ranks, t.pos}, parts[i], src, src_type, acc,
             last ? static_cast<uint8_t*>(out.data) : nullptr, info, deadline);
    src = acc;
    src_type = acc_type;
  }
}

void tree_allgather(Communicator& comm, const BufferView& in, const BufferView& out,
                    Deadline deadline) {
  const int n = comm.size();
  const size_t m = in.count;
  const size_t block = in.bytes();
  if (n == 1 || block == 0) {
    uint8_t* own = out.at(static_cast<size_t>(comm.rank()) * m);
    if (own != in.data && block > 0) std::memcpy(own, in.data, block);
    return;
  }
  const std::vector<int>& order = comm.address_order();
  PYRING_CHECK_ARG(!order.empty(), "the tree allgather needs an even topology, not ",
                   comm.topology().str());
  const TreePlan& plan = comm.tree_plan();
  uint8_t* perm = comm.scratch(out.bytes());
  const std::vector<Parts> parts = Parts::per_team(plan, 0, out.count);
  const size_t own =
      parts.empty() ? 0 : parts.back().off[static_cast<size_t>(plan.teams.back().pos)];
  std::memcpy(perm + own * dtype_size(in.dtype), in.data, block);
  const PhaseInfo info{CollectiveKind::kAllGather, in.dtype, ReduceOp::kSum, out.count, -1, n,
                       KernelSite::of(in)};
  for (size_t i = parts.size(); i-- > 0;) {
    const Team& t = plan.teams[i];
    ag_phase(comm, SubRing{t.ranks, t.pos}, parts[i], perm, info, deadline);
  }
  for (size_t i = 0; i < order.size(); ++i) {
    std::memcpy(out.at(static_cast<size_t>(order[i]) * m), perm + i * block, block);
  }
}

}  // namespace pyring
