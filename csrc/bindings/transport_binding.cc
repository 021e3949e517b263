#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "transport/registry.h"
#include "transport/shm/shm_link.h"
#include "transport/shm/shm_segment.h"
#include "transport/tcp/hmac_sha256.h"
#include "transport/tcp/tcp_connect.h"

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
  m.def(
      "plan_transports",
      [](const std::vector<EndpointTuple>& endpoints) {
        const size_t n = endpoints.size();
        const std::vector<int> plan = plan_transports(endpoints_of(endpoints));
        py::list rows;
        for (size_t a = 0; a < n; ++a) {
          py::list row;
          for (size_t b = 0; b < n; ++b) {
            const int t = plan[a * n + b];
            row.append(t < 0 ? py::object(py::none())
                             : py::object(py::str(transports()[static_cast<size_t>(t)]->name())));
          }
          rows.append(row);
        }
        return rows;
      },
      py::arg("endpoints"),
      "The transport of every pair (None on the diagonal), as the communicator will use them.");
}

}  // namespace

void register_transport(py::module_& m) {
  register_registry(m);
  py::class_<ShmSegment, std::shared_ptr<ShmSegment>>(m, "ShmSegment")
      .def_static("create", &ShmSegment::create, py::arg("name"), py::arg("local_world"),
                  py::arg("nslots"), py::arg("slot_bytes"))
      .def_static("unlink", &ShmSegment::unlink, py::arg("name"))
      .def_property_readonly("name", &ShmSegment::name);
  py::class_<TcpListener>(m, "TcpListener")
      .def(py::init<const std::string&>(), py::arg("host"))
      .def_property_readonly("port", &TcpListener::port)
      .def("close", &TcpListener::close_now)
      .def_property_readonly("dropped", [](const TcpListener& l) {
        const auto& d = l.dropped();
        return py::dict(py::arg("silent") = d.silent, py::arg("garbage") = d.garbage,
                        py::arg("bad_mac") = d.bad_mac, py::arg("not_expected") = d.not_expected,
                        py::arg("overflow") = d.overflow);
      });
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
