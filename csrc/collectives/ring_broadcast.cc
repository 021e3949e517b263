// Broadcast and barrier along the ring.
//
// Broadcast: the root sends to its right; every other rank receives from its left straight into
// the buffer and forwards each piece as it lands, except the rank just before the root.
// Barrier: a one-byte token travels the ring twice from rank 0; the second lap starts only
// after every rank has entered, so no rank leaves before all have arrived.
#include "collectives/collectives.h"
#include "collectives/driver.h"
#include "collectives/header.h"
#include "transport/link.h"

namespace pyring {

void ring_broadcast(Communicator& comm, const BufferView& buf, int root, Deadline deadline) {
  const int n = comm.size();
  const int r = comm.rank();
  if (n == 1 || buf.bytes() == 0) return;
  Link& left = comm.left();
  Link& right = comm.right();
  auto* data = static_cast<uint8_t*>(buf.data);
  const bool forwards = static_cast<int>(ring_index(r + 1, n)) != root;
  HeaderExchange header(comm.seq(), CollectiveKind::kBroadcast, buf.dtype, ReduceOp::kSum,
                        buf.count, root);
  header.post(r == root ? nullptr : &left, forwards ? &right : nullptr, r);
  if (r == root) {
    right.post_send(data, buf.bytes());
  } else {
    RecvSpec spec;
    spec.bytes = buf.bytes();
    spec.copy_to = data;
    if (forwards) {
      spec.on_piece = [&right](const uint8_t* piece, size_t, size_t len) {
        right.post_send(piece, len);
      };
    }
    left.post_recv(std::move(spec));
  }
  drive({&left, &right}, deadline, comm.spin_us());
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
  if (comm.rank() == 0) {
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
