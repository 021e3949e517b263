// What each collective runs in the place the planner put it (placement.h): on host buffers, on
// the device buffers themselves, or over their host copies. Each *_bodies function fills the
// body of `where` alone (a call on host buffers builds nothing for a device); the bindings turn
// Python's arguments into these, and collectives/device_launch.h's run_plan runs them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/compressed.h"
#include "collectives/placement.h"
#include "core/communicator.h"
#include "core/device_queue.h"

namespace pyring {

// A call's bodies, one per place the planner may put it: `host` on host buffers (zero-copy
// ones too); `resident` on the device buffers themselves (zero-copy ones too); `staged` over host
// copies of `regions`, or `staged_by_queue` given the call's DeviceQueue and ticket whole
// (DeviceQueue::run_chunked). Only the body of the call's place is filled.
struct CallBodies {
  std::function<void(Deadline)> host;
  std::function<void(StreamId, Deadline)> resident;
  std::vector<StagedRegion> regions;
  std::function<void(Deadline, uint8_t* const*)> staged;
  std::function<void(DeviceQueue&, uint64_t, Deadline)> staged_by_queue;
};

// all_reduce(vi -> vo): the selector's algorithm on host buffers, the device ring on the
// buffers themselves, and chunks staged through the host, each reduced while its neighbours
// are copied.
CallBodies allreduce_bodies(Placement where, Communicator& comm, const BufferView& vi,
                            const BufferView& vo, ReduceOp op, Algo algo, const Device& device);
// reduce_scatter(vi -> vo), all_gather(vi -> vo) and broadcast(v from root).
CallBodies reduce_scatter_bodies(Placement where, Communicator& comm, const BufferView& vi,
                                 const BufferView& vo, ReduceOp op, const Device& device);
CallBodies allgather_bodies(Placement where, Communicator& comm, const BufferView& vi,
                            const BufferView& vo, const Device& device);
CallBodies broadcast_bodies(Placement where, Communicator& comm, const BufferView& v, int root,
                            const Device& device);
// compressed_allreduce (compressed.h) of x in place: the codec on the device, or on a host copy.
CallBodies compressed_bodies(Placement where, Communicator& comm, const BufferView& x,
                             size_t exact_tail, Wire wire, ReduceOp op,
                             std::shared_ptr<WireState> state, Algo algo, const Device& device);
// The personalised collectives (collectives.h), over byte spans: host buffers, or host copies.
CallBodies gather_bodies(Placement where, Communicator& comm, const Span& in,
                         const std::vector<Span>& blocks, int root);
CallBodies scatter_bodies(Placement where, Communicator& comm, const std::vector<Span>& blocks,
                          const Span& out, int root);
CallBodies all_to_all_bodies(Placement where, Communicator& comm, const std::vector<Span>& in,
                             const std::vector<Span>& out);

// `v` on `device`, its kernels and copies queued on `stream`.
BufferView on_stream(const BufferView& v, const Device& device, StreamId stream);
// The host view of `v` at its staged copy `host`.
BufferView host_view(const BufferView& v, uint8_t* host);

}  // namespace pyring
