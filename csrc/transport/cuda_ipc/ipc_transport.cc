// The cuda_ipc entry of the transport registry: device buffers between processes of one host,
// several ranks on one GPU included. Address: "<device> <nslots> <slot bytes> <control segment's
// file, SharedFileId::str> <IPC handle, hex> <number of senders> <sender rank>...", made once at
// init (Transport::prepare); the handle is opened once per peer at connect, never per collective.
#include <cstdio>
#include <sstream>

#include "core/errors.h"
#include "transport/cuda_ipc/ipc_link.h"
#include "transport/factory.h"
#include "transport/registry.h"

namespace pyring {

namespace {

constexpr uint32_t kIpcSlots = 8;
constexpr const char* kName = "cuda_ipc";

struct IpcAddress {
  std::string device;  // "cuda:0", "sim:1"
  uint32_t nslots = 0;
  size_t slot_bytes = 0;
  std::string control;
  IpcHandle handle;
  std::vector<int> senders;  // the ranks given an inbox in the region, in its order
};

std::string to_hex(const uint8_t* p, size_t n) {
  std::string s;
  char buf[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", p[i]);
    s += buf;
  }
  return s;
}

IpcAddress parse(const Endpoint& e) {
  IpcAddress a;
  std::istringstream in(e.address(kName));
  std::string hex;
  size_t nsenders = 0;
  in >> a.device >> a.nslots >> a.slot_bytes >> a.control >> hex >> nsenders;
  for (size_t i = 0; i < nsenders && in; ++i) in >> a.senders.emplace_back();
  PYRING_CHECK(!in.fail() && hex.size() == 2 * sizeof(a.handle.bytes) && nsenders > 0 &&
                   a.senders.size() == nsenders,
               CommError, "rank ", e.rank, " published a malformed ", kName, " address");
  for (size_t i = 0; i < sizeof(a.handle.bytes); ++i) {
    a.handle.bytes[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return a;
}

// The device kind of an address ("cuda" of "cuda:0"), without parsing the rest.
std::string kind_of(const Endpoint& e) {
  const std::string& s = e.address(kName);
  return s.substr(0, s.find(':'));
}

uint32_t local_index_of(const std::vector<Endpoint>& all, int rank) {
  uint32_t i = 0;
  for (int r = 0; r < rank; ++r)
    i += all[static_cast<size_t>(r)].host == all[static_cast<size_t>(rank)].host;
  return i;
}

class IpcTransport final : public Transport {
 public:
  const char* name() const override { return kName; }
  bool can_connect(const Endpoint& self, const Endpoint& peer) const override {
    return self.host == peer.host && self.publishes(kName) && peer.publishes(kName) &&
           kind_of(self) == kind_of(peer);
  }
  // Device to device within a host: a PCIe or NVLink hop, or a copy within one GPU.
  LinkModel default_costs() const override { return {10e-6, 20e9}; }
  WaitKind wait_kind() const override { return WaitKind::kPoll; }
  bool single_copy() const override { return false; }
  Memory memory() const override { return Memory::kDevice; }

  std::shared_ptr<void> prepare(const DeviceSetup& setup, std::string* address) const override {
    const size_t slot = setup.slot_bytes / kPieceAlign * kPieceAlign;
    auto state =
        std::make_shared<IpcState>(setup.device, setup.local_world, setup.senders, kIpcSlots,
                                   slot < kPieceAlign ? kPieceAlign : slot, setup.label);
    *address = str_cat(setup.device.str(), " ", state->nslots, " ", state->slot_bytes, " ",
                       state->control_file.id().str(), " ",
                       to_hex(state->handle.bytes, sizeof(state->handle.bytes)), " ",
                       state->senders.size());
    for (int r : state->senders) *address += str_cat(" ", r);
    return state;
  }
  void release(void* state) const override { static_cast<IpcState*>(state)->control_file.close(); }

  void connect(const LinkSetup& setup, const std::vector<const Endpoint*>& peers,
               const std::vector<Endpoint>& all, Links& out, Deadline) const override {
    if (peers.empty()) return;
    auto it = setup.prepared.find(kName);
    PYRING_CHECK_ARG(it != setup.prepared.end() && it->second, kName,
                     " peers without this rank's prepared state");
    auto mine = std::static_pointer_cast<IpcState>(it->second);
    for (const Endpoint* p : peers) {
      const IpcAddress a = parse(*p);
      PYRING_CHECK(a.nslots == mine->nslots && a.slot_bytes == mine->slot_bytes, CommError, "rank ",
                   p->rank, " published ", kName, " slots of ", a.nslots, " x ", a.slot_bytes,
                   " bytes, this rank ", mine->nslots, " x ", mine->slot_bytes);
      const uint32_t li = local_index_of(all, p->rank);
      PYRING_CHECK_ARG(li < setup.local_world, "local index ", li, " out of range for local world ",
                       setup.local_world);
      auto control =
          ShmSegment::attach(p->rank, a.control, setup.local_world, a.nslots, kIpcControlSlotBytes);
      // The peer's region is opened only where this rank has an inbox in it to write to.
      const size_t send_inbox = inbox_index(a.senders, setup.rank);
      uint8_t* region =
          send_inbox == kNoInbox
              ? nullptr
              : static_cast<uint8_t*>(mine->rt.ipc_open(setup.device.index, a.handle));
      out.by_rank[static_cast<size_t>(p->rank)] = std::make_unique<IpcLink>(
          p->rank, setup.local_index, li, mine, std::move(control), region, send_inbox,
          inbox_index(mine->senders, p->rank), IpcStream{setup.stream, setup.stream_owner});
    }
  }
};

}  // namespace

const Transport& cuda_ipc_transport() {
  static const IpcTransport t;
  return t;
}

}  // namespace pyring
