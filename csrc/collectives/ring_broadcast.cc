// Broadcast and barrier along the ring.
//
// Broadcast: the root sends to its right; every other rank receives from its left straight into
// the buffer and forwards each piece as it lands, except the rank just before the root.
// Barrier: a one-byte token travels the ring twice from the ring's first rank; the second lap
// starts only after every rank has entered, so no rank leaves before all have arrived.
#include "collectives/collectives.h"
#include "collectives/driver.h"
#include "collectives/header.h"
#include "collectives/ring_phases.h"
#include "collectives/selector.h"
#include "core/link.h"

namespace pyring {

void ring_broadcast(Communicator& comm, const BufferView& buf, int root, Deadline deadline) {
  check_links_carry(comm, buf, buf, "broadcast");
  if (comm.size() == 1 || buf.bytes() == 0) return;
  note_ring_collective(comm, CollectiveKind::kBroadcast, buf.bytes());
  const SubRing ring = SubRing::of(comm.ring_order(), comm.rank());
  const PhaseInfo info{
      CollectiveKind::kBroadcast, buf.dtype, ReduceOp::kSum, buf.count, root, comm.size(),
      KernelSite::of(buf)};
  bcast_phase(comm, ring, SubRing::of(comm.ring_order(), root).pos, static_cast<uint8_t*>(buf.data),
              buf.bytes(), info, deadline);
}

void ring_barrier(Communicator& comm, Deadline deadline) {
  const int n = comm.size();
  if (n == 1) return;
  Link& left = comm.left();
  Link& right = comm.right();
  static const uint8_t kToken = 1;
  uint8_t sink[2];
  HeaderExchange header(comm.seq(), CollectiveKind::kBarrier, DType::kUInt8, ReduceOp::kSum, 0);
  header.post(&left, &right, comm.rank());
  auto pass_on = [&right](const uint8_t*, size_t, size_t) { right.post_send(&kToken, 1); };
  if (comm.rank() == comm.ring_order().front()) {
    right.post_send(&kToken, 1);
    left.post_recv(RecvSpec{1, &sink[0], pass_on});
    left.post_recv(RecvSpec{1, &sink[1], nullptr});
  } else {
    left.post_recv(RecvSpec{1, &sink[0], pass_on});
    left.post_recv(RecvSpec{1, &sink[1], pass_on});
  }
  drive({&left, &right}, deadline, comm.spin_us());
}

}  // namespace pyring
