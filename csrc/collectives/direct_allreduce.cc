// Direct allreduce for small messages: every rank's whole input travels the ring (an
// allgather, size-1 hops), then every rank reduces the gathered inputs itself in rank order,
// so results are identical on every rank. Against the ring's 2(size-1) dependent hops this
// halves the latency; it moves (size-1)/size more bytes, which is why the selector uses it
// only for small messages.
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/driver.h"
#include "collectives/header.h"
#include "collectives/ring_phases.h"
#include "core/errors.h"
#include "core/link.h"
#include "kernels/reduce.h"

namespace pyring {

namespace {

// Two ranks, accumulating in the dtype itself: each rank sends straight from `in`, receives the
// peer's input into scratch, and reduces both into `out` as op(rank 1's, rank 0's), the operand
// order of the general path, so both ranks compute identical bits.
void two_rank_allreduce(Communicator& comm, const BufferView& in, const BufferView& out,
                        ReduceOp op, Deadline deadline) {
  const size_t bytes = in.bytes();
  uint8_t* theirs = comm.scratch(bytes);
  Link& peer = comm.right();
  HeaderExchange header(comm.seq(), CollectiveKind::kAllReduce, in.dtype, op, in.count);
  header.post(&peer, &peer, comm.rank());
  peer.post_send(static_cast<const uint8_t*>(in.data), bytes);
  RecvSpec spec;
  spec.bytes = bytes;
  spec.copy_to = theirs;
  peer.post_recv(std::move(spec));
  drive({&peer}, deadline, comm.spin_us());
  const void* mine = in.data;
  if (comm.rank() == 0) {
    reduce_finish(in.dtype, op, theirs, mine, out.data, in.count, 2);
  } else {
    reduce_finish(in.dtype, op, mine, theirs, out.data, in.count, 2);
  }
}

}  // namespace

void direct_allreduce(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
                      Deadline deadline) {
  const int n = comm.size();
  const DType dtype = in.dtype;
  if (nothing_to_exchange(comm, in, out)) return;
  const size_t bytes = in.bytes();
  const DType acc_type = accum_dtype(dtype);
  if (n == 2 && acc_type == dtype) return two_rank_allreduce(comm, in, out, op, deadline);
  uint8_t* gathered =
      comm.scratch(bytes * static_cast<size_t>(n) + in.count * dtype_size(acc_type));
  uint8_t* acc = gathered + bytes * static_cast<size_t>(n);
  const SubRing ring = SubRing::of(comm.ring_order(), comm.rank());
  // Slot k holds rank k's input.
  auto slot = [&](long steps) { return gathered + static_cast<size_t>(ring.at(steps)) * bytes; };
  Link& left = comm.left();
  Link& right = comm.right();
  HeaderExchange header(comm.seq(), CollectiveKind::kAllReduce, dtype, op, in.count);
  header.post(&left, &right, comm.rank());
  std::memcpy(slot(0), in.data, bytes);
  right.post_send(slot(0), bytes);
  for (int s = 0; s < n - 1; ++s) {
    RecvSpec spec;
    spec.bytes = bytes;
    spec.copy_to = slot(-s - 1);
    if (s < n - 2) {
      spec.on_piece = [&right](const uint8_t* data, size_t, size_t len) {
        right.post_send(data, len);
      };
    }
    left.post_recv(std::move(spec));
  }
  drive({&left, &right}, deadline, comm.spin_us());

  auto rank_slot = [&](int k) { return gathered + static_cast<size_t>(k) * bytes; };
  widen(dtype, rank_slot(0), acc, in.count);
  for (int k = 1; k < n - 1; ++k) reduce_accumulate(dtype, op, rank_slot(k), acc, acc, in.count);
  reduce_finish(dtype, op, rank_slot(n - 1), acc, out.data, in.count, n);
}

}  // namespace pyring
