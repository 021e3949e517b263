// The wire casts on host memory: float32 <-> float16/bfloat16, rounding to nearest even, with
// the same element arithmetic as cuda_cast (kernels/half.h).
#pragma once

#include <cstddef>

#include "core/types.h"

namespace pyring {

// out[i] = in[i] converted from `from` to `to`. Other pairs throw InvalidArgument.
void wire_cast(DType from, DType to, const void* in, void* out, size_t n);

}  // namespace pyring
