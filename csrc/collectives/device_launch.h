// Running a collective on device buffers where the planner placed it (placement.h): staged
// through pinned host memory, or resident on the buffers themselves, as one collective of the
// communicator ordered on the caller's stream through the device's DeviceQueue. The bindings
// turn Python objects into these calls; tests/native/allreduce_ranks.cc makes them with no
// Python.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "collectives/call_bodies.h"
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

// The planner's description of a call on buffers like `v` on args.device, with its algorithm;
// `v` is the buffer the peers would read.
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

// Runs `bodies`, those of the place `where` (place() chose it for the call), as one
// collective `desc` of the communicator: on host buffers directly (Launched's ticket empty),
// else as launch_* above. Throws Error naming the call where the place has no body. Call
// without Python's GIL.
Launched run_placed(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                    const CallDesc& call, Placement where, const DeviceArgs& args,
                    CallBodies bodies);

// A synchronous all_reduce of host buffer v in place, where the planner puts it: the short
// call path (bindings/fast_call.cc). Without symmetric memory it builds no bodies.
void run_host_allreduce(Communicator& comm, const CollectiveDesc& desc, const BufferView& v,
                        ReduceOp op, Algo algo);

// Places `call` (placement.h: the one decision) and runs the bodies make(where) gives for that
// place (collectives/call_bodies.h), which build nothing for the places not taken.
template <typename Make>
Launched run_plan(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                  const CallDesc& call, const DeviceArgs& args, Make&& make) {
  const Placement where = place(comm, call).placement;
  return run_placed(comm, async_op, desc, call, where, args, make(where));
}

}  // namespace pyring
