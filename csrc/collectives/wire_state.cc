#include "collectives/wire_state.h"

#include <cstring>
#include <memory>

#include "collectives/driver.h"
#include "core/errors.h"
#include "device/runtime.h"
#include "kernels/elementwise.h"
#include "kernels/onebit.h"

namespace pyring {

namespace {

// Onebit segments: every chunk is cut into the same number, so that a segment index means the
// same thing on every rank; each (stream, segment) keeps its own mask cache.
constexpr size_t kOnebitSegmentElems = size_t{1} << 20;

}  // namespace

size_t onebit_segments(size_t n, size_t participants) {
  const size_t widest = Chunks{n, participants}.size(0);
  return widest == 0 ? 1 : (widest + kOnebitSegmentElems - 1) / kOnebitSegmentElems;
}

std::vector<size_t> onebit_cache_sizes(size_t n, int participants, int index) {
  const size_t P = static_cast<size_t>(participants), S = onebit_segments(n, P);
  const Chunks ch{n, P};
  const Chunks own{ch.size(static_cast<size_t>(index)), S};
  std::vector<size_t> sizes;
  for (size_t j = 0; j < P; ++j) {
    for (size_t s = 0; s < S; ++s) sizes.push_back(Chunks{ch.size(j), S}.size(s));
  }
  for (size_t j = 0; j < P; ++j) {
    for (size_t s = 0; s < S; ++s) sizes.push_back(own.size(s));
  }
  for (size_t s = 0; s < S; ++s) sizes.push_back(own.size(s));
  for (size_t j = 0; j < P; ++j) {
    for (size_t s = 0; s < S; ++s) sizes.push_back(Chunks{ch.size(j), S}.size(s));
  }
  return sizes;
}

size_t WireState::mask_bytes(size_t n, int participants, int index) {
  size_t total = 0;
  for (size_t s : onebit_cache_sizes(n, participants, index)) total += onebit_cache_bytes(s);
  return total;
}

WireState::~WireState() {
  drop_device();
}

void WireState::drop_device() noexcept {
  if (!queue_) return;
  // The queue frees it once nothing can use it (DeviceQueue::retire): this may be the thread
  // running collectives, which must not free device memory.
  try {
    queue_->retire(device_, false);
  } catch (const std::exception&) {  // no memory to note it in: kept rather than risk a deadlock
  }
  device_ = nullptr;
  queue_.reset();
}

void WireState::to_host() {
  if (!queue_) return;
  queue_->copy_async(worker.data(), device_, worker.size() * sizeof(uint16_t));
  queue_->copy_async(server.data(), device_ + worker.size(), server.size() * sizeof(uint16_t));
  device_runtime(queue_->device().kind).synchronize(queue_->device().index, queue_->stream());
  drop_device();
}

template <typename F>
void WireState::each_segment(F f) const {
  const size_t P = static_cast<size_t>(participants_), S = onebit_segments(n_, P);
  const Chunks ch{n_, P};
  for (size_t j = 0; j < P; ++j) {
    const Chunks seg{ch.size(j), S};
    for (size_t s = 0; s < S; ++s) f(false, ch.offset(j) + seg.offset(s), seg.size(s), j * S + s);
  }
  const Chunks mine{ch.size(static_cast<size_t>(index_)), S};
  for (size_t s = 0; s < S; ++s) f(true, mine.offset(s), mine.size(s), P * S + s);
}

void WireState::settled_copy(float* w, float* sv) const {
  if (n_ == 0 || pending.empty()) {  // settled (set refuses scales without a shape)
    for (size_t i = 0; i < worker.size(); ++i) w[i] = onebit_kept_value(worker[i]);
    for (size_t i = 0; i < server.size(); ++i) sv[i] = onebit_kept_value(server[i]);
    return;
  }
  // The segments cover worker and server whole.
  each_segment([&](bool is_server, size_t off, size_t count, size_t k) {
    const uint16_t* from = (is_server ? server.data() : worker.data()) + off;
    onebit_settled_copy(from, count, pending[k], (is_server ? sv : w) + off);
  });
}

WireState::Residuals WireState::residuals(const std::shared_ptr<DeviceQueue>& queue) {
  if (queue_ != queue) {
    to_host();
    if (queue) {
      DeviceRuntime& rt = device_runtime(queue->device().kind);
      const int index = queue->device().index;
      const size_t total = worker.size() + server.size();
      device_ = static_cast<uint16_t*>(device_alloc(rt, index, total * sizeof(uint16_t)));
      queue_ = queue;
      queue->copy_async(device_, worker.data(), worker.size() * sizeof(uint16_t));
      queue->copy_async(device_ + worker.size(), server.data(), server.size() * sizeof(uint16_t));
    }
  }
  if (queue_) return {device_, device_ + worker.size(), pending.data()};
  return {worker.data(), server.data(), pending.data()};
}

void WireState::restore(size_t n, int participants, int index) {
  if (n != 0) {
    const size_t P = static_cast<size_t>(participants);
    const size_t own = Chunks{n, P}.size(static_cast<size_t>(index));
    const size_t scales = (P + 1) * onebit_segments(n, P);
    PYRING_CHECK_ARG(worker.size() == n && server.size() == own && pending.size() == scales,
                     "OneBitState restored for ", n, " elements on ", participants,
                     " participants (index ", index, ") needs ", n, " worker residuals, ", own,
                     " server residuals and ", scales, " scales; it holds ", worker.size(), ", ",
                     server.size(), " and ", pending.size());
  }
  n_ = n;
  participants_ = participants;
  index_ = index;
}

namespace {

void check_wire(std::string& bound, const char* wire) {
  PYRING_CHECK_ARG(bound.empty() || bound == wire, "OneBitState holds the error feedback of wire ",
                   bound, "; this call is on wire ", wire, ": use one state per bucket and wire");
  bound = wire;
}

}  // namespace

void WireState::bind_codec(const char* wire, size_t n, int participants, int index) {
  check_wire(wire_, wire);
  const size_t own = Chunks{n, static_cast<size_t>(participants)}.size(static_cast<size_t>(index));
  if (worker.empty() && server.empty() && masks.empty()) {
    worker.assign(n, 0);
    server.assign(own, 0);
    pending.clear();
  }
  PYRING_CHECK_ARG(worker.size() == n && server.size() == own && masks.empty() && pending.empty(),
                   "OneBitState holds residuals for ", worker.size(), " elements (server chunk ",
                   server.size(), masks.empty() ? "" : ", and onebit's mask caches",
                   "); this tensor has ", n, " on ", participants, " participants (chunk ", own,
                   ") on wire ", wire, ": use one state per bucket and wire");
  n_ = n;
  participants_ = participants;
  index_ = index;
}

void WireState::bind(size_t n, int participants, int index) {
  check_wire(wire_, "onebit");
  const size_t own = Chunks{n, static_cast<size_t>(participants)}.size(static_cast<size_t>(index));
  const size_t masks_n = mask_bytes(n, participants, index);
  const size_t P = static_cast<size_t>(participants);
  const size_t scales = (P + 1) * onebit_segments(n, P);
  if (worker.empty() && server.empty() && masks.empty()) {
    worker.assign(n, 0);
    server.assign(own, 0);
    masks.assign(masks_n, 0);
    pending.clear();
  } else {
    if (masks.empty()) masks.assign(masks_n, 0);  // restored from a state saved without caches
    PYRING_CHECK_ARG(worker.size() == n && server.size() == own && masks.size() == masks_n,
                     "OneBitState holds residuals for ", worker.size(), " elements (server chunk ",
                     server.size(), ", ", masks.size(), " bytes of mask caches); this tensor has ",
                     n, " on ", participants, " participants (chunk ", own, ", ", masks_n,
                     " bytes): use one state per bucket");
  }
  if (n_ != 0 && (n != n_ || participants != participants_ || index != index_)) {
    // The deferred scales follow the layout they were deferred in: settled there, and kept
    // rounded, they start the new layout with no scale.
    to_host();
    each_segment([&](bool is_server, size_t off, size_t count, size_t k) {
      uint16_t* r = (is_server ? server.data() : worker.data()) + off;
      for (size_t i = 0; i < count; ++i) {
        r[i] = onebit_kept(onebit_settled(onebit_kept_value(r[i]), pending[k]));
      }
    });
    pending.clear();
  }
  if (pending.empty()) pending.assign(scales, 0.0f);  // new, settled above, or restored settled
  PYRING_CHECK_ARG(pending.size() == scales, "OneBitState holds ", pending.size(),
                   " deferred scales; this tensor's layout has ", scales, " (n ", n, " on ",
                   participants, " participants)");
  n_ = n;
  participants_ = participants;
  index_ = index;
}

}  // namespace pyring
