// Compressed allreduce: the fp16, bf16 and onebit wires, one collective of the core (one call,
// one Work, on the progress thread).
//
// The schedule over P participants (every rank, or the top-level groups' leaders), for a
// float32 vector x of n elements cut into P chunks (chunk j owned by participant j):
// 1. each participant encodes the P - 1 chunks it does not own (onebit adds the state's worker
//    residual first and keeps what the encoding dropped in it) and sends chunk j to its owner;
//    its own chunk travels nowhere and is not encoded;
// 2. the owner adds, in float32, its own chunk exact first, then the others' decoded copies in
//    participant order; avg divides by the world (the 16-bit wires divide the sum once; onebit
//    divides each term, its decode scaling by 1 / world);
// 3. it encodes the result again (onebit: the server residual) and sends it to every
//    participant, which decodes every chunk into x.
// Every participant ends with the same values. Hierarchical form (collectives/selector.h
// chooses it): each rank first sends x to its group's leader, which adds them in float32
// (full precision inside a group), the leaders run the schedule, and each leader sends the
// result back to its group. A onebit payload is preceded by its size; fp16 and bf16 payloads
// have a size both ends know. The last `exact_tail` elements (flags, counts) travel in full
// precision: an ordinary allreduce in the same collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/wire_state.h"
#include "core/communicator.h"
#include "core/types.h"

namespace pyring {

// Validates a call before any byte moves, on the caller's thread: op sum or avg, a floating
// dtype, exact_tail within the buffer, and for onebit a state, bound here to the shape this
// rank's part of the schedule needs. Throws InvalidArgument.
void check_compressed(const Communicator& comm, const BufferView& x, size_t exact_tail, Wire wire,
                      ReduceOp op, WireState* state, Algo algo);

// x (dtype float32, float64, float16 or bfloat16) = sum or avg over every rank, in place; the
// call was checked by check_compressed. x is host memory, or device memory (not float64) whose
// kernels and copies go on x.stream, its DeviceQueue's stream: the codec runs on the device and
// only encoded bytes cross to the host (collectives/wire_codec.h). `state` is required for (and
// only used by) onebit. algo kAuto or kTree may go hierarchical; kRing and kDirect keep the flat
// schedule. The fp32 wire is the ordinary allreduce.
void compressed_allreduce(Communicator& comm, const BufferView& x, size_t exact_tail, Wire wire,
                          ReduceOp op, WireState* state, Algo algo, Deadline deadline);

}  // namespace pyring
