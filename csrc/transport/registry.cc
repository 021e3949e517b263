#include "transport/registry.h"

#include "core/errors.h"

namespace pyring {

// The entries, defined in their folders.
const Transport& shm_transport();       // transport/shm/
const Transport& tcp_transport();       // transport/tcp/
const Transport& cuda_ipc_transport();  // transport/cuda_ipc/

const std::vector<const Transport*>& transports() {
  static const std::vector<const Transport*> list = {&shm_transport(), &tcp_transport(),
                                                     &cuda_ipc_transport()};
  return list;
}

const std::string& Endpoint::address(const char* transport) const {
  auto it = addresses.find(transport);
  PYRING_CHECK(it != addresses.end(), CommError, "rank ", rank, " published no ", transport,
               " address");
  return it->second;
}

int transport_index(const std::string& name) {
  std::string valid;
  for (size_t i = 0; i < transports().size(); ++i) {
    if (name == transports()[i]->name()) return static_cast<int>(i);
    valid += (i ? ", " : "") + std::string(transports()[i]->name());
  }
  PYRING_THROW(InvalidArgument, "unknown transport '", name, "' (valid: ", valid, ")");
}

std::shared_ptr<void> Transport::prepare(const DeviceSetup&, std::string*) const {
  PYRING_THROW(Error, name(), " carries host memory and prepares nothing");
}

std::shared_ptr<void> Transport::prepare(const HostSetup&, std::string*) const {
  return nullptr;
}

bool Transport::ready(void*, const std::vector<Endpoint>&, int, uint32_t, bool) const {
  return false;
}

void Transport::release(void*) const {}

std::map<std::string, uint64_t> Transport::counters(const void*) const {
  return {};
}

std::vector<int> plan_transports(const std::vector<Endpoint>& endpoints, Memory memory) {
  const size_t n = endpoints.size();
  std::vector<int> plan(n * n, -1);
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      for (size_t t = 0; t < transports().size() && plan[a * n + b] < 0; ++t) {
        const Transport& tr = *transports()[t];
        if (tr.memory() == memory && tr.can_connect(endpoints[a], endpoints[b])) {
          plan[a * n + b] = static_cast<int>(t);
        }
      }
      if (memory == Memory::kDevice && plan[a * n + b] < 0) return {};
      PYRING_CHECK(plan[a * n + b] >= 0, CommError, "no transport can link rank ", a, " (host ",
                   endpoints[a].host, ") and rank ", b, " (host ", endpoints[b].host, ")");
    }
  }
  return plan;
}

}  // namespace pyring
