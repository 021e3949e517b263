// The transport registry: which transport links each pair of ranks, decided once, here, from
// the endpoints every rank published (NCCL's transport list). Each transport makes its own
// resources and spells its own address; Python publishes and gathers the opaque bytes through
// the store and never decides. Adding a transport is one folder plus one entry in registry.cc.
#pragma once

#include <map>
#include <memory>
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

// How a thread waiting on the transport's links blocks: Link::poll_fd, Link::sleep_word, or
// neither (kPoll: progress waits on device work that wakes no thread; the waiter re-polls).
enum class WaitKind { kPollFd, kFutexWord, kPoll };

// What memory a transport's links carry: host buffers (every collective), or device buffers
// (the collectives a device queue runs on the device itself, core/device_queue.h).
enum class Memory { kHost, kDevice };

// A device transport's resources, made before the rendezvous (its address names them).
struct DeviceSetup {
  Device device;
  uint32_t local_world = 1;
  size_t slot_bytes = 0;  // pipelining unit
  std::string label;      // of this rank's host shared memory, if it needs some (SharedFile)
  // The ranks whose device links send to this rank: the ring's left neighbour, for the device
  // collectives are ring schedules. A transport may give receive memory to these alone.
  std::vector<int> senders;
};

// A host transport's setting for one channel of this rank, before the rendezvous.
struct HostSetup {
  int rank = 0;
  std::string job;      // unique per job: labels the resources (shared_file_label)
  std::string channel;  // "" (collectives) or "p2p"
  std::string host_ip;  // the IPv4 address this rank is reached at
  size_t segment_bytes = 0;
};

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
  virtual Memory memory() const { return Memory::kHost; }
  // Device transports: makes this rank's resources and returns the state connect() reads from
  // setup.prepared, with the address to publish in *address. Throws where the device refuses
  // (CudaError); the rank then publishes no address for this transport. release(state), as
  // for host transports, once every rank connected or on failure.
  virtual std::shared_ptr<void> prepare(const DeviceSetup& setup, std::string* address) const;
  // Host transports, in three steps around the rendezvous (transport/host_channel.h):
  // prepare makes what the address names before it is published and returns the state
  // connect() reads from setup.prepared (null: this transport offers nothing here, and no
  // address is published); ready, once every rank's endpoint is known, makes what needs them
  // (`used`: some peer of this rank goes over this transport) and says whether peers must wait
  // for it before they connect; release, once every peer connected or on failure, removes
  // what strangers could still find (a listening port, a descriptor peers open a file
  // through), the links staying up.
  virtual std::shared_ptr<void> prepare(const HostSetup& setup, std::string* address) const;
  virtual bool ready(void* state, const std::vector<Endpoint>& all, int rank, uint32_t local_world,
                     bool used) const;
  virtual void release(void* state) const;
  // What the resources counted (tcp: connections dropped during the rendezvous, by why).
  virtual std::map<std::string, uint64_t> counters(const void* state) const;
  // Links this rank to `peers` (every one of them chose this transport), into out.by_rank.
  // Throws CommError or TimeoutError naming the peer that could not be reached.
  virtual void connect(const LinkSetup& setup, const std::vector<const Endpoint*>& peers,
                       const std::vector<Endpoint>& all, Links& out, Deadline deadline) const = 0;
};

// The transports in the order they are tried: the first that can connect a pair wins.
const std::vector<const Transport*>& transports();
int transport_index(const std::string& name);  // throws InvalidArgument listing the names

// The chosen transport of every pair among those carrying `memory`: plan[a * n + b] indexes
// transports(); -1 on the diagonal. Host memory: throws CommError naming the pair when no
// transport can connect one. Device memory: an empty plan when some pair has none (device
// buffers are then staged through host memory).
std::vector<int> plan_transports(const std::vector<Endpoint>& endpoints,
                                 Memory memory = Memory::kHost);

}  // namespace pyring
