// gather, scatter and all_to_all over the point-to-point links.
#include <cstring>
#include <exception>

#include "collectives/collectives.h"
#include "collectives/driver.h"
#include "collectives/exchange.h"
#include "collectives/header.h"
#include "core/errors.h"
#include "core/p2p.h"

namespace pyring {

namespace {

void copy_own(const Span& from, const Span& to) {
  PYRING_CHECK_ARG(from.bytes == to.bytes, "this rank's own block is ", from.bytes,
                   " bytes in and ", to.bytes, " bytes out");
  if (from.bytes && from.data != to.data) std::memmove(to.data, from.data, from.bytes);
}

}  // namespace

void gather(Communicator& comm, const Span& in, const std::vector<Span>& blocks, int root,
            Deadline deadline) {
  HeaderExchange header(comm.seq(), CollectiveKind::kGather, DType::kUInt8, ReduceOp::kSum,
                        in.bytes, root);
  check_ring_header(comm, header, deadline);
  Exchange ex(comm, CollectiveKind::kGather, deadline);
  if (comm.rank() != root) {
    ex.send(root, in);
  } else {
    copy_own(in, blocks[static_cast<size_t>(root)]);
    for (int r = 0; r < comm.size(); ++r) {
      if (r != root) ex.recv(r, blocks[static_cast<size_t>(r)]);
    }
  }
  ex.wait();
}

void scatter(Communicator& comm, const std::vector<Span>& blocks, const Span& out, int root,
             Deadline deadline) {
  HeaderExchange header(comm.seq(), CollectiveKind::kScatter, DType::kUInt8, ReduceOp::kSum,
                        out.bytes, root);
  check_ring_header(comm, header, deadline);
  Exchange ex(comm, CollectiveKind::kScatter, deadline);
  if (comm.rank() != root) {
    ex.recv(root, out);
  } else {
    copy_own(blocks[static_cast<size_t>(root)], out);
    for (int r = 0; r < comm.size(); ++r) {
      if (r != root) ex.send(r, blocks[static_cast<size_t>(r)]);
    }
  }
  ex.wait();
}

void all_to_all(Communicator& comm, const std::vector<Span>& in, const std::vector<Span>& out,
                Deadline deadline) {
  // Kind only: with uneven splits the ranks' sizes differ.
  HeaderExchange header(comm.seq(), CollectiveKind::kAllToAll, DType::kUInt8, ReduceOp::kSum, 0);
  check_ring_header(comm, header, deadline);
  Exchange ex(comm, CollectiveKind::kAllToAll, deadline);
  const int n = comm.size(), me = comm.rank();
  copy_own(in[static_cast<size_t>(me)], out[static_cast<size_t>(me)]);  // may throw: before posts
  // Receives first, so that payloads land in place; rank me + k sends to me - k: every rank
  // starts with a different peer.
  for (int k = 1; k < n; ++k) ex.recv((me - k + n) % n, out[static_cast<size_t>((me - k + n) % n)]);
  for (int k = 1; k < n; ++k) ex.send((me + k) % n, in[static_cast<size_t>((me + k) % n)]);
  ex.wait();
}

}  // namespace pyring
