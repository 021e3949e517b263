// gather, scatter and all_to_all over the point-to-point links.
#include <cstring>
#include <exception>

#include "collectives/collectives.h"
#include "collectives/header.h"
#include "core/errors.h"
#include "core/p2p.h"

namespace pyring {

namespace {

// Posts the receives (first, so that payloads land in place) and the sends of one collective,
// then waits for all of them. Rethrows the first error once none is pending.
struct Exchange {
  Communicator& comm;
  CollectiveKind kind;
  Deadline deadline;
  std::vector<std::shared_ptr<Work>> works;

  P2pAddress addr(int peer) const {
    return P2pAddress{peer, static_cast<int64_t>(comm.seq()), P2pContext::kCollective,
                      static_cast<uint8_t>(kind)};
  }
  void recv(int peer, const Span& s) {
    works.push_back(comm.p2p().recv(s.data, s.bytes, addr(peer), deadline, true));
  }
  void send(int peer, const Span& s) {
    works.push_back(comm.p2p().send(s.data, s.bytes, addr(peer), deadline, true));
  }
  void wait() {
    comm.p2p().wait_all(works);
    std::exception_ptr first;
    for (const auto& w : works) {
      try {
        w->wait(-1);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }
};

void copy_own(const Span& from, const Span& to) {
  PYRING_CHECK_ARG(from.bytes == to.bytes, "this rank's own block is ", from.bytes,
                   " bytes in and ", to.bytes, " bytes out");
  if (from.bytes && from.data != to.data) std::memmove(to.data, from.data, from.bytes);
}

}  // namespace

void gather(Communicator& comm, const Span& in, const std::vector<Span>& blocks, int root,
            Deadline deadline) {
  Exchange ex{comm, CollectiveKind::kGather, deadline, {}};
  if (comm.rank() != root) {
    ex.send(root, in);
  } else {
    for (int r = 0; r < comm.size(); ++r) {
      if (r != root) ex.recv(r, blocks[static_cast<size_t>(r)]);
    }
    copy_own(in, blocks[static_cast<size_t>(root)]);
  }
  ex.wait();
}

void scatter(Communicator& comm, const std::vector<Span>& blocks, const Span& out, int root,
             Deadline deadline) {
  Exchange ex{comm, CollectiveKind::kScatter, deadline, {}};
  if (comm.rank() != root) {
    ex.recv(root, out);
  } else {
    for (int r = 0; r < comm.size(); ++r) {
      if (r != root) ex.send(r, blocks[static_cast<size_t>(r)]);
    }
    copy_own(blocks[static_cast<size_t>(root)], out);
  }
  ex.wait();
}

void all_to_all(Communicator& comm, const std::vector<Span>& in, const std::vector<Span>& out,
                Deadline deadline) {
  Exchange ex{comm, CollectiveKind::kAllToAll, deadline, {}};
  const int n = comm.size(), me = comm.rank();
  // Rank me + k sends to me - k: every rank starts with a different peer.
  for (int k = 1; k < n; ++k) ex.recv((me - k + n) % n, out[static_cast<size_t>((me - k + n) % n)]);
  for (int k = 1; k < n; ++k) ex.send((me + k) % n, in[static_cast<size_t>((me + k) % n)]);
  copy_own(in[static_cast<size_t>(me)], out[static_cast<size_t>(me)]);
  ex.wait();
}

}  // namespace pyring
