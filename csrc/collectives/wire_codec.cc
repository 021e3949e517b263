#include "collectives/wire_codec.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "core/scratch_arena.h"
#include "device/runtime.h"

namespace pyring {

WireCodec::WireCodec(ScratchArena& host) : host_(&host) {}

WireCodec::WireCodec(DeviceQueue& queue) : site_{queue.device(), queue.stream()}, queue_(&queue) {}

WireCodec::~WireCodec() {
  if (finished_) return;
  try {
    sync();
  } catch (const std::exception&) {  // the stream is broken: nothing queued on it runs
  }
  if (queue_) {
    queue_->pinned_arena().reset();
    queue_->device_arena().reset();
  } else {
    host_->reset();
  }
}

void WireCodec::sync() {
  if (queue_) device_runtime(site_.device.kind).synchronize(site_.device.index, site_.stream);
}

void WireCodec::finish() {
  sync();
  finished_ = true;
  if (queue_) {
    queue_->pinned_arena().reset();
    queue_->device_arena().reset();
  } else {
    host_->reset();
  }
}

uint8_t* WireCodec::wire(size_t bytes) {
  if (!queue_) return host_->take(bytes);
  Region r{queue_->pinned_arena().take(bytes), queue_->device_arena().take(bytes), bytes};
  regions_.push_back(r);
  return r.host;
}

float* WireCodec::values(size_t count) {
  ScratchArena& a = queue_ ? queue_->device_arena() : *host_;
  return reinterpret_cast<float*>(a.take(count * sizeof(float)));
}

uint8_t* WireCodec::mirror(const void* p) const {
  const uint8_t* q = static_cast<const uint8_t*>(p);
  for (const Region& r : regions_) {
    if (q >= r.host && q < r.host + r.bytes) return r.device + (q - r.host);
  }
  PYRING_CHECK(false, Error, "wire codec: ", p, " is not wire memory of this call");
  return nullptr;
}

void WireCodec::download(void* host, const void* x, size_t bytes) {
  if (!queue_) {
    if (host != x) std::memcpy(host, x, bytes);
    return;
  }
  if (bytes == 0) return;
  queue_->copy_async(host, x, bytes);
  sync();
}

void WireCodec::upload(void* x, const void* host, size_t bytes) {
  if (!queue_) {
    if (host != x) std::memcpy(x, host, bytes);
    return;
  }
  queue_->copy_async(x, host, bytes);
}

size_t WireCodec::onebit_encode(const float* in, uint16_t* residual, float* pending, size_t n,
                                uint8_t* out, uint8_t* cache) {
  if (!queue_) return onebit_encode_deferred(in, residual, pending, n, out, cache);
  PYRING_CHECK_ARG((residual == nullptr) == (pending == nullptr),
                   "one-bit encode: a kept residual goes with its pending scale");
  OnebitHeader h;
  const size_t bytes = kern::onebit_encode(site_, in, residual, pending ? *pending : 0.0f, n,
                                           mirror(out), nullptr, &h);
  if (pending) *pending = h.scale;
  download(out, mirror(out), bytes);
  return onebit_cache_encoded(out, n, cache);
}

void WireCodec::onebit_decode(uint8_t* enc, size_t n, float alpha, bool accumulate, float* out,
                              uint8_t* cache, bool local) {
  OnebitHeader h;
  if (!queue_) {
    std::memcpy(&h, enc, sizeof h);
    return kern::onebit_decode(site_, h, enc, n, alpha, accumulate, out, cache);
  }
  // The caches on the host; the device's copy then carries its mask. A local segment's
  // mirror holds it as the device encoded it, mask included.
  onebit_uncache(enc, n, cache);
  std::memcpy(&h, enc, sizeof h);
  if (!local) upload(mirror(enc), enc, onebit_bytes(enc, n));
  kern::onebit_decode(site_, h, mirror(enc), n, alpha, accumulate, out, nullptr);
}

size_t WireCodec::onebit_reduce_encode(const float* own, int divisor, uint8_t* const* copies,
                                       uint8_t* const* caches, size_t count, size_t n,
                                       uint16_t* residual, float* pending, uint8_t* out,
                                       uint8_t* cache, float* scratch) {
  if (!queue_) {
    return pyring::onebit_reduce_encode(own, divisor, copies, caches, count, n, residual, pending,
                                        out, cache);
  }
  // finish_wide's avg is own[i] / divisor in float32, as the host's sum starts.
  kern::finish_wide(site_, DType::kFloat32, divisor > 1 ? ReduceOp::kAvg : ReduceOp::kSum, own,
                    scratch, n, divisor);
  const float alpha = 1.0f / static_cast<float>(divisor);
  for (size_t k = 0; k < count; ++k) {
    onebit_decode(copies[k], n, alpha, true, scratch, caches[k], false);
  }
  return onebit_encode(scratch, residual, pending, n, out, cache);
}

void WireCodec::encode(const Codec& c, const float* in, uint16_t* residual, size_t n,
                       uint8_t* out) {
  if (!queue_) return c.encode(site_, in, residual, n, out);
  c.encode(site_, in, residual, n, mirror(out));
  download(out, mirror(out), c.encoded_bytes(n));
}

void WireCodec::sum(const Codec& c, const float* own, int divisor, const uint8_t* const* copies,
                    size_t count, size_t n, float* out) {
  const float div = static_cast<float>(divisor);
  if (!queue_) {
    // Block by block, so that the running sum stays in cache: a multiple of the codec's block,
    // where its encodings may be cut.
    const size_t block = (2048 + c.block() - 1) / c.block() * c.block();
    for (size_t b = 0; b < n; b += block) {
      const size_t len = std::min(block, n - b);
      float* s = out + b;
      std::memcpy(s, own + b, len * sizeof(float));
      for (size_t k = 0; k < count; ++k) {
        c.decode(site_, copies[k] + c.encoded_bytes(b), len, true, s);
      }
      if (divisor != 1) {
        for (size_t i = 0; i < len; ++i) s[i] = s[i] / div;
      }
    }
    return;
  }
  kern::copy(site_, out, own, n * sizeof(float));
  for (size_t k = 0; k < count; ++k) {
    uint8_t* src = mirror(copies[k]);
    upload(src, copies[k], c.encoded_bytes(n));
    c.decode(site_, src, n, true, out);
  }
  if (divisor > 1) {
    kern::finish_wide(site_, DType::kFloat32, ReduceOp::kAvg, out, out, n, divisor);
  }
}

void WireCodec::decode(const Codec& c, const uint8_t* enc, size_t n, float* out, bool local) {
  if (!queue_) return c.decode(site_, enc, n, false, out);
  uint8_t* src = mirror(enc);
  if (!local) upload(src, enc, c.encoded_bytes(n));
  c.decode(site_, src, n, false, out);
}

void WireCodec::add(float* x, const float* part, size_t n) {
  if (!queue_) {
    for (size_t i = 0; i < n; ++i) x[i] += part[i];
    return;
  }
  uint8_t* src = mirror(part);
  upload(src, part, n * sizeof(float));
  kern::accumulate(site_, DType::kFloat32, ReduceOp::kSum, src, x, x, n);
}

void WireCodec::to_float(const void* x, DType dtype, float* f, size_t n) {
  if (!queue_ && dtype == DType::kFloat64) {
    const double* d = static_cast<const double*>(x);
    for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(d[i]);
    return;
  }
  kern::cast(site_, dtype, DType::kFloat32, x, f, n);
}

void WireCodec::from_float(const float* f, DType dtype, void* x, size_t n) {
  if (!queue_ && dtype == DType::kFloat64) {
    double* d = static_cast<double*>(x);
    for (size_t i = 0; i < n; ++i) d[i] = f[i];
    return;
  }
  kern::cast(site_, DType::kFloat32, dtype, f, x, n);
}

}  // namespace pyring
