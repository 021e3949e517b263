// The choice between the host kernels' AVX2 forms and their SSE2 and scalar forms, which give
// the same bits (tests check each pair).
#pragma once

namespace pyring {

// The CPU runs AVX2 (and pyring was built for x86-64), and PYRING_SIMD is not `sse`. Read once.
bool host_avx2();

}  // namespace pyring
