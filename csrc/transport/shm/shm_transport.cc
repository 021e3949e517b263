// The shm entry of the transport registry: ranks of one host that both published a segment.
// Address: the rank's unnamed shared file for the channel (SharedFileId::str), made at
// prepare. The segment is laid out in it once the rendezvous shows a local peer going over shm
// (its geometry needs the host's rank count) and attached by those peers; release closes the
// descriptor they open it through.
#include <string>

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

// Slots per inbox: a sender runs this far ahead of its receiver.
constexpr uint32_t kShmSlots = 8;

struct ShmState {
  explicit ShmState(std::string label) : file(std::move(label)) {}
  SharedFile file;
  uint64_t slot_bytes = 0;
  std::shared_ptr<ShmSegment> segment;  // made by ready()
};

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

  std::shared_ptr<void> prepare(const HostSetup& setup, std::string* address) const override {
    auto st = std::make_shared<ShmState>(shared_file_label(setup.job, setup.rank, setup.channel));
    st->slot_bytes = setup.segment_bytes;
    *address = st->file.id().str();
    return st;
  }
  bool ready(void* state, const std::vector<Endpoint>&, int, uint32_t local_world,
             bool used) const override {
    auto* st = static_cast<ShmState*>(state);
    if (!used || st->segment) return false;
    st->segment = ShmSegment::create(st->file, local_world, kShmSlots, st->slot_bytes);
    return true;
  }
  void release(void* state) const override { static_cast<ShmState*>(state)->file.close(); }

  void connect(const LinkSetup& setup, const std::vector<const Endpoint*>& peers,
               const std::vector<Endpoint>& all, Links& out, Deadline) const override {
    if (peers.empty()) return;
    auto it = setup.prepared.find(name());
    const auto* st =
        it == setup.prepared.end() ? nullptr : static_cast<const ShmState*>(it->second.get());
    PYRING_CHECK_ARG(st != nullptr && st->segment != nullptr,
                     "shm peers without this rank's segment (HostChannel::ready)");
    const std::shared_ptr<ShmSegment>& own = st->segment;
    const auto* h = own->header();
    for (const Endpoint* p : peers) {
      const uint32_t li = local_index_of(all, p->rank);
      PYRING_CHECK_ARG(li < setup.local_world, "local index ", li, " out of range for local world ",
                       setup.local_world);
      auto seg = ShmSegment::attach(p->rank, p->address("shm"), setup.local_world, h->nslots,
                                    h->slot_bytes);
      out.segments.push_back(seg);
      out.by_rank[static_cast<size_t>(p->rank)] =
          std::make_unique<ShmLink>(p->rank, setup.local_index, li, own, seg, setup.shm_copy);
    }
  }
};

}  // namespace

const Transport& shm_transport() {
  static const ShmTransport t;
  return t;
}

}  // namespace pyring
