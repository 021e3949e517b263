// The one-bit kernels, for tests and micro-benchmarks: addresses are raw pointers whose
// owners (numpy arrays or tensors) the caller keeps alive; the GIL is released.
#include "bindings/bindings.h"
#include "kernels/onebit.h"

namespace pyring::bindings {

void register_kernels(py::module_& m) {
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
  m.def("onebit_cache_bytes", &onebit_cache_bytes, py::arg("n"),
        "The bytes of one stream's mask cache for segments of n values (zeroed before use).");
}

}  // namespace pyring::bindings
