// A connected Communicator from its two host channels (transport/host_channel.h) after the
// rendezvous: the options completed with the registry's link classes, the links of both
// channels over the pairs' planned transports, and the point-to-point engine. The one entry
// that builds a communicator: pyring._C.Communicator calls it, and so does the native test
// program (tests/native/allreduce_ranks.cc), with no Python.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/communicator.h"
#include "core/topology.h"
#include "transport/host_channel.h"
#include "transport/shm/stream_copy.h"

namespace pyring {

struct AssembleArgs {
  int rank = 0;
  int size = 1;
  Options options;  // links, link_names and link_single_copy are filled here
  // Link class name -> (alpha in seconds, bytes per second), over the transports' defaults.
  std::map<std::string, std::pair<double, double>> model;
  Topology topology;
  uint32_t local_index = 0;
  uint32_t local_world = 1;
  std::string secret;  // authenticates tcp connections
  ShmCopy shm_copy = ShmCopy::kAuto;
  int tcp_streams = 1;
  std::vector<int> needed;  // the peers the collectives link to (needed_peers)
};

// Checks the arguments (InvalidArgument naming the bad one), then connects both channels,
// each ready()'d by every rank (and the ranks past the barrier it asked for). Blocks up to
// the timeout; throws CommError or TimeoutError naming the peer that could not be reached.
std::unique_ptr<Communicator> assemble(AssembleArgs args, const HostChannel& collectives,
                                       const HostChannel& p2p);

}  // namespace pyring
