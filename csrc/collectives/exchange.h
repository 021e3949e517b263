// The point-to-point exchange that gather, scatter and all_to_all are made of: blocks posted
// to and from peers, tagged with the collective's sequence number and kind, then driven to the
// end on the calling thread.
//
// A block of at least Communicator::single_copy_bytes() between ranks of one host goes single
// copy (core/single_copy.h): the sender posts a SingleCopyDesc, the receiver reads the
// sender's buffer into its own and acknowledges, and the sender's block completes with that
// acknowledgement. When the read fails the receiver says so in the acknowledgement, the block
// goes through the link instead, and the pair uses the link from then on. Both ends decide
// from their own block size, so they agree whenever the sizes do.
#pragma once

#include <memory>
#include <vector>

#include "collectives/collectives.h"
#include "core/communicator.h"
#include "core/single_copy.h"

namespace pyring {

// Posting may not throw half-way through a collective: the caller checks its arguments first.
class Exchange {
 public:
  // Blocks of one lane match among themselves only, in posting order per pair: a collective
  // may send its sizes on lane 1 and the payloads they announce on lane 0.
  static constexpr int kLanes = 2;
  Exchange(Communicator& comm, CollectiveKind kind, Deadline deadline, int lane = 0);
  ~Exchange();
  void recv(int peer, const Span& s);
  void send(int peer, const Span& s);
  // Drives every block to the end; rethrows the first error once none is pending.
  void wait();

 private:
  struct Block;
  P2pAddress addr(int peer, bool ack) const;
  void post_recv(int peer, void* data, size_t bytes, bool ack);
  void post_send(int peer, const void* data, size_t bytes, bool ack);
  bool step();  // advances single-copy blocks; true when everything has completed

  Communicator& comm_;
  CollectiveKind kind_;
  int lane_;
  Deadline deadline_;
  std::vector<std::shared_ptr<Work>> works_;
  std::vector<std::unique_ptr<Block>> blocks_;  // single-copy blocks in flight
};

}  // namespace pyring
