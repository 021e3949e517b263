// Collectives on device buffers, for the binding files: Python hands each call the buffers'
// device and the caller's stream as `device=(kind code, index, stream)` (None: the host).
#pragma once

#include <functional>
#include <vector>

#include "bindings/bindings.h"
#include "collectives/placement.h"
#include "core/device_queue.h"

namespace pyring::bindings {

struct DeviceArgs {
  Device device;
  StreamId stream = 0;
};

// A collective's place in its device queue: for the Python Work of an async call, and for the
// references a synchronous call's buffers keep until its device results are in place.
struct DeviceTicket {
  std::shared_ptr<DeviceQueue> queue;
  uint64_t ticket = 0;
};

// None: the host; else the tuple (kind code, index, stream). Throws InvalidArgument.
DeviceArgs device_args(const py::object& device);

// The planner's description of a call (collectives/placement.h) on buffers like `v` on
// args.device, with the call's algorithm.
CallDesc call_of(CallKind kind, const char* name, const BufferView& v, const DeviceArgs& args,
                 Algo algo = Algo::kAuto);
// The same for calls whose element type does not matter (they move bytes).
CallDesc call_of(CallKind kind, const char* name, const DeviceArgs& args);

// Runs `fn` over host copies of `regions` as one collective ordered on args.stream
// (core/device_queue.h). Synchronous: returns its DeviceTicket once the host part is done and
// the stream is ordered after the results (the caller keeps the buffers referenced until the
// ticket is done). Async: returns (Work, DeviceTicket).
py::object launch_staged(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                         const DeviceArgs& args, std::vector<StagedRegion> regions,
                         std::function<void(Deadline, uint8_t* const*)> fn);

// The same, with the collective's body given whole: body(queue, ticket, deadline) runs on the
// thread that runs the collective (DeviceQueue::run or run_chunked).
py::object launch_staged(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                         const DeviceArgs& args,
                         std::function<void(DeviceQueue&, uint64_t, Deadline)> body);

// The same, run on the device buffers themselves (DeviceQueue::run_resident), where the
// planner placed the call there (collectives/placement.h): body(pyring's stream, deadline).
py::object launch_resident(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                           const DeviceArgs& args, std::function<void(StreamId, Deadline)> body);

// all_reduce(vi -> vo) of device buffers on args.device, placed by the planner: on the buffers
// themselves (kResident), or staged in chunks through the host (kStaged), each chunk reduced
// while its neighbours are copied.
py::object allreduce_on_device(Communicator& comm, bool async_op, const BufferView& vi,
                               const BufferView& vo, ReduceOp op, Algo algo, const DeviceArgs& args,
                               Placement placement);

// `v` on `device`, its kernels and copies queued on `stream`.
BufferView on_stream(const BufferView& v, const Device& device, StreamId stream);

// The host view of `v` at its staged copy `host`.
BufferView host_view(const BufferView& v, uint8_t* host);

}  // namespace pyring::bindings
