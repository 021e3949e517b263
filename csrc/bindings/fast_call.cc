// The short call path of a synchronous in-place all_reduce of a CPU torch tensor.
//
// Communicator.fast_all_reduce(tensor_types, dtype_codes, strided, op_codes, inflight) returns a
// builtin `f(tensor, op, async_op, out, algo, wire) -> bool`. It reads the tensor's fields
// through the CPython API (pyring does not link torch) and runs the collective with the GIL
// released, without pybind11's argument conversion. It returns False, having sent nothing,
// unless async_op is False, out and algo are None, wire is 'fp32', `inflight` (the Python
// communicator's queue of async work) is empty, `op` is a key of `op_codes` and the tensor's
// exact type is in `tensor_types`, its dtype a key of `dtype_codes`, strided, on the CPU and
// contiguous: the caller then takes the general path, which validates and reports. Errors of
// the collective itself raise as on the general path.
#include <Python.h>

#include "bindings/bindings.h"
#include "collectives/collectives.h"
#include "collectives/selector.h"
#include "core/errors.h"

namespace pyring::bindings {

namespace {

struct FastContext {
  PyObject* core;  // strong reference: keeps `comm` alive
  Communicator* comm;
  PyObject* tensor_types;  // tuple of exact types
  PyObject* dtype_codes;   // dict: torch.dtype -> core dtype code
  PyObject* strided;       // torch.strided
  PyObject* op_codes;      // dict: op name -> core op code
  PyObject* inflight;      // the Python communicator's deque of queued async work
};

PyObject* g_dtype = nullptr;
PyObject* g_layout = nullptr;
PyObject* g_is_cpu = nullptr;
PyObject* g_is_contiguous = nullptr;
PyObject* g_numel = nullptr;
PyObject* g_data_ptr = nullptr;
PyObject* g_fp32 = nullptr;

constexpr const char* kCapsuleName = "pyring.FastContext";

void free_context(FastContext* ctx) {
  Py_XDECREF(ctx->core);
  Py_XDECREF(ctx->tensor_types);
  Py_XDECREF(ctx->dtype_codes);
  Py_XDECREF(ctx->strided);
  Py_XDECREF(ctx->op_codes);
  Py_XDECREF(ctx->inflight);
  delete ctx;
}

void destroy_context(PyObject* capsule) {
  auto* ctx = static_cast<FastContext*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (ctx) free_context(ctx);
}

// The int code `key` maps to in `dict`; -1 when absent or unhashable (the general path then
// reports what is wrong with it).
long code_in(PyObject* dict, PyObject* key) {
  PyObject* v = PyDict_GetItemWithError(dict, key);
  if (!v) {
    PyErr_Clear();
    return -1;
  }
  return PyLong_AsLong(v);
}

// obj.name is `expected` (1), is not (0), or raised (-1).
int attr_is(PyObject* obj, PyObject* name, PyObject* expected) {
  PyObject* v = PyObject_GetAttr(obj, name);
  if (!v) return -1;
  int same = v == expected;
  Py_DECREF(v);
  return same;
}

// The result of obj.name() (new reference), or nullptr with an error set.
PyObject* call0(PyObject* obj, PyObject* name) {
  PyObject* args[1] = {obj};
  return PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
}

bool is_tensor_type(const FastContext& ctx, PyObject* obj) {
  const Py_ssize_t n = PyTuple_GET_SIZE(ctx.tensor_types);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (reinterpret_cast<PyObject*>(Py_TYPE(obj)) == PyTuple_GET_ITEM(ctx.tensor_types, i)) {
      return true;
    }
  }
  return false;
}

PyObject* fast_all_reduce(PyObject* capsule, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError,
                    "fast all_reduce takes (tensor, op, async_op, out, algo, wire)");
    return nullptr;
  }
  auto* ctx = static_cast<FastContext*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (!ctx) return nullptr;
  PyObject* t = args[0];
  if (args[2] != Py_False || args[3] != Py_None || args[4] != Py_None) Py_RETURN_FALSE;
  if (args[5] != g_fp32 &&
      !(PyUnicode_CheckExact(args[5]) && PyUnicode_CompareWithASCIIString(args[5], "fp32") == 0)) {
    Py_RETURN_FALSE;
  }
  const Py_ssize_t queued = PyObject_Size(ctx->inflight);
  if (queued < 0) return nullptr;
  if (queued > 0 || !is_tensor_type(*ctx, t)) Py_RETURN_FALSE;
  const long op = code_in(ctx->op_codes, args[1]);
  if (op < 0) Py_RETURN_FALSE;
  PyObject* dt = PyObject_GetAttr(t, g_dtype);
  if (!dt) return nullptr;
  const long dtype = code_in(ctx->dtype_codes, dt);
  Py_DECREF(dt);
  if (dtype < 0) Py_RETURN_FALSE;
  int ok = attr_is(t, g_layout, ctx->strided);
  if (ok > 0) ok = attr_is(t, g_is_cpu, Py_True);
  if (ok > 0) {
    PyObject* c = call0(t, g_is_contiguous);
    if (!c) return nullptr;
    ok = c == Py_True;
    Py_DECREF(c);
  }
  if (ok < 0) return nullptr;
  if (ok == 0) Py_RETURN_FALSE;
  PyObject* n = call0(t, g_numel);
  if (!n) return nullptr;
  const size_t count = PyLong_AsSize_t(n);
  Py_DECREF(n);
  if (PyErr_Occurred()) return nullptr;
  PyObject* p = call0(t, g_data_ptr);
  if (!p) return nullptr;
  void* ptr = PyLong_AsVoidPtr(p);
  Py_DECREF(p);
  if (PyErr_Occurred()) return nullptr;

  Communicator& comm = *ctx->comm;
  const BufferView view{ptr, count, dtype_from_int(static_cast<int>(dtype))};
  const ReduceOp rop = op_from_int(static_cast<int>(op));
  const Algo algo = comm.options().algo;
  const CollectiveDesc desc = desc_of("all_reduce", view, static_cast<int>(op));
  std::exception_ptr error;
  Py_BEGIN_ALLOW_THREADS;
  try {
    comm.run_sync(
        desc, [&comm, &view, rop, algo](Deadline d) { allreduce(comm, view, view, rop, algo, d); });
  } catch (...) {
    error = std::current_exception();
  }
  Py_END_ALLOW_THREADS;
  if (error) {
    set_python_error(error);
    return nullptr;
  }
  Py_RETURN_TRUE;
}

PyMethodDef g_fast_def = {"fast_all_reduce", reinterpret_cast<PyCFunction>(fast_all_reduce),
                          METH_FASTCALL,
                          "all_reduce(tensor, op, async_op, out, algo, wire) on the short path"};

PyObject* intern(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (!o) throw py::error_already_set();
  return o;
}

}  // namespace

void register_fast_call(CommunicatorClass& cls) {
  g_dtype = intern("dtype");
  g_layout = intern("layout");
  g_is_cpu = intern("is_cpu");
  g_is_contiguous = intern("is_contiguous");
  g_numel = intern("numel");
  g_data_ptr = intern("data_ptr");
  g_fp32 = intern("fp32");
  cls.def(
      "fast_all_reduce",
      [](py::object self, py::tuple tensor_types, py::dict dtype_codes, py::object strided,
         py::dict op_codes, py::object inflight) {
        auto* ctx = new FastContext{self.ptr(),         &self.cast<Communicator&>(),
                                    tensor_types.ptr(), dtype_codes.ptr(),
                                    strided.ptr(),      op_codes.ptr(),
                                    inflight.ptr()};
        for (PyObject* o : {ctx->core, ctx->tensor_types, ctx->dtype_codes, ctx->strided,
                            ctx->op_codes, ctx->inflight}) {
          Py_INCREF(o);
        }
        PyObject* capsule = PyCapsule_New(ctx, kCapsuleName, destroy_context);
        if (!capsule) {
          free_context(ctx);
          throw py::error_already_set();
        }
        PyObject* fn = PyCFunction_New(&g_fast_def, capsule);
        Py_DECREF(capsule);
        if (!fn) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(fn);
      },
      py::arg("tensor_types"), py::arg("dtype_codes"), py::arg("strided"), py::arg("op_codes"),
      py::arg("inflight"),
      "A builtin f(tensor, op, async_op, out, algo, wire) -> bool: the short path of a "
      "synchronous in-place all_reduce (csrc/bindings/fast_call.cc); False means 'not "
      "handled, nothing sent'.");
}

}  // namespace pyring::bindings
