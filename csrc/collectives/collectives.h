// Collective algorithms. Each runs on the thread that calls it, inside Communicator::run_sync
// or a submitted work, and sees only the communicator's links, its topology and the kernels.
// Arguments are validated by the caller (bindings) before any byte is sent; all ranks must
// call the same collectives in the same order with matching sizes. The flat algorithms use
// the communicator's ring order (the topology's), not rank order.
#pragma once

#include <vector>

#include "core/communicator.h"
#include "core/types.h"

namespace pyring {

// True, after finishing out, when there is nothing to exchange: out has no elements, or the
// world is one rank (out = in, of out.count elements). For allreduce and reduce-scatter.
bool nothing_to_exchange(const Communicator& comm, const BufferView& in, const BufferView& out);

// out = op over ranks of in. in and out have the same count and dtype and may be the same
// buffer. Ring: reduce-scatter then allgather, each chunk cut into segments and pipelined.
void ring_allreduce(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
                    Deadline deadline);

// Every rank's input travels the ring, then each rank reduces locally in rank order: half the
// dependent hops of the ring, for small messages.
void direct_allreduce(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
                      Deadline deadline);

// Reduce-scatter inside each group, allreduce of each member's shard with its counterparts in
// the other groups, allgather inside the group, recursively over the topology's levels.
void tree_allreduce(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
                    Deadline deadline);

// The tree cuts large buffers into slices that pipeline its levels: while slice k crosses the
// top level, slice k+1 climbs the lower ones and slice k-1 comes back down them, so the
// slowest link stays busy. tree_slices() is how many, for `teams` teams of more than one rank.
constexpr size_t kTreeSliceBytes = 2 << 20;
constexpr size_t kTreeMaxSlices = 16;
size_t tree_slices(size_t bytes, size_t teams);

// Throws InvalidArgument naming the devices unless in and out are host buffers: the links
// carry host memory, and device buffers are staged by the device queue (core/device_queue.h).
void check_on_host(const BufferView& in, const BufferView& out, const char* what);
// The same, but device buffers pass too where the communicator has links that carry them
// (Communicator::resident_on) or has one rank (nothing crosses).
void check_links_carry(const Communicator& comm, const BufferView& in, const BufferView& out,
                       const char* what);

// Device-resident collectives: in and out on the device of the communicator's device links,
// whose stream the buffers name; the ring algorithms run on the device buffers themselves,
// their kernels and copies queued on that stream (DeviceQueue::run_resident). The choice is
// logged at INFO with its reason. Each also takes a one-rank communicator's device buffers,
// links or none: nothing crosses, and an out-of-place call is one copy (ring_broadcast of one
// rank does nothing).
void resident_allreduce(Communicator& comm, const BufferView& in, const BufferView& out,
                        ReduceOp op, Deadline deadline);
void resident_reduce_scatter(Communicator& comm, const BufferView& in, const BufferView& out,
                             ReduceOp op, Deadline deadline);
void resident_allgather(Communicator& comm, const BufferView& in, const BufferView& out,
                        Deadline deadline);

// Runs the algorithm the selector picks for `algo` (kAuto: by size, world and topology).
void allreduce(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
               Algo algo, Deadline deadline);

// out (count m) = op over ranks of chunk `rank` of in (count size * m). out may be that chunk.
void ring_reduce_scatter(Communicator& comm, const BufferView& in, const BufferView& out,
                         ReduceOp op, Deadline deadline);

// out (count size * m) = the concatenation of every rank's in (count m). in may be chunk
// `rank` of out.
void ring_allgather(Communicator& comm, const BufferView& in, const BufferView& out,
                    Deadline deadline);

// The same results over an even topology: lowest level first for reduce-scatter, highest
// first for allgather, so each slower level carries an already reduced or not yet grown
// region. Throw InvalidArgument when the topology is uneven.
void tree_reduce_scatter(Communicator& comm, const BufferView& in, const BufferView& out,
                         ReduceOp op, Deadline deadline);
void tree_allgather(Communicator& comm, const BufferView& in, const BufferView& out,
                    Deadline deadline);

// Run the algorithm the selector picks (ring or tree).
void reduce_scatter(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
                    Deadline deadline);
void allgather(Communicator& comm, const BufferView& in, const BufferView& out, Deadline deadline);

// buf on every rank = buf on `root`, pipelined along the ring.
void ring_broadcast(Communicator& comm, const BufferView& buf, int root, Deadline deadline);

// The rooted and personalised collectives travel the point-to-point links, each message tagged
// with the collective's sequence number and kind. A Span is `bytes` at `data`; blocks[i] is
// what goes to (or comes from) rank i, and blocks[rank] is this rank's own.
struct Span {
  uint8_t* data = nullptr;
  size_t bytes = 0;
};

// Root: blocks[i] = in of rank i. Others send `in` (blocks is ignored). Sizes must match.
void gather(Communicator& comm, const Span& in, const std::vector<Span>& blocks, int root,
            Deadline deadline);
// Others: out = blocks[rank] of root. Root copies blocks[root] into out.
void scatter(Communicator& comm, const std::vector<Span>& blocks, const Span& out, int root,
             Deadline deadline);
// out[j] on rank i = in[i] on rank j, for every pair; sizes may differ per pair but must
// agree between the two ranks of a pair. A zero-byte block is still announced, so that a
// disagreement fails naming both sizes.
void all_to_all(Communicator& comm, const std::vector<Span>& in, const std::vector<Span>& out,
                Deadline deadline);

// Returns once every rank has entered the barrier: on the symmetric control pages where every
// rank is on this host and they are mapped (zero_copy_barrier), else along the ring.
void barrier(Communicator& comm, Deadline deadline);
void ring_barrier(Communicator& comm, Deadline deadline);

}  // namespace pyring
