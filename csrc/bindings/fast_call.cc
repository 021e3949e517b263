// The short call path of a synchronous in-place all_reduce of a CPU torch tensor.
//
// Communicator.fast_all_reduce(tensor_types, dtype_codes, strided, op_codes, inflight, general)
// returns a builtin with the signature of pyring.Communicator.all_reduce,
// `all_reduce(tensor, op='sum', async_op=False, out=None, algo=None, wire='fp32', state=None)`,
// which the Python communicator installs as its instance's all_reduce. It reads the tensor's
// fields through the CPython API (pyring does not link torch) and runs the collective with the
// GIL released, without pybind11's argument conversion or a Python frame. It runs the call
// itself only when async_op is False, out, algo and state are None, wire is 'fp32', `inflight`
// (the Python communicator's queue of async work) is empty, `op` is a key of `op_codes`, the
// tensor's exact type is in `tensor_types`, its dtype a key of `dtype_codes`, and it is
// strided, on the CPU and contiguous. Every other call, including one with arguments that do
// not bind, is passed unchanged to `general()`: `general` returns the general path's callable
// (the Python method, which validates and reports), or None once that is gone. Errors of the
// collective itself raise as on the general path.
#include <Python.h>

#include "bindings/bindings.h"
#include "collectives/device_launch.h"
#include "collectives/selector.h"
#include "core/errors.h"

namespace pyring::bindings {

namespace {

// A tensor property read, or method called, without the generic attribute lookup: through the
// getset descriptor's getter, or the method descriptor, that every type in tensor_types
// resolves the name to; through PyObject_GetAttr / PyObject_VectorcallMethod where they differ
// or the attribute is of another kind. A getset descriptor takes precedence over the instance
// dict in Python too; a method is torch's own even where an instance attribute shadows it.
struct Attr {
  PyObject* name = nullptr;    // interned, borrowed
  PyObject* method = nullptr;  // strong reference to a method descriptor, or null
  getter get = nullptr;
  void* closure = nullptr;

  // obj.name and obj.name(): new references, or null with an error set.
  PyObject* read(PyObject* obj) const {
    return get ? get(obj, closure) : PyObject_GetAttr(obj, name);
  }
  PyObject* call(PyObject* obj) const {
    if (method) return PyObject_Vectorcall(method, &obj, 1, nullptr);
    PyObject* args[1] = {obj};
    return PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  }
};

enum AttrIndex { kDtype, kLayout, kIsCpu, kIsContiguous, kNumel, kDataPtr, kNumAttrs };
constexpr const char* kAttrNames[kNumAttrs] = {"dtype",         "layout", "is_cpu",
                                               "is_contiguous", "numel",  "data_ptr"};

// all_reduce's parameters, in order; kParamNames are interned at registration.
enum Param { kTensor, kOp, kAsyncOp, kOut, kAlgo, kWire, kState, kNumParams };
constexpr const char* kParamNameText[kNumParams] = {"tensor", "op",   "async_op", "out",
                                                    "algo",   "wire", "state"};
PyObject* g_param_names[kNumParams] = {};
PyObject* g_attr_names[kNumAttrs] = {};
PyObject* g_sum = nullptr;
PyObject* g_fp32 = nullptr;

struct FastContext {
  PyObject* core;  // strong reference: keeps `comm` alive
  Communicator* comm;
  PyObject* tensor_types;  // tuple of exact types
  PyObject* dtype_codes;   // dict: torch.dtype -> core dtype code
  PyObject* strided;       // torch.strided
  PyObject* op_codes;      // dict: op name -> core op code
  PyObject* inflight;      // the Python communicator's deque of queued async work
  PyObject* general;       // general() -> the general path's callable, or None
  Attr attrs[kNumAttrs];
};

constexpr const char* kCapsuleName = "pyring.FastContext";

void free_context(FastContext* ctx) {
  for (PyObject* o : {ctx->core, ctx->tensor_types, ctx->dtype_codes, ctx->strided, ctx->op_codes,
                      ctx->inflight, ctx->general}) {
    Py_XDECREF(o);
  }
  for (Attr& a : ctx->attrs) Py_XDECREF(a.method);
  delete ctx;
}

void destroy_context(PyObject* capsule) {
  auto* ctx = static_cast<FastContext*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (ctx) free_context(ctx);
}

// Resolves `a` against every type in `types` (see Attr); no error is left set.
void resolve(Attr& a, PyObject* types) {
  PyObject* common = nullptr;
  const Py_ssize_t n = PyTuple_GET_SIZE(types);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* d = PyObject_GetAttr(PyTuple_GET_ITEM(types, i), a.name);
    if (!d) {
      PyErr_Clear();
      Py_XDECREF(common);
      return;
    }
    if (common && d != common) {
      Py_DECREF(d);
      Py_DECREF(common);
      return;
    }
    Py_XDECREF(common);
    common = d;
  }
  if (!common) return;
  if (Py_IS_TYPE(common, &PyGetSetDescr_Type)) {
    PyGetSetDef* def = reinterpret_cast<PyGetSetDescrObject*>(common)->d_getset;
    a.get = def->get;
    a.closure = def->closure;
    Py_DECREF(common);
  } else if (Py_IS_TYPE(common, &PyMethodDescr_Type)) {
    a.method = common;
  } else {
    Py_DECREF(common);
  }
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

// The attribute read is `expected` (1), is not (0), or raised (-1).
int read_is(const Attr& a, PyObject* obj, PyObject* expected) {
  PyObject* v = a.read(obj);
  if (!v) return -1;
  int same = v == expected;
  Py_DECREF(v);
  return same;
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

// Binds the call's arguments to all_reduce's parameters (null where not given). False where
// they do not bind: too many, an unknown keyword or one given twice.
bool bind(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
          PyObject* (&vals)[kNumParams]) {
  if (nargs > kNumParams) return false;
  for (Py_ssize_t i = 0; i < nargs; ++i) vals[i] = args[i];
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    int p = 0;
    while (p < kNumParams && g_param_names[p] != key) ++p;
    if (p == kNumParams) {  // keywords built at run time are not interned
      p = 0;
      while (p < kNumParams && PyUnicode_Compare(g_param_names[p], key) != 0) ++p;
      if (PyErr_Occurred()) PyErr_Clear();
    }
    if (p == kNumParams || vals[p]) return false;
    vals[p] = args[nargs + k];
  }
  return true;
}

bool is_fp32(PyObject* wire) {
  return !wire || wire == g_fp32 ||
         (PyUnicode_CheckExact(wire) && PyUnicode_CompareWithASCIIString(wire, "fp32") == 0);
}

PyObject* general_path(const FastContext& ctx, PyObject* const* args, size_t nargsf,
                       PyObject* kwnames) {
  PyObject* fn = PyObject_CallNoArgs(ctx.general);
  if (!fn) return nullptr;
  if (fn == Py_None) {
    Py_DECREF(fn);
    PyErr_SetString(PyExc_ReferenceError,
                    "all_reduce: the pyring Communicator this method belonged to no longer "
                    "exists");
    return nullptr;
  }
  PyObject* result = PyObject_Vectorcall(fn, args, nargsf, kwnames);
  Py_DECREF(fn);
  return result;
}

// 1: the short path ran the call; 0: it declines (nothing sent); -1: an error is set.
int try_short_path(const FastContext& ctx, PyObject* const (&vals)[kNumParams]) {
  PyObject* t = vals[kTensor];
  if (!t || (vals[kAsyncOp] && vals[kAsyncOp] != Py_False)) return 0;
  for (Param p : {kOut, kAlgo, kState}) {
    if (vals[p] && vals[p] != Py_None) return 0;
  }
  if (!is_fp32(vals[kWire]) || !is_tensor_type(ctx, t)) return 0;
  const Py_ssize_t queued = PyObject_Size(ctx.inflight);
  if (queued != 0) return queued < 0 ? -1 : 0;
  const long op = code_in(ctx.op_codes, vals[kOp] ? vals[kOp] : g_sum);
  if (op < 0) return 0;
  PyObject* dt = ctx.attrs[kDtype].read(t);
  if (!dt) return -1;
  const long dtype = code_in(ctx.dtype_codes, dt);
  Py_DECREF(dt);
  if (dtype < 0) return 0;
  int ok = read_is(ctx.attrs[kLayout], t, ctx.strided);
  if (ok > 0) ok = read_is(ctx.attrs[kIsCpu], t, Py_True);
  if (ok > 0) {
    PyObject* c = ctx.attrs[kIsContiguous].call(t);
    if (!c) return -1;
    ok = c == Py_True;
    Py_DECREF(c);
  }
  if (ok <= 0) return ok;
  PyObject* n = ctx.attrs[kNumel].call(t);
  if (!n) return -1;
  const size_t count = PyLong_AsSize_t(n);
  Py_DECREF(n);
  if (PyErr_Occurred()) return -1;
  PyObject* p = ctx.attrs[kDataPtr].call(t);
  if (!p) return -1;
  void* ptr = PyLong_AsVoidPtr(p);
  Py_DECREF(p);
  if (PyErr_Occurred()) return -1;

  Communicator& comm = *ctx.comm;
  const BufferView view{ptr, count, dtype_from_int(static_cast<int>(dtype))};
  const ReduceOp rop = op_from_int(static_cast<int>(op));
  const Algo algo = comm.options().algo;
  const CollectiveDesc desc = desc_of("all_reduce", view, static_cast<int>(op));
  std::exception_ptr error;
  Py_BEGIN_ALLOW_THREADS;
  try {
    run_host_allreduce(comm, desc, view, rop, algo);
  } catch (...) {
    error = std::current_exception();
  }
  Py_END_ALLOW_THREADS;
  if (error) {
    set_python_error(error);
    return -1;
  }
  return 1;
}

PyObject* fast_all_reduce(PyObject* capsule, PyObject* const* args, Py_ssize_t nargs,
                          PyObject* kwnames) {
  auto* ctx = static_cast<FastContext*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (!ctx) return nullptr;
  PyObject* vals[kNumParams] = {};
  if (bind(args, nargs, kwnames, vals)) {
    const int ran = try_short_path(*ctx, vals);
    if (ran < 0) return nullptr;
    if (ran > 0) Py_RETURN_NONE;
  }
  return general_path(*ctx, args, static_cast<size_t>(nargs), kwnames);
}

PyMethodDef g_fast_def = {
    "all_reduce", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_all_reduce)),
    METH_FASTCALL | METH_KEYWORDS,
    "all_reduce($self, tensor, op='sum', async_op=False, out=None, algo=None, wire='fp32', "
    "state=None)\n--\n\n"
    "pyring.Communicator.all_reduce with its short path in C (csrc/bindings/fast_call.cc): a "
    "synchronous in-place fp32 all_reduce of a contiguous CPU tensor runs here; every other "
    "call goes to the Python method, which documents the arguments."};

PyObject* intern(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (!o) throw py::error_already_set();
  return o;
}

}  // namespace

void register_fast_call(CommunicatorClass& cls) {
  for (int p = 0; p < kNumParams; ++p) g_param_names[p] = intern(kParamNameText[p]);
  for (int i = 0; i < kNumAttrs; ++i) g_attr_names[i] = intern(kAttrNames[i]);
  g_sum = intern("sum");
  g_fp32 = intern("fp32");
  cls.def(
      "fast_all_reduce",
      [](py::object self, py::tuple tensor_types, py::dict dtype_codes, py::object strided,
         py::dict op_codes, py::object inflight, py::object general) {
        auto* ctx = new FastContext{self.ptr(),
                                    &self.cast<Communicator&>(),
                                    tensor_types.ptr(),
                                    dtype_codes.ptr(),
                                    strided.ptr(),
                                    op_codes.ptr(),
                                    inflight.ptr(),
                                    general.ptr(),
                                    {}};
        for (PyObject* o : {ctx->core, ctx->tensor_types, ctx->dtype_codes, ctx->strided,
                            ctx->op_codes, ctx->inflight, ctx->general}) {
          Py_INCREF(o);
        }
        for (int i = 0; i < kNumAttrs; ++i) {
          ctx->attrs[i].name = g_attr_names[i];
          resolve(ctx->attrs[i], ctx->tensor_types);
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
      py::arg("inflight"), py::arg("general"),
      "A builtin with Communicator.all_reduce's signature whose short path runs a synchronous "
      "in-place fp32 all_reduce of a contiguous CPU tensor in C; every other call goes "
      "unchanged to general() (csrc/bindings/fast_call.cc).");
}

}  // namespace pyring::bindings
