// The CUDA versions of the reduction, cast and one-bit kernels: plain functions of device
// pointers and counts beside the CPU ones, with the same element arithmetic
// (kernels/elementwise.h). `stream` is a cudaStream_t (null: the legacy default stream); every
// launch is queued on it and returns at once, except where a function says it synchronizes.
// A failed CUDA call throws CudaError naming the call and the device. Without CUDA built in,
// each throws CudaError saying so. 16-byte vector loads are used where every pointer is
// 16-byte aligned; other pointers take the scalar path.
//
// The kernels' bodies are kernels/reduce_functors.h and kernels/onebit_functors.h; the sim
// device runs the same bodies on the host (kernels/host_grid.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/types.h"
#include "kernels/onebit.h"

namespace pyring {

// acc[i] = op(widen(a[i]), b[i]) (as reduce_accumulate).
void cuda_reduce_accumulate(DType dtype, ReduceOp op, const void* a, const void* b, void* acc,
                            size_t n, void* stream);

// out[i] = narrow(finish(op(widen(a[i]), b[i]))) (as reduce_finish).
void cuda_reduce_finish(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t n,
                        int world, void* stream);

// out[i] = narrow(finish(acc[i])) (as finish_wide): avg divides by world.
void cuda_finish_wide(DType dtype, ReduceOp op, const void* acc, void* out, size_t n, int world,
                      void* stream);

// out[i] = in[i] converted between float32 and float16/bfloat16 (the wire formats' casts),
// rounding to nearest even. Other pairs throw InvalidArgument.
void cuda_cast(DType from, DType to, const void* in, void* out, size_t n, void* stream);

// The bytes of device workspace cuda_onebit_encode needs.
size_t cuda_onebit_workspace_bytes();

// onebit_encode_deferred on the device, with a kept residual (device memory; null: none) whose
// last scale is `pending`, and no mask cache: the header never says kMaskCached and its
// mask_hash is 0. `workspace` holds cuda_onebit_workspace_bytes(). Synchronizes `stream` to
// read the header back, and returns the bytes written, with the header in *header (its scale
// is the residual's pending scale from now on).
size_t cuda_onebit_encode(const float* in, uint16_t* residual, float pending, size_t n,
                          uint8_t* out, void* workspace, OnebitHeader* header, void* stream);

// onebit_decode on the device of a segment whose header the caller holds (as returned by
// cuda_onebit_encode, or read with the payload): throws CommError for a count other than n or
// a kMaskCached header (device segments never use the mask caches).
void cuda_onebit_decode(const OnebitHeader& header, const uint8_t* encoded, size_t n, float alpha,
                        bool accumulate, float* out, void* stream);

}  // namespace pyring
