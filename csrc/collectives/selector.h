// The one place that picks the algorithm of every collective, and says why.
//
// auto compares alpha-beta estimates built from Options::links (one figure per link class)
// and the topology; every rank decides from the same global inputs, so all ranks agree. A
// forced algorithm (init's algo or the call's) is taken as is. At log level INFO each
// distinct decision is written once, with its reason.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/header.h"
#include "core/communicator.h"

namespace pyring {

struct Estimate {
  double ring_s = 0;
  double direct_s = 0;
  double tree_s = 0;
};

// The slowest (highest) link class between the first of `ranks` and the others: the class
// every rank of the list computes alike. 0 for fewer than two ranks.
int slowest_class(const Communicator& comm, const std::vector<int>& ranks);

// Estimated allreduce times of each algorithm for `bytes` on this communicator.
Estimate estimate_allreduce(const Communicator& comm, size_t bytes);

// The algorithm an allreduce of `bytes` runs with: `requested` unless it is kAuto. Counts the
// call under the algorithm chosen.
Algo select_allreduce(Communicator& comm, size_t bytes, Algo requested);

// Reduce-scatter and allgather of `bytes` (the full buffer): the tree on an even topology
// when the communicator's algo is tree, or auto and the estimate favours it; else the ring.
Algo select_gather_scatter(Communicator& comm, CollectiveKind kind, size_t bytes);

// The compressed allreduce of `elements` on `wire` (collectives/compressed.h): the top-level
// groups when it goes hierarchical (auto or tree, several groups, some of more than one
// rank: full precision inside a group costs little beside the compressed bytes between
// groups), else empty (flat). Counts the call (tree or direct) and logs why once.
std::vector<std::vector<int>> select_compressed(Communicator& comm, const char* wire,
                                                size_t elements, Algo requested);
// The same choice, without counting or logging.
std::vector<std::vector<int>> compressed_groups(const Communicator& comm, Algo requested);

// Broadcast runs on the topology-ordered ring; this counts the call and logs why once.
void note_ring_collective(Communicator& comm, CollectiveKind kind, size_t bytes);

// "64 MiB", "4 KiB", "100 B"
std::string human_bytes(size_t bytes);

}  // namespace pyring
