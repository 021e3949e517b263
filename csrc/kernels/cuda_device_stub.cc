// Device queries when the extension is built without CUDA.
#ifndef PYRING_WITH_CUDA

#include "core/errors.h"
#include "kernels/cuda_device.h"

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

}  // namespace pyring

#endif
