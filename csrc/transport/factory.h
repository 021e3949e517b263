// The one place that picks and builds the transport for each peer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/link.h"
#include "core/types.h"
#include "transport/shm/stream_copy.h"

namespace pyring {

class ShmSegment;
class TcpListener;

enum class TransportKind { kNone, kShm, kTcp };

struct PeerSpec {
  int rank = -1;
  TransportKind transport = TransportKind::kNone;
  uint32_t local_index = 0;  // shm: the peer's index among the ranks of this host
  std::string shm_name;      // shm: the peer's segment
  std::string host;          // tcp: the peer's listening address
  int port = 0;
};

struct LinkSetup {
  int rank = 0;
  int size = 1;
  uint32_t local_index = 0;
  uint32_t local_world = 1;
  std::shared_ptr<ShmSegment> own_segment;  // required when any peer uses shm
  TcpListener* listener = nullptr;          // required when any peer uses tcp
  std::string secret;
  size_t segment_bytes = 0;
  ShmCopy shm_copy = ShmCopy::kAuto;
  int tcp_streams = 1;  // connections per tcp link (PYRING_SOCKET_NSTREAMS)
  int log_level = 0;    // >= 1: report connections dropped during the tcp rendezvous
};

struct Links {
  std::vector<std::unique_ptr<Link>> by_rank;  // size() == setup.size
  std::shared_ptr<void> keepalive;             // segments the shm links map
};

// Attaches the shm peers' segments and connects the tcp peers. Throws CommError or
// TimeoutError naming the peer that could not be reached.
Links make_links(const LinkSetup& setup, const std::vector<PeerSpec>& peers, Deadline deadline);

}  // namespace pyring
