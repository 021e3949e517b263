// The Communicator: this rank's place in the job, its links, topology, options, counters and
// progress engine.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device_queue.h"
#include "core/flight_recorder.h"
#include "core/host_memory.h"
#include "core/p2p.h"
#include "core/progress.h"
#include "core/symmetric.h"
#include "core/topology.h"
#include "core/types.h"
#include "kernels/dispatch.h"

namespace pyring {

class CommError;
class Link;

// Blocks of a gather, scatter or all_to_all from this size up go single copy within a host.
constexpr size_t kDefaultSingleCopyBytes = 64 << 10;

struct Options {
  Algo algo = Algo::kAuto;
  double timeout_s = 300.0;          // deadline of every collective, counted from its start
  size_t segment_bytes = 256 << 10;  // pipelining unit; shm slot and tcp staging size
  int spin_us = 50;                  // how long a waiting rank polls before it sleeps
  int log_level = 0;                 // 0: warnings, 1: INFO (topology, selector decisions)
  // Indexed by link class, the transport registry's order (transport/registry.h): the
  // selector's figures (defaults: each transport's, PYRING_LINK_MODEL overrides), names, and
  // whether a class allows single-copy transfers. reduce_bytes_per_s is the local reduction
  // rate that puts the crossover of the direct algorithm and the ring at the measured 16 KiB
  // for 2 ranks.
  std::vector<LinkModel> links;
  std::vector<std::string> link_names;
  std::vector<uint8_t> link_single_copy;
  double reduce_bytes_per_s = 2e9;
  size_t flight_entries = 256;  // collectives the flight recorder keeps; 0: none
};

// Per-communicator counters, readable from any thread.
struct CallCounters {
  std::array<std::atomic<uint64_t>, kNumAlgos> by_algo{};
};

class Communicator {
 public:
  // `links` is indexed by rank; null where no link exists (always at this rank). `keepalive`
  // holds transport state the links share (shared-memory segments). `plan[a * size + b]` is
  // the link class (the transport) of every pair, -1 on the diagonal. `p2p` carries
  // point-to-point messages and the collectives built on them.
  Communicator(int rank, int size, Options options, Topology topology, std::vector<int> plan,
               std::vector<std::unique_ptr<Link>> links, std::shared_ptr<void> keepalive,
               std::shared_ptr<P2pEngine> p2p);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Options& options() const { return options_; }
  // How long a waiting collective polls before it sleeps: options().spin_us on the caller's
  // thread, at most kProgressSpinUs on the progress thread, where polling would take the core
  // from the caller's compute (backward) that the collective is meant to overlap.
  static constexpr int kProgressSpinUs = 20;
  int spin_us() const;

  const Topology& topology() const { return topology_; }
  // The ring every flat algorithm uses: the topology's order, crossing each group boundary once.
  const std::vector<int>& ring_order() const { return ring_order_; }
  const TreePlan& tree_plan() const { return tree_plan_; }
  // address_order(topology()): empty when the topology is uneven.
  const std::vector<int>& address_order() const { return address_order_; }
  // The link class (transport) of the pair, an index into options().links; the slowest
  // class has the highest index.
  int link_class(int a, int b) const;
  const std::string& link_class_name(int c) const;

  // Throws CommError naming both ranks when there is no link to `peer`.
  Link& link(int peer);
  bool has_link(int peer) const;
  Link& left() { return link(left_); }
  Link& right() { return link(right_); }

  // Runs `fn(deadline)` as one collective described by `description`, on this thread when
  // nothing else is queued. Errors are rethrown with the description and this rank prefixed;
  // a CommError aborts every link and leaves the communicator unusable.
  void run_sync(const CollectiveDesc& desc, const std::function<void(Deadline)>& fn);
  std::shared_ptr<Work> submit(const CollectiveDesc& desc, std::function<void(Deadline)> fn);

  P2pEngine& p2p() { return *p2p_; }

  // Single-copy transfers (collectives/exchange.h) with a peer of this host, for blocks of at
  // least single_copy_bytes() (0: never), until one with that peer fails. The pair's state is
  // touched only by the collective that runs now.
  size_t single_copy_bytes() const { return single_copy_bytes_.load(); }
  void set_single_copy_bytes(size_t bytes) { single_copy_bytes_.store(bytes); }
  bool single_copy_with(int peer, size_t bytes) const;
  void single_copy_failed(int peer);
  // Payload bytes this rank has read single copy, ever.
  uint64_t single_copy_read() const { return single_copy_read_.load(); }
  void add_single_copy_read(uint64_t bytes) { single_copy_read_.fetch_add(bytes); }

  // The queue that orders and stages this communicator's collectives on `device`, made on
  // first use. Thread-safe.
  std::shared_ptr<DeviceQueue> device_queue(const Device& device);
  // Bytes copied between the devices and the host by the device queues, ever.
  uint64_t device_host_bytes() const;

  // Links that carry device memory to the peers the algorithms need, over `transport`, with
  // the queue of their device, whose stream their copies use. Set at most once, at init,
  // when a device transport links every pair; none: device buffers are staged.
  void set_device_links(std::shared_ptr<DeviceQueue> queue,
                        std::vector<std::unique_ptr<Link>> links, std::shared_ptr<void> keepalive,
                        std::string transport);
  // Device buffers on `device` run on the device (DeviceQueue::run_resident).
  bool resident_on(const Device& device) const;
  const std::string& device_transport() const { return device_transport_; }
  // The link to `peer` that carries buffers of `device`: the host link for the host.
  Link& link_for(const Device& device, int peer);
  // Null where there is no device link to `peer`.
  Link* device_link(int peer) const;

  // Symmetric memory (core/symmetric.h) over `local`, this host's ranks, with segments named
  // after `job`: made once, at init; null before (then no tensor is symmetric). shared_cores
  // and across_hosts: as SymmetricHeap's.
  void enable_symmetric(std::vector<int> local, std::string job, bool shared_cores,
                        bool across_hosts);
  SymmetricHeap* symmetric() const { return symmetric_.get(); }

  // Scratch memory for the collective that runs now; valid until the next call (a larger
  // request may move it and does not keep its contents).
  uint8_t* scratch(size_t bytes);
  // The same, where `site` runs its kernels (device scratch of its device queue).
  uint8_t* scratch_for(const KernelSite& site, size_t bytes);
  // Host memory of the collective that runs now, by bump allocation (the compressed codec's).
  // One per communicator, not per thread: whether a collective runs on the caller or on the
  // progress thread then does not change how much memory is held.
  ScratchArena& host_arena() { return host_arena_; }

  // Stops the progress engine (queued work fails with CommError). Idempotent.
  void close();
  bool broken() const { return !broken_.empty(); }
  // The sequence number of the collective running now (1 for the first).
  uint64_t seq() const { return seq_; }
  // The root of the collective running now (its CollectiveDesc's; -1 for none). A reduce runs
  // as an all_reduce whose headers carry it, so that ranks naming different roots raise.
  int call_root() const { return call_root_; }
  // Where this rank stands, readable from any thread: the sequence numbers of the last
  // collective it entered and of the last one it completed (0: none).
  uint64_t entered_seq() const { return entered_seq_.load(std::memory_order_relaxed); }
  uint64_t completed_seq() const { return completed_seq_.load(std::memory_order_relaxed); }

  // Called on the thread running a collective that timed out, before the communicator gives
  // up, with the collective's sequence number and description: returns an account of where
  // every rank stands, appended to the timeout's message (and to the cause the peers learn);
  // "" adds nothing. It must return within a bounded time and not throw.
  using HangAccount = std::function<std::string(uint64_t seq, const std::string& what)>;
  void set_hang_account(HangAccount fn) { hang_account_ = std::move(fn); }

  CallCounters& calls() { return calls_; }
  // Counts a call of `algo` and notes it in the flight recorder. Called by the selector.
  void count_call(Algo algo);
  const FlightRecorder& recorder() const { return recorder_; }
  // Writes message() to stderr once per distinct `key` when log_level >= `level`. Thread-safe.
  void log_once(int level, const std::string& key, const std::function<std::string()>& message);
  // The selector's auto choice for a message of `bytes`, from compute() the first time.
  // Thread-safe; every rank computes the same choice from the same inputs.
  Algo cached_choice(size_t bytes, const std::function<Algo()>& compute);

 private:
  void execute(const CollectiveDesc& desc, const std::function<void(Deadline)>& fn);
  // Marks the communicator broken by `e`, hands the cause to every peer (links and p2p) and
  // records the failure.
  void give_up(const CommError& e, const std::string& prefix);
  // How long a rank whose peer's link went away waits for the cause that peer announces.
  static constexpr std::chrono::milliseconds kAnnounceWait{500};
  // Ends the running entry of the recorder and prints the recorder the first time.
  void failed(bool timed_out, const std::string& what);

  int rank_;
  int size_;
  Options options_;
  Topology topology_;
  std::vector<int> ring_order_;
  TreePlan tree_plan_;
  std::vector<int> address_order_;
  std::vector<int> plan_;
  int left_ = 0;
  int right_ = 0;
  std::vector<std::unique_ptr<Link>> links_;
  std::shared_ptr<void> keepalive_;
  // Declared before device_queues_, so destroyed after them: a queue drains its stream, whose
  // copies the device links queued, before the links unmap their memory.
  std::vector<std::unique_ptr<Link>> device_links_;
  std::shared_ptr<void> device_keepalive_;
  std::string device_transport_;
  Device resident_device_;  // cpu: no device links
  HostBuffer scratch_;
  ScratchArena host_arena_{ScratchArena::Kind::kHost, nullptr, -1};
  uint64_t seq_ = 0;    // written only by the running collective
  int call_root_ = -1;  // written only by the running collective
  std::atomic<uint64_t> entered_seq_{0};
  std::atomic<uint64_t> completed_seq_{0};
  HangAccount hang_account_;  // set at init, before any collective
  std::atomic<size_t> single_copy_bytes_{kDefaultSingleCopyBytes};
  std::atomic<uint64_t> single_copy_read_{0};
  std::vector<uint8_t> single_copy_failed_;  // by peer; written only by the running collective
  std::string broken_;  // why the communicator is unusable; written only by the running collective
  std::atomic<bool> closed_announced_{false};  // close() told the peers (Link::announce_closed)
  CallCounters calls_;
  FlightRecorder recorder_;
  bool dumped_ = false;  // the recorder was printed after a failure; written by the running one
  std::mutex log_mu_;
  std::set<std::string> logged_;  // guarded by log_mu_
  std::mutex choice_mu_;
  std::unordered_map<size_t, Algo> choices_;  // guarded by choice_mu_
  mutable std::mutex device_mu_;
  std::vector<std::shared_ptr<DeviceQueue>> device_queues_;  // guarded by device_mu_
  std::shared_ptr<P2pEngine> p2p_;
  std::unique_ptr<SymmetricHeap> symmetric_;  // set at init, before any collective
  ProgressEngine engine_;                     // last: its thread stops before the links go away
};

}  // namespace pyring
