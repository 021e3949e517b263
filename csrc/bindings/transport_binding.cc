#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "core/errors.h"
#include "transport/host_channel.h"
#include "transport/registry.h"
#include "transport/shm/shm_link.h"  // process_alive
#include "transport/tcp/hmac_sha256.h"

namespace pyring::bindings {

std::vector<Endpoint> endpoints_of(const std::vector<EndpointTuple>& tuples) {
  std::vector<Endpoint> out;
  for (const auto& [host, addresses] : tuples) {
    Endpoint e;
    e.rank = static_cast<int>(out.size());
    e.host = host;
    e.addresses = addresses;
    out.push_back(std::move(e));
  }
  return out;
}

namespace {

// The registry's names and default figures, in its order (TRANSPORT_NAMES, TRANSPORT_COSTS),
// and the plan of every pair.
void register_registry(py::module_& m) {
  py::list names;
  py::dict costs;
  for (const Transport* t : transports()) {
    names.append(t->name());
    const LinkModel model = t->default_costs();
    costs[t->name()] = py::make_tuple(model.alpha_s, model.bytes_per_s);
  }
  m.attr("TRANSPORT_NAMES") = py::tuple(names);
  m.attr("TRANSPORT_COSTS") = costs;
}

}  // namespace

void register_transport(py::module_& m) {
  register_registry(m);
  py::class_<HostChannel, std::shared_ptr<HostChannel>>(m, "HostChannel",
                                                        "This rank's host transports for one "
                                                        "channel (transport/host_channel.h).")
      .def(py::init([](int rank, const std::string& job, const std::string& channel,
                       const std::string& host_ip, size_t segment_bytes,
                       const std::vector<std::string>& enabled) {
             HostSetup setup;
             setup.rank = rank;
             setup.job = job;
             setup.channel = channel;
             setup.host_ip = host_ip;
             setup.segment_bytes = segment_bytes;
             return std::make_shared<HostChannel>(setup, enabled);
           }),
           py::arg("rank"), py::arg("job"), py::arg("channel"), py::arg("host_ip"),
           py::arg("segment_bytes"), py::arg("enabled"),
           "Prepares the host transports in `enabled` (all when empty); host_ip '': no "
           "listener (a world of one).")
      .def_property_readonly("addresses", &HostChannel::addresses,
                             "transport -> the opaque address to publish")
      .def(
          "ready",
          [](HostChannel& c, const std::vector<EndpointTuple>& endpoints, uint32_t local_world) {
            py::gil_scoped_release nogil;
            return c.ready(endpoints_of(endpoints), local_world);
          },
          py::arg("endpoints"), py::arg("local_world"),
          "Plans every pair once and readies what the peers use; True: local peers wait for "
          "each other (a barrier) before connecting.")
      .def(
          "transport_of",
          [](const HostChannel& c, int peer) -> py::object {
            const char* t = c.transport_of(peer);
            return t ? py::object(py::str(t)) : py::object(py::none());
          },
          py::arg("peer"), "The planned transport to `peer` (None: this rank).")
      .def("release", &HostChannel::release,
           "Removes what strangers could still find (descriptors peers open shared files "
           "through, listening ports).")
      .def_property_readonly("counters", &HostChannel::counters);
  m.def(
      "hmac_sha256",
      [](py::bytes key, py::bytes data) {
        std::string k = key, d = data;
        Digest mac = hmac_sha256(k.data(), k.size(), {{d.data(), d.size()}});
        return py::bytes(reinterpret_cast<const char*>(mac.data()), mac.size());
      },
      py::arg("key"), py::arg("data"));
  m.def("process_alive", &process_alive, py::arg("pid"));
}

}  // namespace pyring::bindings
