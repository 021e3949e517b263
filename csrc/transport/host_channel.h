// This rank's host transports for one channel (collectives, or point-to-point), through the
// rendezvous: every enabled transport prepares its resources and spells its address, the caller
// publishes the addresses and gathers every rank's, ready() plans every pair once (the
// registry's plan_transports) and makes what needs the peers, the communicator connects with
// prepared(), and release() removes what strangers could still find. The caller orders the
// ranks between the steps (a barrier after ready() where it says so, and after connecting).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transport/registry.h"

namespace pyring {

class HostChannel {
 public:
  // Prepares every host transport named in `enabled` (all of them when empty). Throws
  // InvalidArgument for a name the registry lacks.
  HostChannel(const HostSetup& setup, const std::vector<std::string>& enabled);
  ~HostChannel();  // releases what is left
  HostChannel(const HostChannel&) = delete;
  HostChannel& operator=(const HostChannel&) = delete;

  // What to publish: transport name -> its opaque address.
  const std::map<std::string, std::string>& addresses() const { return addresses_; }
  // Plans every pair of `endpoints` (this rank is setup.rank, its endpoint's addresses those
  // published here) and readies the transports this rank's peers use. True when local peers
  // must wait for every local rank's ready() before connecting.
  bool ready(const std::vector<Endpoint>& endpoints, uint32_t local_world);
  // After ready(): the plan (plan_transports), and each transport's state by name.
  const std::vector<int>& plan() const { return plan_; }
  const std::vector<Endpoint>& endpoints() const { return endpoints_; }
  const std::map<std::string, std::shared_ptr<void>>& prepared() const { return states_; }
  // The planned transport between this rank and `peer`; null for this rank itself. Throws
  // InvalidArgument for a peer out of range or before ready().
  const char* transport_of(int peer) const;
  // Every transport's counters, "transport.counter" -> value.
  std::map<std::string, uint64_t> counters() const;
  void release();

 private:
  HostSetup setup_;
  std::map<std::string, std::shared_ptr<void>> states_;
  std::map<std::string, std::string> addresses_;
  std::vector<Endpoint> endpoints_;
  std::vector<int> plan_;
  bool released_ = false;
};

}  // namespace pyring
