// AVX2 versions of the one-bit block sweeps of kernels/onebit.cc, chosen at run time where the
// CPU has AVX2. They give the same bytes and floats bit for bit: the same additions in the
// same lane order (eight lanes are the SSE path's two registers side by side) and no fused
// multiply-add. Arguments as onebit.cc's sum_block, pack_block and decode_span;
// decode_whole decodes only the whole bytes of signs (8 values each) and returns how many.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pyring::onebit_avx2 {

// The CPU runs AVX2 (and pyring was built for x86-64), and PYRING_ONEBIT_SIMD is not `sse`.
bool available();
void sum_block(const float* in, const float* residual, size_t count, double& sumsq, size_t& zeros);
void pack_block(const float* in, const float* add, float* residual, size_t count, float scale,
                bool zeros, uint8_t* signs, uint8_t* mask);
size_t decode_whole(const uint8_t* signs, const uint8_t* mask, size_t count, float pos,
                    bool accumulate, float* out);

}  // namespace pyring::onebit_avx2
