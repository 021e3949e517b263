#include "bindings/device_call.h"

#include <pybind11/stl.h>

#include "core/errors.h"

namespace pyring::bindings {

DeviceArgs device_args(const py::object& device) {
  DeviceArgs a;
  if (device.is_none()) return a;
  auto t = device.cast<std::tuple<int, int, uintptr_t>>();
  a.device.kind = device_kind_from_int(std::get<0>(t));
  a.device.index = a.device.is_cpu() ? -1 : std::get<1>(t);
  PYRING_CHECK_ARG(a.device.is_cpu() || a.device.index >= 0, "device index ", std::get<1>(t),
                   " is negative");
  a.stream = std::get<2>(t);
  return a;
}

py::object to_python(const Launched& l) {
  if (!l.ticket.queue) return l.work ? py::cast(l.work) : py::none();  // host buffers
  if (l.work) return py::make_tuple(l.work, l.ticket);
  return py::cast(l.ticket);
}

}  // namespace pyring::bindings
