// Collectives on device buffers, for the binding files: Python hands each call the buffers'
// device and the caller's stream as `device=(kind code, index, stream)` (None: the host), and
// the plans collectives/device_launch.h runs come back as Python objects.
#pragma once

#include <utility>

#include "bindings/bindings.h"
#include "collectives/device_launch.h"

namespace pyring::bindings {

// None: the host; else the tuple (kind code, index, stream). Throws InvalidArgument.
DeviceArgs device_args(const py::object& device);

// The Python result of a launch: on host buffers None, or the Work of an async call; on device
// buffers the DeviceTicket, or (Work, DeviceTicket). Takes the GIL's holder's thread.
py::object to_python(const Launched& l);

// collectives/device_launch.h's run_plan of `call` with the bodies make(where) gives (its
// *_bodies functions), run without the GIL.
template <typename Make>
py::object py_run_plan(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                       const CallDesc& call, const DeviceArgs& args, Make&& make) {
  Launched l;
  {
    py::gil_scoped_release nogil;
    l = run_plan(comm, async_op, desc, call, args, std::forward<Make>(make));
  }
  return to_python(l);
}

}  // namespace pyring::bindings
