// Device-resident collectives (collectives.h): the ring algorithms over the communicator's
// device links. The ring is the one schedule whose every step is a whole-segment copy into the
// neighbour's device memory and one kernel, with no host-side reduction.
#include "collectives/collectives.h"
#include "collectives/selector.h"
#include "core/errors.h"

namespace pyring {

namespace {

// One rank moves nothing over links: no ring to note.
void note_resident(Communicator& comm, const char* name, const BufferView& in, size_t bytes) {
  if (comm.size() == 1) return;
  comm.count_call(Algo::kRing);
  comm.log_once(1, str_cat("resident/", name), [&] {
    return str_cat(name, " ", human_bytes(bytes), " on ", in.device.str(), ": ring on the device (",
                   comm.device_transport(),
                   " links every rank's device memory, so segments move device to device and "
                   "reduce there without staging through the host)");
  });
}

}  // namespace

void resident_allreduce(Communicator& comm, const BufferView& in, const BufferView& out,
                        ReduceOp op, Deadline deadline) {
  check_links_carry(comm, in, out, "all_reduce");
  note_resident(comm, "all_reduce", in, in.bytes());
  ring_allreduce(comm, in, out, op, deadline);
}

void resident_reduce_scatter(Communicator& comm, const BufferView& in, const BufferView& out,
                             ReduceOp op, Deadline deadline) {
  check_links_carry(comm, in, out, "reduce_scatter");
  note_resident(comm, "reduce_scatter", in, in.bytes());
  ring_reduce_scatter(comm, in, out, op, deadline);
}

void resident_allgather(Communicator& comm, const BufferView& in, const BufferView& out,
                        Deadline deadline) {
  check_links_carry(comm, in, out, "allgather");
  note_resident(comm, "allgather", in, out.bytes());
  ring_allgather(comm, in, out, deadline);
}

}  // namespace pyring
