// The transport registry: which transport links each pair of ranks, decided once, here, from
// the endpoints every rank published (NCCL's transport list). Python gathers the endpoints
// through the store and never decides. Adding a transport is one folder plus one entry in
// registry.cc.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/types.h"

namespace pyring {

struct LinkSetup;
struct Links;

// What one rank published for one channel (collectives, or point-to-point).
struct Endpoint {
  int rank = -1;
  std::string host;  // ranks with the same host key share memory
  // Transport name -> the opaque address that transport published; a transport the rank did
  // not enable (PYRING_TRANSPORT) has no entry.
  std::map<std::string, std::string> addresses;

  bool publishes(const char* transport) const { return addresses.count(transport) > 0; }
  const std::string& address(const char* transport) const;  // throws CommError when absent
};

// How a thread waiting on the transport's links blocks (Link::poll_fd or Link::sleep_word).
enum class WaitKind { kPollFd, kFutexWord };

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // A pure function of the two endpoints, so that every rank decides the same for every pair.
  virtual bool can_connect(const Endpoint& self, const Endpoint& peer) const = 0;
  // The selector's figures unless the user gives others (PYRING_LINK_MODEL).
  virtual LinkModel default_costs() const = 0;
  virtual WaitKind wait_kind() const = 0;
  // The two ends can read each other's memory: single-copy transfers (collectives/exchange.h).
  virtual bool single_copy() const = 0;
  // Links this rank to `peers` (every one of them chose this transport), into out.by_rank.
  // Throws CommError or TimeoutError naming the peer that could not be reached.
  virtual void connect(const LinkSetup& setup, const std::vector<const Endpoint*>& peers,
                       const std::vector<Endpoint>& all, Links& out, Deadline deadline) const = 0;
};

// The transports in the order they are tried: the first that can connect a pair wins.
const std::vector<const Transport*>& transports();
int transport_index(const std::string& name);  // throws InvalidArgument listing the names

// The chosen transport of every pair: plan[a * n + b] indexes transports(); -1 on the
// diagonal. Throws CommError naming the pair when no transport can connect one.
std::vector<int> plan_transports(const std::vector<Endpoint>& endpoints);

}  // namespace pyring
