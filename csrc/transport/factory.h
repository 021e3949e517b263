// Builds this rank's links: for each peer it needs, the transport the registry chose.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/link.h"
#include "core/types.h"
#include "transport/registry.h"
#include "transport/shm/stream_copy.h"

namespace pyring {

// This rank's resources and settings, for the transports' connect().
struct LinkSetup {
  int rank = 0;
  int size = 1;
  uint32_t local_index = 0;
  uint32_t local_world = 1;
  std::string secret;
  size_t segment_bytes = 0;
  ShmCopy shm_copy = ShmCopy::kAuto;
  int tcp_streams = 1;   // connections per tcp link (PYRING_SOCKET_NSTREAMS)
  int log_level = 0;     // >= 1: report connections dropped during the tcp rendezvous
  double timeout_s = 0;  // the communicator's deadline; tcp ties its liveness checks to it
  // Each transport's prepared state by name (Transport::prepare: host transports through
  // transport/host_channel.h). Device transports: the device, the stream their copies are
  // queued on (the device queue's, so that they order with its kernels), and what keeps that
  // stream alive.
  Device device;
  StreamId stream = 0;
  std::shared_ptr<void> stream_owner;
  std::map<std::string, std::shared_ptr<void>> prepared;
};

struct Links {
  std::vector<std::unique_ptr<Link>> by_rank;   // size() == setup.size
  std::vector<std::shared_ptr<void>> segments;  // transport state the links map

  // Keeps the segments alive for as long as the links are.
  std::shared_ptr<void> keepalive() const {
    return std::make_shared<std::vector<std::shared_ptr<void>>>(segments);
  }
};

// Links this rank to `needed` peers, each over plan[rank * n + peer] (plan_transports of
// `endpoints`). Throws CommError or TimeoutError naming the peer that could not be reached.
Links make_links(const LinkSetup& setup, const std::vector<Endpoint>& endpoints,
                 const std::vector<int>& plan, const std::vector<int>& needed, Deadline deadline);

}  // namespace pyring
