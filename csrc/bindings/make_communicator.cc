// pyring._C.Communicator's constructor: options from Python's resolved configuration, the
// transport plan of the published endpoints, and the links of both channels.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "core/communicator.h"
#include "core/errors.h"
#include "core/link.h"
#include "core/topology.h"
#include "transport/factory.h"
#include "transport/registry.h"
#include "transport/shm/shm_segment.h"
#include "transport/tcp/tcp_connect.h"

namespace pyring::bindings {

CommunicatorPtr make_communicator(
    int rank, int size, double timeout_s, size_t segment_bytes, uint32_t local_index,
    uint32_t local_world, std::shared_ptr<ShmSegment> segment, TcpListener* listener,
    py::bytes secret, int algo, int spin_us, const std::vector<EndpointTuple>& endpoint_tuples,
    const std::vector<int>& needed, std::vector<std::string> level_names, Groups groups,
    int log_level, const ModelMap& model, double reduce_bytes_per_s,
    std::shared_ptr<ShmSegment> p2p_segment, TcpListener* p2p_listener,
    const std::vector<EndpointTuple>& p2p_tuples, size_t flight_entries, int shm_copy,
    int tcp_streams) {
  PYRING_CHECK_ARG(timeout_s > 0, "timeout must be positive, got ", timeout_s, " s");
  PYRING_CHECK_ARG(segment_bytes >= kPieceAlign, "segment_bytes must be at least ", kPieceAlign,
                   ", got ", segment_bytes);
  PYRING_CHECK_ARG(endpoint_tuples.size() == static_cast<size_t>(size) &&
                       p2p_tuples.size() == static_cast<size_t>(size),
                   "every rank's endpoint is needed: got ", endpoint_tuples.size(), " and ",
                   p2p_tuples.size(), " for world size ", size);
  Topology topology{std::move(level_names), std::move(groups)};
  topology.validate(size);
  Options opts;
  opts.timeout_s = timeout_s;
  opts.segment_bytes = segment_bytes;
  opts.algo = algo_from_int(algo);
  PYRING_CHECK_ARG(spin_us >= 0, "spin_us must be >= 0, got ", spin_us);
  opts.spin_us = spin_us;
  opts.log_level = log_level;
  opts.flight_entries = flight_entries;
  for (const Transport* t : transports()) {
    LinkModel m = t->default_costs();
    auto it = model.find(t->name());
    if (it != model.end()) m = LinkModel{it->second.first, it->second.second};
    PYRING_CHECK_ARG(m.alpha_s >= 0 && m.bytes_per_s > 0, "link model figures of ", t->name(),
                     " must be positive");
    opts.links.push_back(m);
    opts.link_names.push_back(t->name());
    opts.link_single_copy.push_back(t->single_copy() ? 1 : 0);
  }
  for (const auto& [name, figures] : model) transport_index(name);  // names a transport
  PYRING_CHECK_ARG(reduce_bytes_per_s > 0, "the reduction rate must be positive");
  opts.reduce_bytes_per_s = reduce_bytes_per_s;
  LinkSetup setup;
  setup.rank = rank;
  setup.size = size;
  setup.local_index = local_index;
  setup.local_world = local_world;
  setup.own_segment = std::move(segment);
  setup.listener = listener;
  setup.secret = secret;
  setup.segment_bytes = segment_bytes;
  PYRING_CHECK_ARG(shm_copy >= 0 && shm_copy < kNumShmCopies, "shm_copy code ", shm_copy,
                   " out of range");
  setup.shm_copy = static_cast<ShmCopy>(shm_copy);
  PYRING_CHECK_ARG(tcp_streams >= 1 && tcp_streams <= kMaxTcpStreams, "tcp_streams must be in 1..",
                   kMaxTcpStreams, ", got ", tcp_streams);
  setup.tcp_streams = tcp_streams;
  setup.log_level = log_level;
  setup.timeout_s = timeout_s;
  LinkSetup p2p_setup = setup;
  p2p_setup.own_segment = std::move(p2p_segment);
  p2p_setup.listener = p2p_listener;
  const std::vector<Endpoint> endpoints = endpoints_of(endpoint_tuples);
  const std::vector<Endpoint> p2p_endpoints = endpoints_of(p2p_tuples);
  std::vector<int> plan = plan_transports(endpoints);
  std::vector<int> everyone;
  for (int r = 0; r < size; ++r) {
    if (r != rank) everyone.push_back(r);
  }
  Links links, p2p_links;
  {
    py::gil_scoped_release nogil;
    const Deadline deadline = Deadline::after(timeout_s);
    links = make_links(setup, endpoints, plan, needed, deadline);
    p2p_links =
        make_links(p2p_setup, p2p_endpoints, plan_transports(p2p_endpoints), everyone, deadline);
  }
  auto p2p = std::make_shared<P2pEngine>(rank, std::move(p2p_links.by_rank), p2p_links.keepalive(),
                                         spin_us);
  p2p->start();
  return CommunicatorPtr(new Communicator(rank, size, opts, std::move(topology), std::move(plan),
                                          std::move(links.by_rank), links.keepalive(),
                                          std::move(p2p)));
}

}  // namespace pyring::bindings
