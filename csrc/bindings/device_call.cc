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

namespace {

// Runs `launch` without the GIL; the ticket, or (Work, ticket) for an async call.
py::object run(const std::function<Launched()>& launch) {
  Launched l;
  {
    py::gil_scoped_release nogil;
    l = launch();
  }
  if (l.work) return py::make_tuple(l.work, l.ticket);
  return py::cast(l.ticket);
}

}  // namespace

py::object py_launch_staged(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                            const DeviceArgs& args, std::vector<StagedRegion> regions,
                            std::function<void(Deadline, uint8_t* const*)> fn) {
  return run([&] {
    return pyring::launch_staged(comm, async_op, desc, args, std::move(regions), std::move(fn));
  });
}

py::object py_launch_staged(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                            const DeviceArgs& args,
                            std::function<void(DeviceQueue&, uint64_t, Deadline)> body) {
  return run([&] { return launch_device(comm, async_op, desc, args, std::move(body)); });
}

py::object py_launch_resident(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                              const DeviceArgs& args,
                              std::function<void(StreamId, Deadline)> body) {
  return run([&] { return pyring::launch_resident(comm, async_op, desc, args, std::move(body)); });
}

py::object py_allreduce_on_device(Communicator& comm, bool async_op, const BufferView& vi,
                                  const BufferView& vo, ReduceOp op, Algo algo,
                                  const DeviceArgs& args, Placement placement) {
  return run([&] {
    return pyring::allreduce_on_device(comm, async_op, vi, vo, op, algo, args, placement);
  });
}

}  // namespace pyring::bindings
