// Collectives on device buffers, for the binding files: Python hands each call the buffers'
// device and the caller's stream as `device=(kind code, index, stream)` (None: the host).
#pragma once

#include <functional>
#include <vector>

#include "bindings/bindings.h"
#include "core/device_queue.h"

namespace pyring::bindings {

struct DeviceArgs {
  Device device;
  StreamId stream = 0;
};

// A collective's place in its device queue, for the Python Work of an async call.
struct DeviceTicket {
  std::shared_ptr<DeviceQueue> queue;
  uint64_t ticket = 0;
};

// None: the host; else the tuple (kind code, index, stream). Throws InvalidArgument.
DeviceArgs device_args(const py::object& device);

// Runs `fn` over host copies of `regions` as one collective ordered on args.stream
// (core/device_queue.h). Synchronous: returns None once the host part is done and the
// stream is ordered after the results. Async: returns (Work, DeviceTicket).
py::object launch_staged(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                         const DeviceArgs& args, std::vector<StagedRegion> regions,
                         std::function<void(Deadline, uint8_t* const*)> fn);

// Regions for an input and an output of the same collective: one read-write region when they
// are the same buffer; fn's host pointers are then (in, out) either way.
std::vector<StagedRegion> in_out_regions(const BufferView& in, const BufferView& out);
// The host views of in and out inside the staged copies.
BufferView host_view(const BufferView& v, uint8_t* host);

}  // namespace pyring::bindings
