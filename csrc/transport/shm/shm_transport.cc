// The shm entry of the transport registry: ranks of one host that both published a segment.
// Address: the name of the rank's segment for the channel.
#include "core/errors.h"
#include "transport/factory.h"
#include "transport/registry.h"
#include "transport/shm/shm_link.h"
#include "transport/shm/shm_segment.h"

namespace pyring {

namespace {

// The peer's index among the ranks of its host, in rank order.
uint32_t local_index_of(const std::vector<Endpoint>& all, int rank) {
  uint32_t i = 0;
  for (int r = 0; r < rank; ++r)
    i += all[static_cast<size_t>(r)].host == all[static_cast<size_t>(rank)].host;
  return i;
}

class ShmTransport final : public Transport {
 public:
  const char* name() const override { return "shm"; }
  bool can_connect(const Endpoint& self, const Endpoint& peer) const override {
    return self.host == peer.host && self.publishes("shm") && peer.publishes("shm");
  }
  // pyring's own fit on the development machines (bench/results/costmodel_vm.json).
  LinkModel default_costs() const override { return {4e-6, 4.9e9}; }
  WaitKind wait_kind() const override { return WaitKind::kFutexWord; }
  bool single_copy() const override { return true; }

  void connect(const LinkSetup& setup, const std::vector<const Endpoint*>& peers,
               const std::vector<Endpoint>& all, Links& out, Deadline) const override {
    if (peers.empty()) return;
    PYRING_CHECK_ARG(setup.own_segment != nullptr, "shm peer without a local segment");
    const auto* h = setup.own_segment->header();
    for (const Endpoint* p : peers) {
      const uint32_t li = local_index_of(all, p->rank);
      PYRING_CHECK_ARG(li < setup.local_world, "local index ", li, " out of range for local world ",
                       setup.local_world);
      auto seg = ShmSegment::attach(p->address("shm"), setup.local_world, h->nslots, h->slot_bytes);
      out.segments.push_back(seg);
      out.by_rank[static_cast<size_t>(p->rank)] = std::make_unique<ShmLink>(
          p->rank, setup.local_index, li, setup.own_segment, seg, setup.shm_copy);
    }
  }
};

}  // namespace

const Transport& shm_transport() {
  static const ShmTransport t;
  return t;
}

}  // namespace pyring
