// CUDA device queries. Safe to call on machines without a GPU or a driver.
#pragma once

#include <string>

namespace pyring {

// True when the extension was compiled with the CUDA kernels.
bool built_with_cuda();
// The number of usable CUDA devices; 0 when CUDA is not built, no driver or no device exists.
int cuda_device_count();
// "name (sm_XY, N MiB)" for device `index`; throws InvalidArgument for a bad index.
std::string cuda_device_name(int index);

}  // namespace pyring
