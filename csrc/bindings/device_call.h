// Collectives on device buffers, for the binding files: Python hands each call the buffers'
// device and the caller's stream as `device=(kind code, index, stream)` (None: the host), and
// the launches of collectives/device_launch.h come back as Python objects.
#pragma once

#include <functional>
#include <vector>

#include "bindings/bindings.h"
#include "collectives/device_launch.h"
#include "collectives/placement.h"
#include "core/device_queue.h"

namespace pyring::bindings {

// None: the host; else the tuple (kind code, index, stream). Throws InvalidArgument.
DeviceArgs device_args(const py::object& device);

// collectives/device_launch.h's launches, called without the GIL: a synchronous call returns
// its DeviceTicket, an async one (Work, DeviceTicket).
py::object py_launch_staged(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                            const DeviceArgs& args, std::vector<StagedRegion> regions,
                            std::function<void(Deadline, uint8_t* const*)> fn);
py::object py_launch_staged(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                            const DeviceArgs& args,
                            std::function<void(DeviceQueue&, uint64_t, Deadline)> body);
py::object py_launch_resident(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                              const DeviceArgs& args, std::function<void(StreamId, Deadline)> body);
py::object py_allreduce_on_device(Communicator& comm, bool async_op, const BufferView& vi,
                                  const BufferView& vo, ReduceOp op, Algo algo,
                                  const DeviceArgs& args, Placement placement);

}  // namespace pyring::bindings
