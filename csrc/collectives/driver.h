// Drives posted link operations to completion for one collective.
#pragma once

#include <initializer_list>
#include <vector>

#include "collectives/header.h"
#include "core/link.h"
#include "core/types.h"

namespace pyring {

class Communicator;

// Calls progress() on `links` (any number; duplicates and nulls allowed) until all are idle.
// Polls for `spin_us` microseconds without progress, then blocks; each time it wakes it checks
// the peers. Throws CommError when a peer dies or gives up, TimeoutError at `deadline` naming
// what was still pending. `background` links are progressed too but need not go idle: an
// earlier phase still in flight beside this one.
void drive(std::vector<Link*> links, Deadline deadline, int spin_us,
           std::vector<Link*> background = {});
inline void drive(std::initializer_list<Link*> links, Deadline deadline, int spin_us) {
  drive(std::vector<Link*>(links), deadline, spin_us);
}

// Splits `count` elements into `parts` chunks whose sizes differ by at most one element.
struct Chunks {
  size_t count;
  size_t parts;
  size_t offset(size_t i) const {
    return i * (count / parts) + (i < count % parts ? i : count % parts);
  }
  size_t size(size_t i) const { return count / parts + (i < count % parts ? 1 : 0); }
};

inline size_t ring_index(long i, int n) {
  return static_cast<size_t>(((i % n) + n) % n);
}

// Sends `header` to this rank's right ring neighbour, checks the one from its left and waits
// for it: for a collective whose data travels other links (the p2p exchange of gather, scatter,
// all_to_all and the compressed all_reduce), so that a neighbour calling something else (another
// root, size or wire, or the full-precision all_reduce) raises CommError naming both before any
// data moves. Ranks further round the ring learn of it from the ones that raise.
void check_ring_header(Communicator& comm, HeaderExchange& header, Deadline deadline);

}  // namespace pyring
