#include "core/communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/errors.h"
#include "core/link.h"

namespace pyring {

namespace {
// Joins "rank N gave up on the communicator" to the cause rank N announced, in the errors of
// the ranks that learn of it; a rank that gives up for such an error relays the cause unchanged.
constexpr const char* kGaveUpBecause = " gave up on the communicator because: ";
}  // namespace

Communicator::Communicator(int rank, int size, Options options, Topology topology,
                           std::vector<int> plan, std::vector<std::unique_ptr<Link>> links,
                           std::shared_ptr<void> keepalive, std::shared_ptr<P2pEngine> p2p)
    : rank_(rank),
      size_(size),
      options_(options),
      topology_(std::move(topology)),
      plan_(std::move(plan)),
      links_(std::move(links)),
      keepalive_(std::move(keepalive)),
      recorder_(options.flight_entries),
      p2p_(std::move(p2p)) {
  PYRING_CHECK_ARG(p2p_ && p2p_->size() == size, "the point-to-point engine must span the world");
  PYRING_CHECK_ARG(size >= 1 && rank >= 0 && rank < size, "rank ", rank,
                   " out of range for world size ", size);
  PYRING_CHECK_ARG(plan_.size() == static_cast<size_t>(size) * static_cast<size_t>(size),
                   "the transport plan has ", plan_.size(), " pairs for world size ", size);
  PYRING_CHECK_ARG(!options_.links.empty() && options_.link_names.size() == options_.links.size() &&
                       options_.link_single_copy.size() == options_.links.size(),
                   "the link classes' figures, names and single-copy flags must be given");
  for (int c : plan_) {
    PYRING_CHECK_ARG(c < static_cast<int>(options_.links.size()), "link class ", c,
                     " out of range for ", options_.links.size(), " classes");
  }
  topology_.validate(size);
  ring_order_ = topology_.ring_order();
  tree_plan_ = pyring::tree_plan(topology_, rank);
  address_order_ = pyring::address_order(topology_);
  const auto pos = std::find(ring_order_.begin(), ring_order_.end(), rank) - ring_order_.begin();
  left_ = ring_order_[static_cast<size_t>((pos + size - 1) % size)];
  right_ = ring_order_[static_cast<size_t>((pos + 1) % size)];
  links_.resize(static_cast<size_t>(size));
  single_copy_failed_.assign(static_cast<size_t>(size), 0);
}

Communicator::~Communicator() {
  close();
}

void Communicator::close() {
  engine_.stop("communicator closed");
  // No collective of this rank runs any more, and none will.
  if (!closed_announced_.exchange(true)) {
    if (symmetric_) symmetric_->announce_closed();
    for (auto& l : links_) {
      if (l) l->announce_closed();
    }
    for (auto& l : device_links_) {
      if (l) l->announce_closed();
    }
  }
  p2p_->close("communicator closed");
}

int Communicator::spin_us() const {
  if (ProgressEngine::on_progress_thread() && options_.spin_us > kProgressSpinUs) {
    return kProgressSpinUs;
  }
  return options_.spin_us;
}

bool Communicator::single_copy_with(int peer, size_t bytes) const {
  const size_t min = single_copy_bytes();
  return min > 0 && bytes >= min &&
         options_.link_single_copy[static_cast<size_t>(link_class(rank_, peer))] &&
         !single_copy_failed_[static_cast<size_t>(peer)];
}

void Communicator::single_copy_failed(int peer) {
  single_copy_failed_[static_cast<size_t>(peer)] = 1;
}

int Communicator::link_class(int a, int b) const {
  const int c = plan_[static_cast<size_t>(a) * static_cast<size_t>(size_) + static_cast<size_t>(b)];
  return c < 0 ? 0 : c;
}

const std::string& Communicator::link_class_name(int c) const {
  return options_.link_names[static_cast<size_t>(c)];
}

void Communicator::log_once(int level, const std::string& key,
                            const std::function<std::string()>& message) {
  if (options_.log_level < level) return;
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    if (!logged_.insert(key).second) return;
  }
  std::fprintf(stderr, "[pyring INFO] rank %d: %s\n", rank_, message().c_str());
}

Algo Communicator::cached_choice(size_t bytes, const std::function<Algo()>& compute) {
  std::lock_guard<std::mutex> lock(choice_mu_);
  auto it = choices_.find(bytes);
  if (it != choices_.end()) return it->second;
  if (choices_.size() >= 4096) choices_.clear();  // bounded: sizes seen are few in practice
  return choices_[bytes] = compute();
}

bool Communicator::has_link(int peer) const {
  return peer >= 0 && peer < size_ && links_[static_cast<size_t>(peer)] != nullptr;
}

Link& Communicator::link(int peer) {
  PYRING_CHECK(has_link(peer), CommError, "missing connection between rank ", rank_,
               " (this process) and rank ", peer);
  return *links_[static_cast<size_t>(peer)];
}

uint64_t Communicator::device_host_bytes() const {
  std::lock_guard<std::mutex> lock(device_mu_);
  uint64_t total = 0;
  for (const auto& q : device_queues_) total += q->host_device_bytes();
  return total;
}

std::shared_ptr<DeviceQueue> Communicator::device_queue(const Device& device) {
  std::lock_guard<std::mutex> lock(device_mu_);
  for (const auto& q : device_queues_) {
    if (q->device() == device) return q;
  }
  device_queues_.push_back(std::make_shared<DeviceQueue>(device));
  return device_queues_.back();
}

void Communicator::set_device_links(std::shared_ptr<DeviceQueue> queue,
                                    std::vector<std::unique_ptr<Link>> links,
                                    std::shared_ptr<void> keepalive, std::string transport) {
  PYRING_CHECK_ARG(queue && links.size() == static_cast<size_t>(size_) && resident_device_.is_cpu(),
                   "device links are set once, one per rank, with their device queue");
  {
    std::lock_guard<std::mutex> lock(device_mu_);
    for (const auto& q : device_queues_) {
      PYRING_CHECK_ARG(!(q->device() == queue->device()), "a queue for ", queue->device().str(),
                       " exists already");
    }
    device_queues_.push_back(queue);
  }
  device_links_ = std::move(links);
  device_keepalive_ = std::move(keepalive);
  device_transport_ = std::move(transport);
  resident_device_ = queue->device();
}

bool Communicator::resident_on(const Device& device) const {
  return !resident_device_.is_cpu() && device == resident_device_;
}

Link* Communicator::device_link(int peer) const {
  if (peer < 0 || peer >= size_ || device_links_.empty()) return nullptr;
  return device_links_[static_cast<size_t>(peer)].get();
}

Link& Communicator::link_for(const Device& device, int peer) {
  if (device.is_cpu()) return link(peer);
  PYRING_CHECK(resident_on(device), CommError, "no links carry ", device.str(), " buffers on rank ",
               rank_, " (device links: ",
               resident_device_.is_cpu() ? std::string("none") : resident_device_.str(), ")");
  Link* l = device_link(peer);
  PYRING_CHECK(l != nullptr, CommError, "missing ", device_transport_, " connection between rank ",
               rank_, " (this process) and rank ", peer);
  return *l;
}

uint8_t* Communicator::scratch_for(const KernelSite& site, size_t bytes) {
  if (site.on_host()) return scratch(bytes);
  return device_queue(site.device)->device_scratch(bytes);
}

uint8_t* Communicator::scratch(size_t bytes) {
  return scratch_.reserve(bytes);
}

void Communicator::execute(const CollectiveDesc& desc, const std::function<void(Deadline)>& fn) {
  auto prefix = [&] { return str_cat(desc.str(), " on rank ", rank_, "/", size_, ": "); };
  if (!broken_.empty()) {
    PYRING_THROW(CommError, prefix(),
                 "communicator is unusable after an earlier failure: ", broken_);
  }
  ++seq_;
  call_root_ = desc.root;
  entered_seq_.store(seq_, std::memory_order_relaxed);
  recorder_.begin(seq_, desc);
  // Two pointers: held in std::function's own storage, no allocation per call.
  const std::function<std::string()> what = [this, &desc] {
    return str_cat(desc.str(), " (#", seq_, ") on rank ", rank_, "/", size_);
  };
  bool warned = false;
  Deadline deadline = Deadline::after(options_.timeout_s);
  deadline.half = deadline.at - (deadline.at - Clock::now()) / 2;
  deadline.what = &what;
  deadline.warned = &warned;
  try {
    fn(deadline);
  } catch (const PeerLost& e) {
    // A peer that gave up announces why on the p2p links; a dead one never does.
    std::string cause = p2p_->announced_by(e.peer(), kAnnounceWait);
    if (cause.empty()) {
      give_up(e, prefix());
      rethrow_with_prefix(prefix());
    }
    std::string because = str_cat("rank ", e.peer(), kGaveUpBecause, cause);
    CommError relayed(e.gave_up() ? because : str_cat(e.what(), "; ", because));
    give_up(relayed, prefix());
    throw CommError(prefix() + relayed.what());
  } catch (const TimeoutError& e) {
    std::string account = hang_account_ ? hang_account_(seq_, desc.str()) : std::string();
    if (account.empty()) {
      give_up(e, prefix());
      rethrow_with_prefix(prefix());
    }
    TimeoutError accounted(str_cat(e.what(), "; ", account));
    give_up(accounted, prefix());
    throw TimeoutError(prefix() + accounted.what());
  } catch (const CommError& e) {
    give_up(e, prefix());
    rethrow_with_prefix(prefix());
  } catch (const CudaError& e) {
    // A device that failed midway (out of memory, a failed launch) leaves the peers waiting
    // for this rank's data: they are told, as for a link's failure.
    give_up(CommError(e.what()), prefix());
    rethrow_with_prefix(prefix());
  } catch (const std::exception& e) {
    failed(false, prefix() + e.what());
    rethrow_with_prefix(prefix());
  }
  completed_seq_.store(seq_, std::memory_order_relaxed);
  recorder_.end(FlightEntry::kCompleted);
}

void Communicator::give_up(const CommError& e, const std::string& prefix) {
  broken_ = e.what();
  // The cause peers learn: a cause relayed from another rank travels on unchanged.
  const char* relayed = std::strstr(e.what(), kGaveUpBecause);
  std::string cause = relayed ? std::string(relayed + std::strlen(kGaveUpBecause))
                              : str_cat("rank ", rank_, " failed in ", prefix, e.what());
  p2p_->announce_abort(cause);
  if (symmetric_) symmetric_->abort();
  for (auto& l : links_) {
    if (l) l->abort();
  }
  for (auto& l : device_links_) {
    if (l) l->abort();
  }
  failed(dynamic_cast<const TimeoutError*>(&e) != nullptr, prefix + e.what());
}

void Communicator::failed(bool timed_out, const std::string& what) {
  recorder_.end(timed_out ? FlightEntry::kTimedOut : FlightEntry::kFailed, what);
  if (dumped_ || recorder_.capacity() == 0) return;
  dumped_ = true;
  std::fprintf(stderr, "[pyring WARN] rank %d: %s\nflight recorder of rank %d (last %zu):\n%s",
               rank_, what.c_str(), rank_, recorder_.capacity(), recorder_.format().c_str());
}

void Communicator::count_call(Algo algo) {
  calls_.by_algo[static_cast<size_t>(algo)].fetch_add(1, std::memory_order_relaxed);
  recorder_.set_algo(algo_name(algo));
}

void Communicator::enable_symmetric(std::vector<int> local, std::string job, bool shared_cores,
                                    bool across_hosts) {
  PYRING_CHECK_ARG(!symmetric_, "symmetric memory is enabled once, at init");
  symmetric_ = std::make_unique<SymmetricHeap>(rank_, std::move(local), std::move(job),
                                               shared_cores, across_hosts);
}

void Communicator::run_sync(const CollectiveDesc& desc, const std::function<void(Deadline)>& fn) {
  engine_.run_sync(desc, [this, &desc, &fn] { execute(desc, fn); });
}

std::shared_ptr<Work> Communicator::submit(const CollectiveDesc& desc,
                                           std::function<void(Deadline)> fn) {
  return engine_.submit(desc, [this, desc, fn = std::move(fn)] { execute(desc, fn); });
}

}  // namespace pyring
