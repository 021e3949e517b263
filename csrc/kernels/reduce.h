// Element-wise reduction kernels on host memory.
//
// `a` and `out` hold the caller's dtype; `b` and `acc` hold accum_dtype(dtype) (float32 for
// float16/bfloat16, the dtype itself otherwise). Avg accumulates as a sum and divides once in
// reduce_finish; integer avg truncates toward zero. Integer sums wrap. Buffers may alias only
// element-for-element (a == acc, a == out, b == acc).
#pragma once

#include <cstddef>

#include "core/types.h"

namespace pyring {

// acc[i] = op(widen(a[i]), b[i])
void reduce_accumulate(DType dtype, ReduceOp op, const void* a, const void* b, void* acc, size_t n);

// out[i] = narrow(finish(op(widen(a[i]), b[i])))
void reduce_finish(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t n,
                   int world);

// out[i] = narrow(finish(acc[i])): avg divides by world; acc holds accum_dtype(dtype).
void finish_wide(DType dtype, ReduceOp op, const void* acc, void* out, size_t n, int world);

// acc[i] = widen(a[i])
void widen(DType dtype, const void* a, void* acc, size_t n);

// out[i] = finish(a[i]) for a world of one rank: a copy, and avg divides by 1.
void finish_single(DType dtype, const void* a, void* out, size_t n);

// reduce_accumulate, reduce_finish and finish_wide as the CUDA kernels compute them
// (cuda_reduce_accumulate, ...): their bodies run on the host over an emulated grid
// (kernels/host_grid.cc), for the sim device.
void grid_reduce_accumulate(DType dtype, ReduceOp op, const void* a, const void* b, void* acc,
                            size_t n);
void grid_reduce_finish(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t n,
                        int world);
void grid_finish_wide(DType dtype, ReduceOp op, const void* acc, void* out, size_t n, int world);

}  // namespace pyring
