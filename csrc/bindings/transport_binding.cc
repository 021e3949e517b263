#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "transport/shm/shm_link.h"
#include "transport/shm/shm_segment.h"
#include "transport/tcp/hmac_sha256.h"
#include "transport/tcp/tcp_connect.h"

namespace pyring::bindings {

void register_transport(py::module_& m) {
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
