// The one kernel interface of the collectives: each function runs its kernel where `site`
// says, on the host at once, or queued on a device stream through the device runtime
// (device/runtime.h: the CUDA kernels, or on the sim device the same kernels' bodies run over
// an emulated grid on its stream thread, kernels/host_grid.cc).
// Arguments and element arithmetic as in kernels/reduce.h and kernels/wire_cast.h; no
// collective calls those directly.
//
// A device site's kernels are queued, not run: their inputs must stay valid until the stream
// reaches them. The collectives run on host buffers, or on device buffers when their links
// carry device memory (DeviceQueue::run_resident); the site says which.
#pragma once

#include <cstddef>

#include "core/types.h"
#include "kernels/onebit.h"

namespace pyring {

struct KernelSite {
  Device device;
  StreamId stream = 0;

  static KernelSite of(const BufferView& v) { return KernelSite{v.device, v.stream}; }
  bool on_host() const { return device.is_cpu(); }
};

namespace kern {

// acc[i] = op(widen(a[i]), b[i])
void accumulate(const KernelSite& site, DType dtype, ReduceOp op, const void* a, const void* b,
                void* acc, size_t n);
// out[i] = narrow(finish(op(widen(a[i]), b[i])))
void finish(const KernelSite& site, DType dtype, ReduceOp op, const void* a, const void* b,
            void* out, size_t n, int world);
// out[i] = narrow(finish(acc[i]))
void finish_wide(const KernelSite& site, DType dtype, ReduceOp op, const void* acc, void* out,
                 size_t n, int world);
// acc[i] = widen(a[i])
void widen(const KernelSite& site, DType dtype, const void* a, void* acc, size_t n);
// out[i] = finish(a[i]) for a world of one rank
void finish_single(const KernelSite& site, DType dtype, const void* a, void* out, size_t n);
// dst[0, bytes) = src[0, bytes); the ranges do not overlap
void copy(const KernelSite& site, void* dst, const void* src, size_t bytes);
// out[i] = in[i] converted between float32 and float16/bfloat16
void cast(const KernelSite& site, DType from, DType to, const void* in, void* out, size_t n);

// onebit_encode_deferred of kernels/onebit.h at the site, with a kept residual (at the site;
// null: none) whose last scale is `pending` (0: settled); returns the bytes written and the
// header, whose scale is the residual's pending scale from now on. A device site takes no mask
// cache (null) and synchronizes its stream: on return the segment is in `out`.
size_t onebit_encode(const KernelSite& site, const float* in, uint16_t* residual, float pending,
                     size_t n, uint8_t* out, uint8_t* cache, OnebitHeader* header);
// onebit_decode of kernels/onebit.h at the site, of the segment at `encoded` whose header the
// host holds as `header` (a device's memory is not read by the host; on the host the two must
// agree). A device site takes no mask cache and no kMaskCached segment.
void onebit_decode(const KernelSite& site, const OnebitHeader& header, const uint8_t* encoded,
                   size_t n, float alpha, bool accumulate, float* out, uint8_t* cache);

}  // namespace kern
}  // namespace pyring
