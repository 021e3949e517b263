// all_reduce on symmetric host memory when the job spans several hosts (zero_copy.h): the
// phases within each host run zero-copy, and only the phase across hosts runs over the links.
//
// With g ranks per host, host position p owns chunk p (chunk_first). Each rank
//   1. reduces its chunk from every local rank's mapping into a wide accumulator (unfinished:
//      avg divides once, at the end), reading no link;
//   2. all-reduces the accumulator with the ranks at its position on the other hosts (the tree
//      plan's top team, a ring over the links; kHostsAllReduce headers), finishing into its own
//      chunk of the output;
//   3. copies the other positions' finished chunks from their mappings.
// So each host sends 2(H-1)/H of the buffer across the hosts in g parallel flows, as the tree
// does, and nothing inside a host moves through a slot.
#include <cstddef>

#include "collectives/collectives.h"
#include "collectives/ring_phases.h"
#include "collectives/zero_copy.h"
#include "collectives/zero_copy_call.h"
#include "core/errors.h"
#include "kernels/dispatch.h"

namespace pyring {

bool zero_copy_across_hosts(const Communicator& comm) {
  const SymmetricHeap* h = comm.symmetric();
  return h && h->any() && h->across_hosts() && comm.tree_plan().active &&
         comm.tree_plan().folded.empty() && comm.tree_plan().teams.size() == 2;
}

void zero_copy_hosts_allreduce(Communicator& comm, const SymmetricSpan& si, const SymmetricSpan& so,
                               const BufferView& in, const BufferView& out, ReduceOp op,
                               Deadline deadline) {
  SymmetricHeap& heap = *comm.symmetric();
  const bool in_place = in.data == out.data;
  if (!in_place && !so) {  // the peers could not read this rank's result: the links' schedule
    heap.enter(comm.seq(), false);
    allreduce(comm, in, out, op, comm.options().algo, deadline);
    return;
  }
  const KernelSite host{};
  const TreePlan& plan = comm.tree_plan();
  const Team& team = plan.teams[0];    // this host's ranks
  const Team& column = plan.teams[1];  // this position's rank on every host
  const DType dtype = in.dtype, wide = accum_dtype(dtype);
  const size_t es = dtype_size(dtype), n = in.count;
  const int g = static_cast<int>(team.ranks.size());
  zero_copy::Call call(comm, "zero-copy all_reduce across hosts", zero_copy::kHostsAllReduce, si,
                       in.bytes(), dtype, static_cast<int>(op), -1, deadline);
  call.output(in_place ? si : so);
  call.start();
  call.wait_all(1);
  call.count(false);
  if (comm.options().log_level >= 1) {
    comm.log_once(1, "zero-copy/hosts", [&] {
      return str_cat("all_reduce ", in.bytes(), " B: zero-copy within each host of ", g,
                     " ranks, a ring of ", column.ranks.size(), " across the hosts");
    });
  }
  const size_t f = zero_copy::chunk_first(n, g, team.pos);
  const size_t m = zero_copy::chunk_first(n, g, team.pos + 1) - f;
  uint8_t* acc = comm.scratch(std::max<size_t>(m, 1) * dtype_size(wide));
  if (m > 0) {  // every local rank's input, in rank order
    kern::widen(host, dtype, si.at(0) + f * es, acc, m);
    for (int li = 1; li < call.world(); ++li) {
      kern::accumulate(host, dtype, op, si.at(static_cast<size_t>(li)) + f * es, acc, acc, m);
    }
  }
  call.post(2);  // done reading the peers' inputs
  const PhaseInfo info{CollectiveKind::kHostsAllReduce, dtype, op, n, -1, comm.size(), host};
  uint8_t* mine = static_cast<uint8_t*>(out.data) + f * es;
  ar_phase(comm, SubRing{column.ranks, column.pos},
           Parts::even(0, m, static_cast<size_t>(column.ranks.size())), acc, wide, acc, mine, info,
           deadline);
  call.post(3);  // this rank's chunk is final
  call.wait_all(3);
  const SymmetricSpan& dst = in_place ? si : so;
  size_t read = m * es * static_cast<size_t>(call.world() - 1);
  for (int p = 0; p < g; ++p) {
    if (p == team.pos) continue;
    const size_t pf = zero_copy::chunk_first(n, g, p), pl = zero_copy::chunk_first(n, g, p + 1);
    const int li = heap.local_of(team.ranks[static_cast<size_t>(p)]);
    PYRING_CHECK(li >= 0, CommError, "zero-copy all_reduce across hosts: rank ",
                 team.ranks[static_cast<size_t>(p)], " of this host's team is not local");
    if (pl > pf) {
      kern::copy(host, static_cast<uint8_t*>(out.data) + pf * es,
                 dst.at(static_cast<size_t>(li)) + pf * es, (pl - pf) * es);
      read += (pl - pf) * es;
    }
  }
  call.post(4);  // done reading the peers' outputs
  call.moved(read);
  call.wait_all(4);
}

}  // namespace pyring
