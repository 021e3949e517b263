#include "kernels/simd.h"

#include <cstdlib>
#include <cstring>

namespace pyring {

bool host_avx2() {
#if defined(__x86_64__)
  static const bool yes = [] {
    const char* simd = std::getenv("PYRING_SIMD");
    return !(simd && std::strcmp(simd, "sse") == 0) && __builtin_cpu_supports("avx2");
  }();
  return yes;
#else
  return false;
#endif
}

}  // namespace pyring
