// The CUDA kernels, for tests and micro-benchmarks: addresses are device pointers whose owners
// (torch CUDA tensors, CuPy arrays) the caller keeps alive; `stream` is a cudaStream_t as an
// integer (torch's stream.cuda_stream; 0: the legacy default stream). The GIL is released.
#include "bindings/bindings.h"
#include "kernels/cuda_kernels.h"

namespace pyring::bindings {

namespace {
void* ptr(uintptr_t p) {
  return reinterpret_cast<void*>(p);
}
}  // namespace

void register_cuda(py::module_& m) {
  m.def(
      "cuda_reduce_accumulate",
      [](int dtype, int op, uintptr_t a, uintptr_t b, uintptr_t acc, size_t n, uintptr_t stream) {
        const DType t = dtype_from_int(dtype);
        const ReduceOp o = op_from_int(op);
        py::gil_scoped_release nogil;
        cuda_reduce_accumulate(t, o, ptr(a), ptr(b), ptr(acc), n, ptr(stream));
      },
      py::arg("dtype"), py::arg("op"), py::arg("a"), py::arg("b"), py::arg("acc"), py::arg("n"),
      py::arg("stream") = 0, "acc = op(widen(a), b) on the device, queued on stream.");
  m.def(
      "cuda_reduce_finish",
      [](int dtype, int op, uintptr_t a, uintptr_t b, uintptr_t out, size_t n, int world,
         uintptr_t stream) {
        const DType t = dtype_from_int(dtype);
        const ReduceOp o = op_from_int(op);
        py::gil_scoped_release nogil;
        cuda_reduce_finish(t, o, ptr(a), ptr(b), ptr(out), n, world, ptr(stream));
      },
      py::arg("dtype"), py::arg("op"), py::arg("a"), py::arg("b"), py::arg("out"), py::arg("n"),
      py::arg("world"), py::arg("stream") = 0,
      "out = narrow(finish(op(widen(a), b))) on the device, queued on stream.");
  m.def(
      "cuda_cast",
      [](int from, int to, uintptr_t in, uintptr_t out, size_t n, uintptr_t stream) {
        const DType f = dtype_from_int(from), t = dtype_from_int(to);
        py::gil_scoped_release nogil;
        cuda_cast(f, t, ptr(in), ptr(out), n, ptr(stream));
      },
      py::arg("from_dtype"), py::arg("to_dtype"), py::arg("inp"), py::arg("out"), py::arg("n"),
      py::arg("stream") = 0, "A wire cast (float32 <-> float16/bfloat16) on the device.");
  m.def("cuda_onebit_workspace_bytes", &cuda_onebit_workspace_bytes);
  m.def(
      "cuda_onebit_encode",
      [](uintptr_t in, uintptr_t residual, float pending, size_t n, uintptr_t out,
         uintptr_t workspace, uintptr_t stream) {
        OnebitHeader h{};
        size_t bytes;
        {
          py::gil_scoped_release nogil;
          bytes = cuda_onebit_encode(
              static_cast<const float*>(ptr(in)), static_cast<uint16_t*>(ptr(residual)), pending, n,
              static_cast<uint8_t*>(ptr(out)), ptr(workspace), &h, ptr(stream));
        }
        return py::make_tuple(bytes, h.scale, h.zeros, h.count);
      },
      py::arg("inp"), py::arg("residual"), py::arg("pending"), py::arg("n"), py::arg("out"),
      py::arg("workspace"), py::arg("stream") = 0,
      "Encodes on the device with a kept (bfloat16) residual, 0: none, whose last scale is "
      "pending (synchronizes stream); returns (bytes, scale, zeros, count).");
  m.def(
      "cuda_onebit_decode",
      [](float scale, uint32_t zeros, uint32_t count, uintptr_t encoded, size_t n, float alpha,
         bool accumulate, uintptr_t out, uintptr_t stream) {
        const OnebitHeader h{scale, zeros, 0u, count};
        py::gil_scoped_release nogil;
        cuda_onebit_decode(h, static_cast<const uint8_t*>(ptr(encoded)), n, alpha, accumulate,
                           static_cast<float*>(ptr(out)), ptr(stream));
      },
      py::arg("scale"), py::arg("zeros"), py::arg("count"), py::arg("encoded"), py::arg("n"),
      py::arg("alpha"), py::arg("accumulate"), py::arg("out"), py::arg("stream") = 0,
      "Decodes on the device a segment with the given header fields, queued on stream.");
}

}  // namespace pyring::bindings
