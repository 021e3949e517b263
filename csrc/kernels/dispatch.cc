#include "kernels/dispatch.h"

#include <cstring>

#include "core/errors.h"
#include "device/runtime.h"
#include "kernels/reduce.h"
#include "kernels/wire_cast.h"

namespace pyring::kern {

namespace {
DeviceRuntime& rt(const KernelSite& site) {
  return device_runtime(site.device.kind);
}
}  // namespace

void accumulate(const KernelSite& site, DType dtype, ReduceOp op, const void* a, const void* b,
                void* acc, size_t n) {
  if (site.on_host()) return reduce_accumulate(dtype, op, a, b, acc, n);
  rt(site).reduce_accumulate(site.device.index, dtype, op, a, b, acc, n, site.stream);
}

void finish(const KernelSite& site, DType dtype, ReduceOp op, const void* a, const void* b,
            void* out, size_t n, int world) {
  if (site.on_host()) return reduce_finish(dtype, op, a, b, out, n, world);
  rt(site).reduce_finish(site.device.index, dtype, op, a, b, out, n, world, site.stream);
}

void finish_wide(const KernelSite& site, DType dtype, ReduceOp op, const void* acc, void* out,
                 size_t n, int world) {
  if (site.on_host()) return pyring::finish_wide(dtype, op, acc, out, n, world);
  rt(site).finish_wide(site.device.index, dtype, op, acc, out, n, world, site.stream);
}

void widen(const KernelSite& site, DType dtype, const void* a, void* acc, size_t n) {
  if (accum_dtype(dtype) == dtype) {  // the same type: a copy
    if (a == acc) return;
    if (site.on_host()) return static_cast<void>(std::memcpy(acc, a, n * dtype_size(dtype)));
    return rt(site).copy_async(site.device.index, acc, a, n * dtype_size(dtype), site.stream);
  }
  if (site.on_host()) return pyring::widen(dtype, a, acc, n);
  rt(site).cast(site.device.index, dtype, accum_dtype(dtype), a, acc, n, site.stream);
}

void finish_single(const KernelSite& site, DType dtype, const void* a, void* out, size_t n) {
  if (site.on_host()) return pyring::finish_single(dtype, a, out, n);
  // Avg over one rank divides by one: a copy for every op.
  if (a != out) rt(site).copy_async(site.device.index, out, a, n * dtype_size(dtype), site.stream);
}

void copy(const KernelSite& site, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (site.on_host()) return static_cast<void>(std::memcpy(dst, src, bytes));
  rt(site).copy_async(site.device.index, dst, src, bytes, site.stream);
}

void cast(const KernelSite& site, DType from, DType to, const void* in, void* out, size_t n) {
  if (site.on_host()) return wire_cast(from, to, in, out, n);
  rt(site).cast(site.device.index, from, to, in, out, n, site.stream);
}

size_t onebit_encode(const KernelSite& site, const float* in, uint16_t* residual, float pending,
                     size_t n, uint8_t* out, uint8_t* cache, OnebitHeader* header) {
  if (site.on_host()) {
    const size_t bytes =
        pyring::onebit_encode_deferred(in, residual, residual ? &pending : nullptr, n, out, cache);
    std::memcpy(header, out, sizeof(OnebitHeader));
    return bytes;
  }
  PYRING_CHECK_ARG(cache == nullptr, "one-bit encode on a device takes no mask cache");
  return rt(site).onebit_encode(site.device.index, in, residual, pending, n, out, header,
                                site.stream);
}

void onebit_decode(const KernelSite& site, const OnebitHeader& header, const uint8_t* encoded,
                   size_t n, float alpha, bool accumulate, float* out, uint8_t* cache) {
  if (site.on_host()) {
    PYRING_CHECK_ARG(std::memcmp(&header, encoded, sizeof header) == 0,
                     "one-bit decode: the header given differs from the segment's");
    return pyring::onebit_decode(encoded, n, alpha, accumulate, out, cache);
  }
  PYRING_CHECK_ARG(cache == nullptr, "one-bit decode on a device takes no mask cache");
  rt(site).onebit_decode(site.device.index, header, encoded, n, alpha, accumulate, out,
                         site.stream);
}

}  // namespace pyring::kern
