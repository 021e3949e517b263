// Ring allgather over the communicator's ring order: the rank at ring position p owns block
// ring[p] of `out`; the blocks travel the ring and are forwarded as each piece lands.
#include "collectives/collectives.h"
#include "collectives/ring_phases.h"
#include "kernels/dispatch.h"

namespace pyring {

void ring_allgather(Communicator& comm, const BufferView& in, const BufferView& out,
                    Deadline deadline) {
  const size_t m = in.count;
  const size_t bytes = in.bytes();
  uint8_t* own = out.at(static_cast<size_t>(comm.rank()) * m);
  const KernelSite site = KernelSite::of(in);
  kern::copy(site, own, in.data, bytes);
  if (comm.size() == 1 || bytes == 0) return;
  const PhaseInfo info{
      CollectiveKind::kAllGather, in.dtype, ReduceOp::kSum, out.count, -1, comm.size(), site};
  ag_phase(comm, SubRing::of(comm.ring_order(), comm.rank()), Parts::blocks(comm.ring_order(), m),
           static_cast<uint8_t*>(out.data), info, deadline);
}

}  // namespace pyring
