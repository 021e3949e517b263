// The tcp entry of the transport registry: any two ranks that both published a listener.
// Address: "host:port" of the rank's listener for the channel, which release() closes.
#include <map>
#include <string>

#include "core/errors.h"
#include "transport/factory.h"
#include "transport/registry.h"
#include "transport/tcp/tcp_connect.h"
#include "transport/tcp/tcp_link.h"
#include "transport/tcp/tcp_striped_link.h"

namespace pyring {

namespace {

TcpPeer parse_address(const Endpoint& p) {
  const std::string& a = p.address("tcp");
  const size_t colon = a.rfind(':');
  PYRING_CHECK(colon != std::string::npos && colon + 1 < a.size(), CommError, "rank ", p.rank,
               " published a tcp address without a port: '", a, "'");
  int port = 0;
  for (size_t i = colon + 1; i < a.size(); ++i) {
    PYRING_CHECK(a[i] >= '0' && a[i] <= '9' && port < 65536, CommError, "rank ", p.rank,
                 " published a bad tcp port: '", a, "'");
    port = port * 10 + (a[i] - '0');
  }
  return TcpPeer{p.rank, a.substr(0, colon), port};
}

class TcpTransport final : public Transport {
 public:
  const char* name() const override { return "tcp"; }
  bool can_connect(const Endpoint& self, const Endpoint& peer) const override {
    return self.publishes("tcp") && peer.publishes("tcp");
  }
  // pyring's own fit over loopback on the development machines (costmodel_vm.json).
  LinkModel default_costs() const override { return {18e-6, 1e9}; }
  WaitKind wait_kind() const override { return WaitKind::kPollFd; }
  bool single_copy() const override { return false; }

  // A world of one rank listens for nobody.
  std::shared_ptr<void> prepare(const HostSetup& setup, std::string* address) const override {
    if (setup.host_ip.empty()) return nullptr;
    auto listener = std::make_shared<TcpListener>(setup.host_ip);
    *address = setup.host_ip + ":" + std::to_string(listener->port());
    return listener;
  }
  void release(void* state) const override { static_cast<TcpListener*>(state)->close_now(); }
  std::map<std::string, uint64_t> counters(const void* state) const override {
    const TcpListener::Dropped& d = static_cast<const TcpListener*>(state)->dropped();
    return {{"dropped_silent", d.silent},
            {"dropped_garbage", d.garbage},
            {"dropped_bad_mac", d.bad_mac},
            {"dropped_not_expected", d.not_expected},
            {"dropped_overflow", d.overflow}};
  }

  void connect(const LinkSetup& setup, const std::vector<const Endpoint*>& peers,
               const std::vector<Endpoint>&, Links& out, Deadline deadline) const override {
    if (peers.empty()) return;
    auto it = setup.prepared.find(name());
    auto* listener =
        it == setup.prepared.end() ? nullptr : static_cast<TcpListener*>(it->second.get());
    PYRING_CHECK_ARG(listener != nullptr, "tcp peers without this rank's listener");
    std::vector<TcpPeer> tcp_peers;
    for (const Endpoint* p : peers) tcp_peers.push_back(parse_address(*p));
    auto fds = tcp_establish(setup.rank, *listener, tcp_peers, setup.secret, deadline,
                             setup.log_level, setup.tcp_streams);
    for (auto& [rank, streams] : fds) {
      for (int fd : streams) watch_liveness(fd, setup.timeout_s);
      auto& link = out.by_rank[static_cast<size_t>(rank)];
      if (streams.size() == 1) {
        link = std::make_unique<TcpLink>(rank, streams[0], setup.segment_bytes);
      } else {
        link = std::make_unique<TcpStripedLink>(rank, std::move(streams), setup.segment_bytes);
      }
    }
  }
};

}  // namespace

const Transport& tcp_transport() {
  static const TcpTransport t;
  return t;
}

}  // namespace pyring
