#include "bindings/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "pyring core: links, ring collectives and the progress engine";
  pyring::bindings::register_errors(m);
  pyring::bindings::register_device(m);
  pyring::bindings::register_transport(m);
  pyring::bindings::register_communicator(m);
  pyring::bindings::register_kernels(m);
  pyring::bindings::register_cuda(m);
  pyring::bindings::install_terminate_trace();
}
