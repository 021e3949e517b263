// Direct allreduce for small messages: every rank's whole input travels the ring (an
// allgather, size-1 hops), then every rank reduces the gathered inputs itself in rank order,
// so results are identical on every rank. Against the ring's 2(size-1) dependent hops this
// halves the latency; it moves (size-1)/size more bytes, which is why the selector uses it
// only for small messages.
#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/driver.h"
#include "collectives/header.h"
#include "collectives/ring_phases.h"
#include "core/errors.h"
#include "core/link.h"
#include "kernels/dispatch.h"

namespace pyring {

namespace {

// Two ranks, accumulating in the dtype itself: each rank sends straight from `in` and reduces
// the peer's pieces into `out` as they land, as op(rank 1's, rank 0's), the operand order of
// the general path, so both ranks compute identical bits. A piece that lands while `out` is
// `in` and `in` is still being sent is set aside in scratch and reduced once the send is done.
void two_rank_allreduce(Communicator& comm, const BufferView& in, const BufferView& out,
                        ReduceOp op, Deadline deadline) {
  const size_t bytes = in.bytes();
  const size_t esize = dtype_size(in.dtype);
  uint8_t* theirs = comm.scratch(bytes);
  const auto* mine = static_cast<const uint8_t*>(in.data);
  auto* dst = static_cast<uint8_t*>(out.data);
  const bool first = comm.rank() == 0;
  Link& peer = comm.right();
  auto reduce = [&](const uint8_t* from_peer, size_t off, size_t len) {
    const void* r0 = first ? mine + off : from_peer;
    const void* r1 = first ? from_peer : mine + off;
    kern::finish(KernelSite::of(in), in.dtype, op, r1, r0, dst + off, len / esize, 2);
  };
  HeaderExchange header(comm.seq(), CollectiveKind::kAllReduce, in.dtype, op, in.count,
                        comm.call_root());
  header.post(&peer, &peer, comm.rank());
  peer.post_send(mine, bytes);
  size_t set_aside_from = bytes;  // pieces from here on wait in scratch
  RecvSpec spec;
  spec.bytes = bytes;
  spec.on_piece = [&](const uint8_t* data, size_t off, size_t len) {
    if (set_aside_from == bytes && !(dst == mine && peer.sending())) {
      reduce(data, off, len);
      return;
    }
    set_aside_from = std::min(set_aside_from, off);
    std::memcpy(theirs + off, data, len);
  };
  peer.post_recv(std::move(spec));
  drive({&peer}, deadline, comm.spin_us());
  if (set_aside_from < bytes)
    reduce(theirs + set_aside_from, set_aside_from, bytes - set_aside_from);
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
  const size_t at = accum_offset(bytes * static_cast<size_t>(n));
  uint8_t* gathered = comm.scratch(at + in.count * dtype_size(acc_type));
  uint8_t* acc = gathered + at;
  const SubRing ring = SubRing::of(comm.ring_order(), comm.rank());
  // Slot k holds rank k's input.
  auto slot = [&](long steps) { return gathered + static_cast<size_t>(ring.at(steps)) * bytes; };
  Link& left = comm.left();
  Link& right = comm.right();
  HeaderExchange header(comm.seq(), CollectiveKind::kAllReduce, dtype, op, in.count,
                        comm.call_root());
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
  const KernelSite site = KernelSite::of(in);
  kern::widen(site, dtype, rank_slot(0), acc, in.count);
  for (int k = 1; k < n - 1; ++k)
    kern::accumulate(site, dtype, op, rank_slot(k), acc, acc, in.count);
  kern::finish(site, dtype, op, rank_slot(n - 1), acc, out.data, in.count, n);
}

}  // namespace pyring
