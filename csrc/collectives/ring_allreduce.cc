// Ring allreduce over the communicator's ring order: the fused reduce-scatter and allgather of
// ring_phases.h, so a finished segment travels on as soon as its owner has it.
#include "collectives/collectives.h"
#include "collectives/ring_phases.h"
#include "kernels/dispatch.h"

namespace pyring {

void ring_allreduce(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
                    Deadline deadline) {
  const int n = comm.size();
  const DType dtype = in.dtype;
  if (nothing_to_exchange(comm, in, out)) return;
  const DType acc_type = accum_dtype(dtype);
  // Partial results live in `out` when they have the caller's type, else in float32 scratch.
  auto* out_bytes = static_cast<uint8_t*>(out.data);
  const KernelSite site = KernelSite::of(in);
  uint8_t* acc =
      acc_type == dtype ? out_bytes : comm.scratch_for(site, in.count * dtype_size(acc_type));
  const PhaseInfo info{CollectiveKind::kAllReduce, dtype, op, in.count, comm.call_root(), n, site};
  ar_phase(comm, SubRing::of(comm.ring_order(), comm.rank()),
           Parts::even(0, in.count, static_cast<size_t>(n)), static_cast<const uint8_t*>(in.data),
           dtype, acc, out_bytes, info, deadline);
}

bool nothing_to_exchange(const Communicator& comm, const BufferView& in, const BufferView& out) {
  if (out.count == 0) return true;
  if (comm.size() > 1) return false;
  kern::finish_single(KernelSite::of(in), in.dtype, in.data, out.data, out.count);
  return true;
}

}  // namespace pyring
