// The wire casts on host memory: float32 <-> float16/bfloat16, rounding to nearest even, with
// the same element arithmetic as cuda_cast (kernels/half.h).
#pragma once

#include <cstddef>

#include "core/types.h"

namespace pyring {

// Whether from -> to is a wire cast (float32 <-> float16/bfloat16).
bool is_wire_cast(DType from, DType to);
// Throws InvalidArgument naming `fn` and the pair unless is_wire_cast: checked before any
// device is asked for, so a build without CUDA names the bad pair too.
void check_wire_cast(const char* fn, DType from, DType to);

// out[i] = in[i] converted from `from` to `to`. Other pairs throw InvalidArgument.
void wire_cast(DType from, DType to, const void* in, void* out, size_t n);

// wire_cast as cuda_cast computes it: its body run on the host over an emulated grid
// (kernels/host_grid.cc), for the sim device.
void grid_cast(DType from, DType to, const void* in, void* out, size_t n);

}  // namespace pyring
