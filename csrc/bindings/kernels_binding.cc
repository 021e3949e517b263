// The one-bit kernels, for tests and micro-benchmarks: addresses are raw pointers whose
// owners (numpy arrays or tensors) the caller keeps alive; the GIL is released.
#include <pybind11/stl.h>

#include <string>

#include "bindings/bindings.h"
#include "bindings/device_call.h"
#include "core/errors.h"
#include "kernels/dispatch.h"
#include "kernels/onebit.h"

namespace pyring::bindings {

namespace {

// Runs kernel `name` of kernels/dispatch.h at `device` ((kind, index, stream); None: the
// host): queued on the stream for a device. b is unused by finish_wide, widen, finish_single
// and cast; `to` is cast's target dtype.
void run_kernel(const std::string& name, const py::object& device, int dtype, int op, uintptr_t a,
                uintptr_t b, uintptr_t out, size_t n, int world, int to) {
  const DeviceArgs d = device_args(device);
  const KernelSite site{d.device, d.stream};
  const DType t = dtype_from_int(dtype);
  const ReduceOp o = op_from_int(op);
  const auto* pa = reinterpret_cast<const void*>(a);
  const auto* pb = reinterpret_cast<const void*>(b);
  auto* po = reinterpret_cast<void*>(out);
  py::gil_scoped_release nogil;
  if (name == "accumulate") return kern::accumulate(site, t, o, pa, pb, po, n);
  if (name == "finish") return kern::finish(site, t, o, pa, pb, po, n, world);
  if (name == "finish_wide") return kern::finish_wide(site, t, o, pa, po, n, world);
  if (name == "widen") return kern::widen(site, t, pa, po, n);
  if (name == "finish_single") return kern::finish_single(site, t, pa, po, n);
  if (name == "cast") return kern::cast(site, t, dtype_from_int(to), pa, po, n);
  PYRING_THROW(InvalidArgument, "unknown kernel '", name,
               "' (valid: accumulate, finish, finish_wide, widen, finish_single, cast)");
}

}  // namespace

void register_kernels(py::module_& m) {
  m.def("run_kernel", &run_kernel, py::arg("name"), py::arg("device"), py::arg("dtype"),
        py::arg("op"), py::arg("a"), py::arg("b"), py::arg("out"), py::arg("n"),
        py::arg("world") = 1, py::arg("to") = 0,
        "Runs a kernel of the collectives' kernel interface where `device` says, for tests.");
  m.def("onebit_max_bytes", &onebit_max_bytes, py::arg("n"),
        "The most bytes one segment of n float32 values takes on the one-bit wire.");
  m.def(
      "onebit_encode",
      [](uintptr_t in, uintptr_t residual, size_t n, uintptr_t out, uintptr_t cache) {
        py::gil_scoped_release nogil;
        return onebit_encode(reinterpret_cast<const float*>(in), reinterpret_cast<float*>(residual),
                             n, reinterpret_cast<uint8_t*>(out), reinterpret_cast<uint8_t*>(cache));
      },
      py::arg("inp"), py::arg("residual"), py::arg("n"), py::arg("out"), py::arg("cache") = 0,
      "Encodes n float32 at inp (+ residual, 0: none) into out, with the encoder's mask cache "
      "(0: none); returns the bytes written.");
  m.def(
      "onebit_encode_deferred",
      [](uintptr_t in, uintptr_t residual, uintptr_t pending, size_t n, uintptr_t out,
         uintptr_t cache) {
        PYRING_CHECK_ARG(residual != 0 && pending != 0,
                         "onebit_encode_deferred: residual and pending are required");
        py::gil_scoped_release nogil;
        return onebit_encode_deferred(
            reinterpret_cast<const float*>(in), reinterpret_cast<uint16_t*>(residual),
            reinterpret_cast<float*>(pending), n, reinterpret_cast<uint8_t*>(out),
            reinterpret_cast<uint8_t*>(cache));
      },
      py::arg("inp"), py::arg("residual"), py::arg("pending"), py::arg("n"), py::arg("out"),
      py::arg("cache") = 0,
      "onebit_encode with a kept residual (n bfloat16 bits as uint16): it holds the last value "
      "encoded, with that encoding's scale in the float32 at pending (0: settled); returns the "
      "bytes written.");
  m.def(
      "onebit_settled_copy",
      [](uintptr_t residual, size_t n, float pending, uintptr_t out) {
        py::gil_scoped_release nogil;
        onebit_settled_copy(reinterpret_cast<const uint16_t*>(residual), n, pending,
                            reinterpret_cast<float*>(out));
      },
      py::arg("residual"), py::arg("n"), py::arg("pending"), py::arg("out"),
      "The float32 residuals a kept residual with scale pending stands for, into out.");
  m.def(
      "onebit_decode",
      [](uintptr_t encoded, size_t n, float alpha, bool accumulate, uintptr_t out,
         uintptr_t cache) {
        py::gil_scoped_release nogil;
        onebit_decode(reinterpret_cast<const uint8_t*>(encoded), n, alpha, accumulate,
                      reinterpret_cast<float*>(out), reinterpret_cast<uint8_t*>(cache));
      },
      py::arg("encoded"), py::arg("n"), py::arg("alpha"), py::arg("accumulate"), py::arg("out"),
      py::arg("cache") = 0,
      "out = alpha * decode (or += with accumulate), with the decoder's mask cache (0: none).");
  m.def(
      "onebit_reduce_encode",
      [](uintptr_t own, int divisor, const std::vector<uintptr_t>& copies,
         const std::vector<uintptr_t>& caches, size_t n, uintptr_t residual, uintptr_t pending,
         uintptr_t out, uintptr_t cache) {
        PYRING_CHECK_ARG(caches.size() == copies.size(), "onebit_reduce_encode: ", copies.size(),
                         " copies but ", caches.size(), " caches");
        PYRING_CHECK_ARG(residual != 0 && pending != 0,
                         "onebit_reduce_encode: residual and pending are required");
        std::vector<const uint8_t*> c(copies.size());
        std::vector<uint8_t*> k(caches.size());
        for (size_t i = 0; i < c.size(); ++i) {
          c[i] = reinterpret_cast<const uint8_t*>(copies[i]);
          k[i] = reinterpret_cast<uint8_t*>(caches[i]);
        }
        py::gil_scoped_release nogil;
        return onebit_reduce_encode(
            reinterpret_cast<const float*>(own), divisor, c.data(), k.data(), c.size(), n,
            reinterpret_cast<uint16_t*>(residual), reinterpret_cast<float*>(pending),
            reinterpret_cast<uint8_t*>(out), reinterpret_cast<uint8_t*>(cache));
      },
      py::arg("own"), py::arg("divisor"), py::arg("copies"), py::arg("caches"), py::arg("n"),
      py::arg("residual"), py::arg("pending"), py::arg("out"), py::arg("cache") = 0,
      "The owner's step: own / divisor plus each encoded copy decoded / divisor (copy k with "
      "decoder cache caches[k], 0: none), encoded with the kept residual; returns the bytes "
      "written.");
  m.def("onebit_cache_bytes", &onebit_cache_bytes, py::arg("n"),
        "The bytes of one stream's mask cache for segments of n values (zeroed before use).");
}

}  // namespace pyring::bindings
