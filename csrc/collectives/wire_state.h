// The error feedback of the wires that keep it (compressed.h; onebit and the codecs of
// codecs/codec.h): the state object the collective updates
// and Python holds and checkpoints, and the segment layout both sides of it share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device_queue.h"

namespace pyring {

// Onebit segments per chunk when n values are cut into `participants` chunks: the same on
// every rank, so that a segment index means the same thing everywhere.
size_t onebit_segments(size_t n, size_t participants);
// The element count of every mask cache of the shape, in WireState's layout.
std::vector<size_t> onebit_cache_sizes(size_t n, int participants, int index);

// The error feedback of one bucket on the onebit wire, updated by the collective: residuals and
// the mask caches of every stream of the schedule, laid out as
// enc[P] (chunk sizes), recv[P] (own chunk), server (own chunk), gather[P] (chunk sizes).
// Sized at first use for (n, participants, index); any other shape is refused. The residuals
// are kept (kernels/onebit.h): bfloat16, each segment's holding the value it last encoded,
// with that encoding's scale in `pending` (worker segments [j * S + s], then server segments
// [s]), on the host for every call. They live where the bucket does: a call on a device moves
// them there as they are, and the host vectors are then stale until to_host(). The mask
// caches stay on the host.
struct WireState {
  std::vector<uint16_t> worker;  // n
  std::vector<uint16_t> server;  // the owned chunk
  std::vector<uint8_t> masks;    // the mask caches
  std::vector<float> pending;    // the deferred scales; empty or all 0: settled

  // Where a call's residuals are (host or device memory); the scales are on the host.
  struct Residuals {
    uint16_t* worker;
    uint16_t* server;
    float* pending;
  };

  WireState() = default;
  ~WireState();
  WireState(const WireState&) = delete;
  WireState& operator=(const WireState&) = delete;

  // The residuals for a call at `queue`'s device (null: the host), moved there first. The
  // thread running the collective calls it; the state is bound.
  Residuals residuals(const std::shared_ptr<DeviceQueue>& queue);
  // The residuals back in the host vectors, waiting for the device; none stay on it.
  void to_host();
  // The residuals worker and server stand for, settled, as float32 into w and sv (their
  // sizes); the host vectors as they are (call to_host() first). Changes nothing.
  void settled_copy(float* w, float* sv) const;
  // Forgets the device's copy without reading it (the host vectors are being replaced).
  void drop_device() noexcept;

  // Allocates zeroed state for the shape, or checks the held one (restored from a checkpoint)
  // matches it. Throws InvalidArgument naming both shapes.
  void bind(size_t n, int participants, int index);
  // As bind, for a codec of the generic schedule with error feedback (codecs/codec.h): worker
  // residuals for the n values and server residuals for the owned chunk, no mask caches, no
  // deferred scales. A state serves one wire: one bound to another is refused, naming both.
  void bind_codec(const char* wire, size_t n, int participants, int index);
  // The shape that restored vectors (with their deferred scales) were saved in; 0: none (the
  // residuals are settled, pending empty). Throws InvalidArgument when they do not fit it.
  void restore(size_t n, int participants, int index);
  size_t bound_n() const { return n_; }
  int bound_participants() const { return participants_; }
  int bound_index() const { return index_; }
  // Mask cache bytes of the shape.
  static size_t mask_bytes(size_t n, int participants, int index);

 private:
  // Calls f(is_server, offset, count, k) for every segment of worker and server in the bound
  // shape's layout: `count` values from `offset` of server (is_server) or worker, whose
  // deferred scale is pending[k].
  template <typename F>
  void each_segment(F f) const;

  std::shared_ptr<DeviceQueue> queue_;  // where the residuals are, while on a device
  uint16_t* device_ = nullptr;          // worker, then server, in the queue's device memory
  size_t n_ = 0;                        // the bound shape; 0: none yet (new or restored)
  int participants_ = 0, index_ = 0;
  std::string wire_;  // the wire it was bound to; empty: new or restored
};

}  // namespace pyring
