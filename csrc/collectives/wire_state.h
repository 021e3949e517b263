// The onebit wire's error feedback (compressed.h): the state object the collective updates
// and Python holds and checkpoints, and the segment layout both sides of it share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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

}  // namespace pyring
