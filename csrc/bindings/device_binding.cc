#include "bindings/bindings.h"
#include "kernels/cuda_device.h"

namespace pyring::bindings {

void register_device(py::module_& m) {
  m.def("built_with_cuda", &built_with_cuda, "True when the CUDA kernels were compiled in.");
  m.def("cuda_device_count", &cuda_device_count,
        "Usable CUDA devices; 0 without CUDA, a driver or a device.");
  m.def("cuda_device_name", &cuda_device_name, py::arg("index"));
}

}  // namespace pyring::bindings
