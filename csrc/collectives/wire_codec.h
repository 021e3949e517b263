// The codec steps of the compressed allreduce (compressed.h) where its values live.
//
// On the host they are the CPU codecs on host memory. On a device they are the kernel
// interface's (kernels/dispatch.h), queued on pyring's stream of the device's DeviceQueue:
// only encoded bytes cross between the device and pinned host memory, where the links send and
// receive them and where the onebit mask caches are applied (onebit_cache_encoded,
// onebit_uncache), so that the wire is the same as the host's.
//
// Memory of one call: wire(bytes) is host memory (pinned on a device) with, on a device, a
// mirror of the same size in device memory; values(count) is float32 memory at the site (the
// host never reads a device's). Both stay valid until finish(). One codec per call, used by
// the thread running the collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codecs/codec.h"
#include "collectives/compressed.h"
#include "core/device_queue.h"
#include "kernels/dispatch.h"

namespace pyring {

class WireCodec {
 public:
  // The host: memory from `host`, the communicator's arena, reused by every call.
  explicit WireCodec(ScratchArena& host);
  // A device: memory from the queue's arenas, kernels and copies on its stream.
  explicit WireCodec(DeviceQueue& queue);
  // Ends the call's use of the memory without waiting (after a failure, once the queue's
  // stream is released by its ticket).
  ~WireCodec();
  WireCodec(const WireCodec&) = delete;
  WireCodec& operator=(const WireCodec&) = delete;

  bool on_device() const { return !site_.on_host(); }
  const KernelSite& site() const { return site_; }
  DeviceQueue* queue() const { return queue_; }

  uint8_t* wire(size_t bytes);
  float* values(size_t count);
  // Waits until the queued kernels and copies have run; the memory is then free for reuse.
  void finish();

  // Encodes in[0, n) (+ residual) into the wire bytes at `out`, with the mask cache `cache`
  // (host memory). On return the segment is in `out`, ready to send. The residual (at the
  // site; null: none) is kept as onebit_encode_deferred says, its scale at `pending` (host
  // memory; null exactly when residual is).
  size_t onebit_encode(const float* in, uint16_t* residual, float* pending, size_t n, uint8_t* out,
                       uint8_t* cache);
  // out (at the site) = alpha * decode, or += with accumulate, of the wire segment at `enc`:
  // received into it (local false), or written there by this codec's encode (local true).
  void onebit_decode(uint8_t* enc, size_t n, float alpha, bool accumulate, float* out,
                     uint8_t* cache, bool local);

  // The owner's step: encodes (as onebit_encode, into `out`, ready to send) own / divisor plus
  // the sum of decode(copies[k]) / divisor in k order, as kernels/onebit.h's
  // onebit_reduce_encode, with residual and pending. `own` (n values at the site) is this
  // rank's segment, in exact; copies[k] (count of them) were received, with mask caches
  // caches[k]. On the host the sum is never stored; a device sums into `scratch` (n values at
  // the site).
  size_t onebit_reduce_encode(const float* own, int divisor, uint8_t* const* copies,
                              uint8_t* const* caches, size_t count, size_t n, uint16_t* residual,
                              float* pending, uint8_t* out, uint8_t* cache, float* scratch);

  // The generic schedule's steps (collectives/codec_flat.h) with `c`'s kernels at the site.
  // out (wire memory) = c's encoding of in[0, n) (+ residual at the site, null: none, as
  // codecs/codec.h says), ready to send on return.
  void encode(const Codec& c, const float* in, uint16_t* residual, size_t n, uint8_t* out);
  // out (n values at the site) = (own[i] + decode(copies[0])[i] + ... + decode(copies[count -
  // 1])[i]) / divisor in float32, added in that order (divisor 1: no division); own is this
  // rank's segment, exact; copies were received into wire memory.
  void sum(const Codec& c, const float* own, int divisor, const uint8_t* const* copies,
           size_t count, size_t n, float* out);
  // out = decode(enc) of wire memory received into (local false), or written there by this
  // codec's encode (local true).
  void decode(const Codec& c, const uint8_t* enc, size_t n, float* out, bool local);

  // host[0, bytes) = x[0, bytes) on return (x at the site, host: the wire memory).
  void download(void* host, const void* x, size_t bytes);
  // x[0, bytes) = host[0, bytes) (host: wire memory received into).
  void upload(void* x, const void* host, size_t bytes);
  // x[i] += part[i] in float32 (part: wire memory received into).
  void add(float* x, const float* part, size_t n);
  // f[i] = float32(x[i]) and back, for x of float16 or bfloat16 (float64 too on the host).
  void to_float(const void* x, DType dtype, float* f, size_t n);
  void from_float(const float* f, DType dtype, void* x, size_t n);

 private:
  // The device mirror of wire memory p.
  uint8_t* mirror(const void* p) const;
  void sync();

  KernelSite site_;
  DeviceQueue* queue_ = nullptr;
  ScratchArena* host_ = nullptr;  // the host's memory; null on a device
  struct Region {
    uint8_t* host;
    uint8_t* device;
    size_t bytes;
  };
  std::vector<Region> regions_;
  bool finished_ = false;
};

}  // namespace pyring
