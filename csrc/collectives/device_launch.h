// Running a collective on device buffers where the planner placed it (placement.h): staged
// through pinned host memory, or resident on the buffers themselves, as one collective of the
// communicator ordered on the caller's stream through the device's DeviceQueue. The bindings
// turn Python objects into these calls; tests/native/allreduce_ranks.cc makes them with no
// Python.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "collectives/placement.h"
#include "core/communicator.h"
#include "core/device_queue.h"
#include "core/work.h"

namespace pyring {

// The caller's buffers' device and its stream.
struct DeviceArgs {
  Device device;
  StreamId stream = 0;
};

// A collective's place in its device queue: for the Work of an async call, and for the
// references a synchronous call's buffers keep until its device results are in place.
struct DeviceTicket {
  std::shared_ptr<DeviceQueue> queue;
  uint64_t ticket = 0;
};

// What a launch gives back: the Work of an async call (null for a synchronous one, done on
// return), and the ticket.
struct Launched {
  std::shared_ptr<Work> work;
  DeviceTicket ticket;
};

// The planner's description of a call on buffers like `v` on args.device, with its algorithm.
CallDesc call_of(CallKind kind, const char* name, const BufferView& v, const DeviceArgs& args,
                 Algo algo = Algo::kAuto);
// The same for calls whose element type does not matter (they move bytes).
CallDesc call_of(CallKind kind, const char* name, const DeviceArgs& args);

// Runs `body(queue, ticket, deadline)` as one collective ordered on args.stream, on the thread
// that runs collectives (DeviceQueue::run, run_chunked or run_resident inside). Synchronous:
// returns once the host part is done and the stream is ordered after the results (the caller
// keeps the buffers referenced until the ticket is done). Call without Python's GIL.
Launched launch_device(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                       const DeviceArgs& args,
                       std::function<void(DeviceQueue&, uint64_t, Deadline)> body);
// The same over host copies of `regions`: fn(deadline, their host copies).
Launched launch_staged(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                       const DeviceArgs& args, std::vector<StagedRegion> regions,
                       std::function<void(Deadline, uint8_t* const*)> fn);
// The same on the device buffers themselves: body(pyring's stream, deadline).
Launched launch_resident(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                         const DeviceArgs& args, std::function<void(StreamId, Deadline)> body);

// all_reduce(vi -> vo) of device buffers on args.device, placed by the planner: on the buffers
// themselves (kResident), or staged in chunks through the host (kStaged), each chunk reduced
// while its neighbours are copied.
Launched allreduce_on_device(Communicator& comm, bool async_op, const BufferView& vi,
                             const BufferView& vo, ReduceOp op, Algo algo, const DeviceArgs& args,
                             Placement placement);

// `v` on `device`, its kernels and copies queued on `stream`.
BufferView on_stream(const BufferView& v, const Device& device, StreamId stream);
// The host view of `v` at its staged copy `host`.
BufferView host_view(const BufferView& v, uint8_t* host);

}  // namespace pyring
