// Compressed allreduce: the fp16, bf16 and onebit wires, one collective of the core (one call,
// one Work, on the progress thread).
//
// The schedule over P participants (every rank, or the top-level groups' leaders), for a
// float32 vector x of n elements cut into P chunks (chunk j owned by participant j):
// 1. each participant encodes its chunks (onebit adds the state's worker residual first and
//    keeps what the encoding dropped in it) and sends chunk j to its owner;
// 2. the owner decodes the P copies of its chunk and adds them in float32, in participant
//    order; avg scales by 1/world;
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

#include "core/communicator.h"
#include "core/types.h"

namespace pyring {

enum class Wire : int { kFp32 = 0, kFp16 = 1, kBf16 = 2, kOnebit = 3 };
constexpr int kNumWires = 4;
const char* wire_name(Wire w);
Wire wire_from_int(int v);  // throws InvalidArgument naming the valid wires

// The error feedback of one bucket on the onebit wire, updated by the collective: residuals and
// the mask caches of every stream of the schedule, laid out as
// enc[P] (chunk sizes), recv[P] (own chunk), server (own chunk), gather[P] (chunk sizes).
// Sized at first use for (n, participants, index); any other shape is refused. The residuals
// live where the bucket does: a call on a device moves them there, and the host vectors are
// then stale until to_host(). The mask caches stay on the host. On the host the residuals are
// deferred (kernels/onebit.h): each segment's holds the value it last encoded, with that
// encoding's scale in `pending` (worker segments [j * S + s], then server segments [s]). A
// move to a device or to another shape settles them; settled_copy() reads them settled
// without writing the state (a read during a call sees torn values, as it always did, but
// changes nothing).
struct WireState {
  std::vector<float> worker;   // n
  std::vector<float> server;   // the owned chunk
  std::vector<uint8_t> masks;  // the mask caches
  std::vector<float> pending;  // the deferred scales; empty or all 0: settled

  // Where a call's residuals are: on the host with their deferred scales, or on a device
  // (pending null).
  struct Residuals {
    float* worker;
    float* server;
    float* pending;
  };

  WireState() = default;
  ~WireState();
  WireState(const WireState&) = delete;
  WireState& operator=(const WireState&) = delete;

  // The residuals for a call at `queue`'s device (null: the host), moved there (and settled)
  // first. The thread running the collective calls it; the state is bound.
  Residuals residuals(const std::shared_ptr<DeviceQueue>& queue);
  // The residuals back in the host vectors, waiting for the device; none stay on it.
  void to_host();
  // worker and server, settled, into w and sv (their sizes); the host vectors as they are
  // (call to_host() first).
  void settled_copy(float* w, float* sv) const;
  // Forgets the device's copy without reading it (the host vectors are being replaced).
  void drop_device() noexcept;

  // Allocates zeroed state for the shape, or checks the held one (restored from a checkpoint)
  // matches it. Throws InvalidArgument naming both shapes.
  void bind(size_t n, int participants, int index);
  // Mask cache bytes of the shape.
  static size_t mask_bytes(size_t n, int participants, int index);

 private:
  void settle();
  // Settles residuals laid out as worker and server at w and sv with the deferred scales at
  // `scales` (pending's layout), zeroing them.
  void settle_into(float* w, float* sv, float* scales) const;

  std::shared_ptr<DeviceQueue> queue_;  // where the residuals are, while on a device
  float* device_ = nullptr;             // worker, then server, in the queue's device memory
  size_t n_ = 0;                        // the bound shape
  int participants_ = 0, index_ = 0;
};

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
