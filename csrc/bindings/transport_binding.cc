#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "transport/shm/shm_link.h"
#include "transport/shm/shm_segment.h"
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
      .def("close", &TcpListener::close_now);
  m.def("process_alive", &process_alive, py::arg("pid"));
}

}  // namespace pyring::bindings
