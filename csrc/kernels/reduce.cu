// CUDA reductions and casts (kernels/cuda_kernels.h), on the element operations of
// kernels/elementwise.h.
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/cuda_kernels.h"
#include "kernels/elementwise.h"
#include "kernels/wire_cast.h"

namespace pyring {

namespace {

constexpr int kThreads = 256;

// N elements of T, loaded and stored as one access: 16 bytes, or more for a wider Acc beside a
// narrower T (two or more 16-byte accesses), or less for the narrower side of a cast (8 bytes
// of float16 beside 16 of float32). Its size is exactly N elements, so that vector v of an
// array starts at element v * N.
template <class T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Vec {
  T v[N];
};

template <class T>
constexpr int lanes() {
  return sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

int blocks_for(size_t work) {
  const size_t b = (work + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b ? b : 1) : 65535);
}

// Runs f(i) for every i in [0, n) as vectors of N where `vectors`, then the rest one by one.
// F handles f.vec(v) (vector index) and f.one(i) (element index).
template <int N, class F>
__global__ void elementwise_kernel(F f, size_t n, bool vectors) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nv = vectors ? n / N : 0;
  for (size_t v = tid; v < nv; v += stride) f.vec(v);
  for (size_t i = nv * N + tid; i < n; i += stride) f.one(i);
}

// Whether vectors of A and B over N lanes hold exactly N elements each (no padding).
template <class A, class B, int N>
constexpr bool packed() {
  return sizeof(Vec<A, N>) == sizeof(A) * N && sizeof(Vec<B, N>) == sizeof(B) * N;
}

template <class T, class Op>
struct Accumulate {
  using Acc = typename Elem<T>::Acc;
  static constexpr int N = lanes<T>();
  static_assert(packed<T, Acc, N>(), "the vectors hold N elements");
  const T* a;
  const Acc* b;
  Acc* acc;
  __device__ void vec(size_t v) const {
    const Vec<T, N> x = reinterpret_cast<const Vec<T, N>*>(a)[v];
    const Vec<Acc, N> y = reinterpret_cast<const Vec<Acc, N>*>(b)[v];
    Vec<Acc, N> r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = accumulate_one<T, Op>(x.v[k], y.v[k]);
    reinterpret_cast<Vec<Acc, N>*>(acc)[v] = r;
  }
  __device__ void one(size_t i) const { acc[i] = accumulate_one<T, Op>(a[i], b[i]); }
};

template <class T, class Op, bool kAvg>
struct Finish {
  using Acc = typename Elem<T>::Acc;
  static constexpr int N = lanes<T>();
  static_assert(packed<T, Acc, N>(), "the vectors hold N elements");
  const T* a;
  const Acc* b;
  T* out;
  Acc div;
  __device__ void vec(size_t v) const {
    const Vec<T, N> x = reinterpret_cast<const Vec<T, N>*>(a)[v];
    const Vec<Acc, N> y = reinterpret_cast<const Vec<Acc, N>*>(b)[v];
    Vec<T, N> r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = finish_one<T, Op, kAvg>(x.v[k], y.v[k], div);
    reinterpret_cast<Vec<T, N>*>(out)[v] = r;
  }
  __device__ void one(size_t i) const { out[i] = finish_one<T, Op, kAvg>(a[i], b[i], div); }
};

template <class T, bool kAvg>
struct FinishWide {
  using Acc = typename Elem<T>::Acc;
  static constexpr int N = lanes<T>();
  static_assert(packed<T, Acc, N>(), "the vectors hold N elements");
  const Acc* acc;
  T* out;
  Acc div;
  __device__ T convert(Acc v) const {
    if (kAvg) v = static_cast<Acc>(v / div);
    return Elem<T>::narrow(v);
  }
  __device__ void vec(size_t v) const {
    const Vec<Acc, N> x = reinterpret_cast<const Vec<Acc, N>*>(acc)[v];
    Vec<T, N> r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = convert(x.v[k]);
    reinterpret_cast<Vec<T, N>*>(out)[v] = r;
  }
  __device__ void one(size_t i) const { out[i] = convert(acc[i]); }
};

template <class From, class To>
struct Cast {
  static constexpr int N = lanes<From>() < lanes<To>() ? lanes<From>() : lanes<To>();
  static_assert(packed<From, To, N>(), "a cast's vectors hold N elements");
  const From* in;
  To* out;
  __device__ static To convert(From x) { return Elem<To>::narrow(Elem<From>::widen(x)); }
  __device__ void vec(size_t v) const {
    const Vec<From, N> x = reinterpret_cast<const Vec<From, N>*>(in)[v];
    Vec<To, N> r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = convert(x.v[k]);
    reinterpret_cast<Vec<To, N>*>(out)[v] = r;
  }
  __device__ void one(size_t i) const { out[i] = convert(in[i]); }
};

template <class F>
void launch(const F& f, size_t n, bool vectors, void* stream) {
  if (n == 0) return;
  const size_t work = vectors ? n / F::N + n % F::N : n;
  elementwise_kernel<F::N, F>
      <<<blocks_for(work), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(f, n, vectors);
  PYRING_CUDA_CHECK(cudaGetLastError());
}

template <class T, class Op>
void accumulate_typed(const void* a, const void* b, void* acc, size_t n, void* stream) {
  using Acc = typename Elem<T>::Acc;
  const Accumulate<T, Op> f{static_cast<const T*>(a), static_cast<const Acc*>(b),
                            static_cast<Acc*>(acc)};
  launch(f, n, aligned16(a) && aligned16(b) && aligned16(acc), stream);
}

template <class T>
void accumulate_op(ReduceOp op, const void* a, const void* b, void* acc, size_t n, void* stream) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return accumulate_typed<T, OpSum>(a, b, acc, n, stream);
    case ReduceOp::kProd:
      return accumulate_typed<T, OpProd>(a, b, acc, n, stream);
    case ReduceOp::kMax:
      return accumulate_typed<T, OpMax>(a, b, acc, n, stream);
    case ReduceOp::kMin:
      return accumulate_typed<T, OpMin>(a, b, acc, n, stream);
  }
  PYRING_THROW(InvalidArgument, "unknown reduce op ", static_cast<int>(op));
}

template <class T, class Op, bool kAvg>
void finish_typed(const void* a, const void* b, void* out, size_t n, int world, void* stream) {
  using Acc = typename Elem<T>::Acc;
  const Finish<T, Op, kAvg> f{static_cast<const T*>(a), static_cast<const Acc*>(b),
                              static_cast<T*>(out), static_cast<Acc>(world)};
  launch(f, n, aligned16(a) && aligned16(b) && aligned16(out), stream);
}

template <class T>
void finish_op(ReduceOp op, const void* a, const void* b, void* out, size_t n, int world,
               void* stream) {
  switch (op) {
    case ReduceOp::kSum:
      return finish_typed<T, OpSum, false>(a, b, out, n, world, stream);
    case ReduceOp::kAvg:
      return finish_typed<T, OpSum, true>(a, b, out, n, world, stream);
    case ReduceOp::kProd:
      return finish_typed<T, OpProd, false>(a, b, out, n, world, stream);
    case ReduceOp::kMax:
      return finish_typed<T, OpMax, false>(a, b, out, n, world, stream);
    case ReduceOp::kMin:
      return finish_typed<T, OpMin, false>(a, b, out, n, world, stream);
  }
  PYRING_THROW(InvalidArgument, "unknown reduce op ", static_cast<int>(op));
}

template <class From, class To>
void cast_typed(const void* in, void* out, size_t n, void* stream) {
  const Cast<From, To> f{static_cast<const From*>(in), static_cast<To*>(out)};
  launch(f, n, aligned16(in) && aligned16(out), stream);
}

}  // namespace

void cuda_reduce_accumulate(DType dtype, ReduceOp op, const void* a, const void* b, void* acc,
                            size_t n, void* stream) {
  PYRING_DISPATCH(dtype, accumulate_op, op, a, b, acc, n, stream);
}

void cuda_reduce_finish(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t n,
                        int world, void* stream) {
  PYRING_DISPATCH(dtype, finish_op, op, a, b, out, n, world, stream);
}

namespace {
template <class T>
void finish_wide_typed(ReduceOp op, const void* acc, void* out, size_t n, int world, void* stream) {
  using Acc = typename Elem<T>::Acc;
  const bool vectors = aligned16(acc) && aligned16(out);
  if (op == ReduceOp::kAvg) {
    const FinishWide<T, true> f{static_cast<const Acc*>(acc), static_cast<T*>(out),
                                static_cast<Acc>(world)};
    return launch(f, n, vectors, stream);
  }
  const FinishWide<T, false> f{static_cast<const Acc*>(acc), static_cast<T*>(out),
                               static_cast<Acc>(world)};
  launch(f, n, vectors, stream);
}
}  // namespace

void cuda_finish_wide(DType dtype, ReduceOp op, const void* acc, void* out, size_t n, int world,
                      void* stream) {
  PYRING_DISPATCH(dtype, finish_wide_typed, op, acc, out, n, world, stream);
}

void cuda_cast(DType from, DType to, const void* in, void* out, size_t n, void* stream) {
  check_wire_cast("cuda_cast", from, to);
  if (from == DType::kFloat32 && to == DType::kFloat16) {
    return cast_typed<float, Half>(in, out, n, stream);
  }
  if (from == DType::kFloat32 && to == DType::kBFloat16) {
    return cast_typed<float, BFloat16>(in, out, n, stream);
  }
  if (from == DType::kFloat16 && to == DType::kFloat32) {
    return cast_typed<Half, float>(in, out, n, stream);
  }
  if (from == DType::kBFloat16 && to == DType::kFloat32) {
    return cast_typed<BFloat16, float>(in, out, n, stream);
  }
}

}  // namespace pyring
