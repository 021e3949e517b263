// Ring reduce-scatter over the communicator's ring order: the rank at ring position p owns
// block ring[p] (its own rank's block), finished straight into `out`. Intermediate partial
// blocks live in scratch memory of the accumulation type.
#include "collectives/collectives.h"
#include "collectives/ring_phases.h"

namespace pyring {

void ring_reduce_scatter(Communicator& comm, const BufferView& in, const BufferView& out,
                         ReduceOp op, Deadline deadline) {
  const int n = comm.size();
  const DType dtype = in.dtype;
  const size_t m = out.count;
  if (nothing_to_exchange(comm, in, out)) return;
  const KernelSite site = KernelSite::of(in);
  uint8_t* acc = comm.scratch_for(site, in.count * dtype_size(accum_dtype(dtype)));
  const PhaseInfo info{CollectiveKind::kReduceScatter, dtype, op, in.count, -1, n, site};
  rs_phase(comm, SubRing::of(comm.ring_order(), comm.rank()), Parts::blocks(comm.ring_order(), m),
           static_cast<const uint8_t*>(in.data), dtype, acc, static_cast<uint8_t*>(out.data), info,
           deadline);
}

}  // namespace pyring
