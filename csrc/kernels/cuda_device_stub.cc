// Device queries and kernels when the extension is built without CUDA: the queries find no
// device, the kernels throw CudaError.
#ifndef PYRING_WITH_CUDA

#include "core/errors.h"
#include "kernels/cuda_device.h"
#include "kernels/cuda_kernels.h"
#include "kernels/wire_cast.h"

namespace pyring {

bool built_with_cuda() {
  return false;
}
int cuda_device_count() {
  return 0;
}
std::string cuda_device_name(int index) {
  PYRING_THROW(InvalidArgument, "CUDA device index ", index,
               " out of range: pyring was built without CUDA");
}

namespace {
[[noreturn]] void no_cuda(const char* fn) {
  PYRING_THROW(CudaError, fn, ": pyring was built without CUDA (no nvcc at build time)");
}
}  // namespace

void cuda_reduce_accumulate(DType, ReduceOp, const void*, const void*, void*, size_t, void*) {
  no_cuda("cuda_reduce_accumulate");
}
void cuda_reduce_finish(DType, ReduceOp, const void*, const void*, void*, size_t, int, void*) {
  no_cuda("cuda_reduce_finish");
}
void cuda_finish_wide(DType, ReduceOp, const void*, void*, size_t, int, void*) {
  no_cuda("cuda_finish_wide");
}
void cuda_cast(DType from, DType to, const void*, void*, size_t, void*) {
  check_wire_cast("cuda_cast", from, to);
  no_cuda("cuda_cast");
}
size_t cuda_onebit_workspace_bytes() {
  no_cuda("cuda_onebit_workspace_bytes");
}
size_t cuda_onebit_encode(const float*, uint16_t*, float, size_t, uint8_t*, void*, OnebitHeader*,
                          void*) {
  no_cuda("cuda_onebit_encode");
}
void cuda_onebit_decode(const OnebitHeader&, const uint8_t*, size_t, float, bool, float*, void*) {
  no_cuda("cuda_onebit_decode");
}

}  // namespace pyring

#endif
