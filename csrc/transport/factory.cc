#include "transport/factory.h"

#include <unistd.h>

#include "core/errors.h"
#include "transport/shm/shm_link.h"
#include "transport/shm/shm_segment.h"
#include "transport/tcp/tcp_connect.h"
#include "transport/tcp/tcp_link.h"
#include "transport/tcp/tcp_striped_link.h"

namespace pyring {

Links make_links(const LinkSetup& setup, const std::vector<PeerSpec>& peers, Deadline deadline) {
  Links out;
  out.by_rank.resize(static_cast<size_t>(setup.size));
  auto segments = std::make_shared<std::vector<std::shared_ptr<ShmSegment>>>();
  std::vector<TcpPeer> tcp_peers;
  for (const auto& p : peers) {
    PYRING_CHECK_ARG(p.rank >= 0 && p.rank < setup.size && p.rank != setup.rank, "peer rank ",
                     p.rank, " out of range for rank ", setup.rank, " of ", setup.size);
    if (p.transport == TransportKind::kShm) {
      PYRING_CHECK_ARG(setup.own_segment != nullptr, "shm peer without a local segment");
      PYRING_CHECK_ARG(p.local_index < setup.local_world, "local index ", p.local_index,
                       " out of range for local world ", setup.local_world);
      const auto* h = setup.own_segment->header();
      auto seg = ShmSegment::attach(p.shm_name, setup.local_world, h->nslots, h->slot_bytes);
      segments->push_back(seg);
      out.by_rank[static_cast<size_t>(p.rank)] = std::make_unique<ShmLink>(
          p.rank, setup.local_index, p.local_index, setup.own_segment, seg, setup.shm_copy);
    } else if (p.transport == TransportKind::kTcp) {
      tcp_peers.push_back(TcpPeer{p.rank, p.host, p.port});
    }
  }
  if (!tcp_peers.empty()) {
    PYRING_CHECK_ARG(setup.listener != nullptr, "tcp peers without a listener");
    auto fds = tcp_establish(setup.rank, *setup.listener, tcp_peers, setup.secret, deadline,
                             setup.log_level, setup.tcp_streams);
    for (auto& [rank, streams] : fds) {
      auto& link = out.by_rank[static_cast<size_t>(rank)];
      if (streams.size() == 1) {
        link = std::make_unique<TcpLink>(rank, streams[0], setup.segment_bytes);
      } else {
        link = std::make_unique<TcpStripedLink>(rank, std::move(streams), setup.segment_bytes);
      }
    }
  }
  if (setup.own_segment) segments->push_back(setup.own_segment);
  out.keepalive = segments;
  return out;
}

}  // namespace pyring
