// pyring._C.Communicator's constructor: Python's resolved configuration into AssembleArgs, and
// transport/assemble.h with the two channels the rendezvous readied.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "core/communicator.h"
#include "core/errors.h"
#include "core/topology.h"
#include "transport/assemble.h"

namespace pyring::bindings {

CommunicatorPtr make_communicator(int rank, int size, double timeout_s, size_t segment_bytes,
                                  uint32_t local_index, uint32_t local_world,
                                  std::shared_ptr<HostChannel> channel, py::bytes secret, int algo,
                                  int spin_us, const std::vector<int>& needed,
                                  std::vector<std::string> level_names, Groups groups,
                                  int log_level, const ModelMap& model, double reduce_bytes_per_s,
                                  std::shared_ptr<HostChannel> p2p_channel, size_t flight_entries,
                                  int shm_copy, int tcp_streams) {
  PYRING_CHECK_ARG(channel && p2p_channel, "a communicator needs both channels");
  PYRING_CHECK_ARG(shm_copy >= 0 && shm_copy < kNumShmCopies, "shm_copy code ", shm_copy,
                   " out of range");
  AssembleArgs args;
  args.rank = rank;
  args.size = size;
  args.options.timeout_s = timeout_s;
  args.options.segment_bytes = segment_bytes;
  args.options.algo = algo_from_int(algo);
  args.options.spin_us = spin_us;
  args.options.log_level = log_level;
  args.options.flight_entries = flight_entries;
  args.options.reduce_bytes_per_s = reduce_bytes_per_s;
  args.model = model;
  args.topology = Topology{std::move(level_names), std::move(groups)};
  args.local_index = local_index;
  args.local_world = local_world;
  args.secret = secret;
  args.shm_copy = static_cast<ShmCopy>(shm_copy);
  args.tcp_streams = tcp_streams;
  args.needed = needed;
  py::gil_scoped_release nogil;
  return CommunicatorPtr(assemble(std::move(args), *channel, *p2p_channel).release());
}

}  // namespace pyring::bindings
