// Shared declarations of the pyring._C binding files, one file per area.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>

namespace pyring::bindings {

namespace py = pybind11;

void register_errors(py::module_& m);
void register_transport(py::module_& m);
void register_communicator(py::module_& m);
void register_device(py::module_& m);

// The Python exception instance for a pyring error (GIL held).
py::object to_python_exception(std::exception_ptr error);

}  // namespace pyring::bindings
