#include "transport/assemble.h"

#include "core/errors.h"
#include "core/link.h"
#include "core/p2p.h"
#include "transport/factory.h"
#include "transport/registry.h"
#include "transport/tcp/tcp_connect.h"

namespace pyring {

std::unique_ptr<Communicator> assemble(AssembleArgs args, const HostChannel& collectives,
                                       const HostChannel& p2p) {
  Options& opts = args.options;
  PYRING_CHECK_ARG(opts.timeout_s > 0, "timeout must be positive, got ", opts.timeout_s, " s");
  PYRING_CHECK_ARG(opts.segment_bytes >= kPieceAlign, "segment_bytes must be at least ",
                   kPieceAlign, ", got ", opts.segment_bytes);
  PYRING_CHECK_ARG(opts.spin_us >= 0, "spin_us must be >= 0, got ", opts.spin_us);
  PYRING_CHECK_ARG(opts.reduce_bytes_per_s > 0, "the reduction rate must be positive");
  PYRING_CHECK_ARG(collectives.endpoints().size() == static_cast<size_t>(args.size) &&
                       p2p.endpoints().size() == static_cast<size_t>(args.size),
                   "every rank's endpoint is needed: got ", collectives.endpoints().size(), " and ",
                   p2p.endpoints().size(), " for world size ", args.size,
                   " (HostChannel::ready first)");
  PYRING_CHECK_ARG(args.tcp_streams >= 1 && args.tcp_streams <= kMaxTcpStreams,
                   "tcp_streams must be in 1..", kMaxTcpStreams, ", got ", args.tcp_streams);
  args.topology.validate(args.size);
  opts.links.clear();
  opts.link_names.clear();
  opts.link_single_copy.clear();
  for (const Transport* t : transports()) {
    LinkModel m = t->default_costs();
    auto it = args.model.find(t->name());
    if (it != args.model.end()) m = LinkModel{it->second.first, it->second.second};
    PYRING_CHECK_ARG(m.alpha_s >= 0 && m.bytes_per_s > 0, "link model figures of ", t->name(),
                     " must be positive");
    opts.links.push_back(m);
    opts.link_names.push_back(t->name());
    opts.link_single_copy.push_back(t->single_copy() ? 1 : 0);
  }
  for (const auto& [name, figures] : args.model) transport_index(name);  // names a transport
  LinkSetup setup;
  setup.rank = args.rank;
  setup.size = args.size;
  setup.local_index = args.local_index;
  setup.local_world = args.local_world;
  setup.secret = args.secret;
  setup.segment_bytes = opts.segment_bytes;
  setup.shm_copy = args.shm_copy;
  setup.tcp_streams = args.tcp_streams;
  setup.log_level = opts.log_level;
  setup.timeout_s = opts.timeout_s;
  setup.prepared = collectives.prepared();
  LinkSetup p2p_setup = setup;
  p2p_setup.prepared = p2p.prepared();
  std::vector<int> everyone;
  for (int r = 0; r < args.size; ++r) {
    if (r != args.rank) everyone.push_back(r);
  }
  const Deadline deadline = Deadline::after(opts.timeout_s);
  Links links =
      make_links(setup, collectives.endpoints(), collectives.plan(), args.needed, deadline);
  Links p2p_links = make_links(p2p_setup, p2p.endpoints(), p2p.plan(), everyone, deadline);
  auto engine = std::make_shared<P2pEngine>(args.rank, std::move(p2p_links.by_rank),
                                            p2p_links.keepalive(), opts.spin_us);
  engine->start();
  return std::make_unique<Communicator>(args.rank, args.size, opts, std::move(args.topology),
                                        collectives.plan(), std::move(links.by_rank),
                                        links.keepalive(), std::move(engine));
}

}  // namespace pyring
