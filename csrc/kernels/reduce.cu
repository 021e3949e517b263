// CUDA reductions and casts (kernels/cuda_kernels.h): the kernel bodies of
// kernels/reduce_functors.h, launched on the caller's stream.
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/cuda_kernels.h"
#include "kernels/reduce_functors.h"

namespace pyring {

namespace {

template <int N, class F>
__global__ void elementwise_kernel(F f, size_t n, bool vectors) {
  elementwise_thread<N>(f, n, vectors, GridPos::here());
}

// The launcher of reduce_functors.h: an elementwise_kernel queued on `stream`.
struct CudaLaunch {
  void* stream;
  template <class F>
  void operator()(const F& f, size_t n, bool vectors, int blocks) const {
    elementwise_kernel<F::N, F>
        <<<blocks, kElementwiseThreads, 0, static_cast<cudaStream_t>(stream)>>>(f, n, vectors);
    PYRING_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace

void cuda_reduce_accumulate(DType dtype, ReduceOp op, const void* a, const void* b, void* acc,
                            size_t n, void* stream) {
  reduce_accumulate_on(CudaLaunch{stream}, dtype, op, a, b, acc, n);
}

void cuda_reduce_finish(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t n,
                        int world, void* stream) {
  reduce_finish_on(CudaLaunch{stream}, dtype, op, a, b, out, n, world);
}

void cuda_finish_wide(DType dtype, ReduceOp op, const void* acc, void* out, size_t n, int world,
                      void* stream) {
  finish_wide_on(CudaLaunch{stream}, dtype, op, acc, out, n, world);
}

void cuda_cast(DType from, DType to, const void* in, void* out, size_t n, void* stream) {
  cast_on(CudaLaunch{stream}, "cuda_cast", from, to, in, out, n);
}

}  // namespace pyring
