#include "transport/host_channel.h"

#include "core/errors.h"

namespace pyring {

HostChannel::HostChannel(const HostSetup& setup, const std::vector<std::string>& enabled)
    : setup_(setup) {
  for (const std::string& name : enabled) transport_index(name);  // names a transport
  for (const Transport* t : transports()) {
    if (t->memory() != Memory::kHost) continue;
    bool on = enabled.empty();
    for (const std::string& name : enabled) on |= name == t->name();
    if (!on) continue;
    std::string address;
    std::shared_ptr<void> state = t->prepare(setup, &address);
    if (!state) continue;
    states_[t->name()] = std::move(state);
    addresses_[t->name()] = address;
  }
}

HostChannel::~HostChannel() {
  try {
    release();
  } catch (const std::exception&) {  // a name already gone: nothing left to remove
  }
}

bool HostChannel::ready(const std::vector<Endpoint>& endpoints, uint32_t local_world) {
  const size_t n = endpoints.size();
  PYRING_CHECK_ARG(setup_.rank >= 0 && static_cast<size_t>(setup_.rank) < n, "rank ", setup_.rank,
                   " has no endpoint among ", n);
  endpoints_ = endpoints;
  plan_ = plan_transports(endpoints_);
  bool wait = false;
  for (size_t t = 0; t < transports().size(); ++t) {
    auto it = states_.find(transports()[t]->name());
    if (it == states_.end()) continue;
    bool used = false;
    for (size_t p = 0; p < n; ++p) {
      used |= plan_[static_cast<size_t>(setup_.rank) * n + p] == static_cast<int>(t);
    }
    wait |= transports()[t]->ready(it->second.get(), endpoints_, setup_.rank, local_world, used);
  }
  return wait;
}

const char* HostChannel::transport_of(int peer) const {
  const size_t n = endpoints_.size();
  PYRING_CHECK_ARG(peer >= 0 && static_cast<size_t>(peer) < n, "peer ", peer, " out of range for ",
                   n, " ranks (HostChannel::ready first)");
  const int t = plan_[static_cast<size_t>(setup_.rank) * n + static_cast<size_t>(peer)];
  return t < 0 ? nullptr : transports()[static_cast<size_t>(t)]->name();
}

std::map<std::string, uint64_t> HostChannel::counters() const {
  std::map<std::string, uint64_t> out;
  for (const auto& [name, state] : states_) {
    const Transport& t = *transports()[static_cast<size_t>(transport_index(name))];
    for (const auto& [key, value] : t.counters(state.get())) out[name + "." + key] = value;
  }
  return out;
}

void HostChannel::release() {
  if (released_) return;
  released_ = true;
  for (const auto& [name, state] : states_) {
    transports()[static_cast<size_t>(transport_index(name))]->release(state.get());
  }
}

}  // namespace pyring
