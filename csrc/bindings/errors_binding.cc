// Maps the C++ error types to Python: Error -> pyring.Error (a subclass of
// torch.distributed.DistBackendError where torch is importable), CommError -> pyring.CommError,
// TimeoutError -> pyring.CommTimeout (also a builtin TimeoutError), CudaError ->
// pyring.CudaError, InvalidArgument -> ValueError, TypeMismatch -> TypeError.
#include "bindings/bindings.h"
#include "core/errors.h"

namespace pyring::bindings {

namespace {
PyObject* g_error = nullptr;
PyObject* g_comm_error = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_cuda_error = nullptr;

// Calls `set(type, message)` for the Python type matching the C++ exception in flight.
template <class F>
void classify(std::exception_ptr p, F&& set) {
  try {
    std::rethrow_exception(p);
  } catch (const TimeoutError& e) {
    set(g_timeout, e.what());
  } catch (const CommError& e) {
    set(g_comm_error, e.what());
  } catch (const CudaError& e) {
    set(g_cuda_error, e.what());
  } catch (const InvalidArgument& e) {
    set(PyExc_ValueError, e.what());
  } catch (const TypeMismatch& e) {
    set(PyExc_TypeError, e.what());
  } catch (const Error& e) {
    set(g_error, e.what());
  } catch (const py::error_already_set& e) {
    set(g_error, e.what());
  } catch (const std::exception& e) {
    set(g_error, e.what());
  }
}
}  // namespace

py::object to_python_exception(std::exception_ptr error) {
  py::object result = py::none();
  classify(error, [&](PyObject* type, const char* msg) {
    result = py::reinterpret_borrow<py::object>(type)(py::str(msg));
  });
  return result;
}

void set_python_error(std::exception_ptr error) {
  classify(error, [](PyObject* type, const char* msg) { PyErr_SetString(type, msg); });
}

namespace {

// torch.distributed.DistBackendError where torch is importable (what torch raises for NCCL's
// and gloo's failures, and what its elastic agent and users catch), else Exception. A new
// reference.
PyObject* error_base() {
  try {
    py::object base = py::module_::import("torch.distributed").attr("DistBackendError");
    if (PyType_Check(base.ptr()) &&
        PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(base.ptr()),
                         reinterpret_cast<PyTypeObject*>(PyExc_Exception))) {
      return base.release().ptr();
    }
  } catch (const py::error_already_set&) {  // no torch, or one without distributed
  }
  Py_INCREF(PyExc_Exception);
  return PyExc_Exception;
}

}  // namespace

void register_errors(py::module_& m) {
  PyObject* base = error_base();
  g_error = PyErr_NewExceptionWithDoc(
      "pyring._C.Error",
      "Base of pyring's errors; a torch.distributed.DistBackendError where torch is installed.",
      base, nullptr);
  Py_DECREF(base);
  g_comm_error = PyErr_NewExceptionWithDoc(
      "pyring._C.CommError", "A link failed, or a peer died or gave up.", g_error, nullptr);
  PyObject* bases = PyTuple_Pack(2, g_comm_error, PyExc_TimeoutError);
  g_timeout = PyErr_NewExceptionWithDoc(
      "pyring._C.CommTimeout", "A collective or rendezvous passed its deadline.", bases, nullptr);
  Py_DECREF(bases);
  g_cuda_error = PyErr_NewExceptionWithDoc(
      "pyring._C.CudaError", "A CUDA call failed; the message names the call and the device.",
      g_error, nullptr);
  m.add_object("Error", py::handle(g_error));
  m.add_object("CudaError", py::handle(g_cuda_error));
  m.add_object("CommError", py::handle(g_comm_error));
  m.add_object("CommTimeout", py::handle(g_timeout));
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const Error&) {
      set_python_error(p);
    }
  });
}

}  // namespace pyring::bindings
