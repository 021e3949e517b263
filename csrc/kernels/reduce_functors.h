// The bodies of the CUDA reduction and cast kernels (kernels/cuda_kernels.h), for the device
// and for the host: reduce.cu launches them on a GPU; kernels/host_grid.cc runs the same
// per-thread body over an emulated grid (the sim device), so a wrong index, stride or vector
// layout in them fails the CPU tests. The element arithmetic is kernels/elementwise.h's.
//
// A launch runs f(i) for every i in [0, n): where every pointer is 16-byte aligned, as
// vectors of F::N elements (f.vec(v) covers elements [v * N, v * N + N)) and then the tail one
// by one (f.one(i)); elsewhere one by one. Each thread of elementwise_blocks(...) blocks of
// kElementwiseThreads walks a grid-stride loop (elementwise_thread).
//
// The *_on functions choose the functor, the vector path and the grid for a kernel of
// cuda_kernels.h and hand them to `launch`, a callable that runs
//   launch(f, n, vectors, blocks): elementwise_thread<F::N>(f, n, vectors, p) for every thread
//   p of `blocks` blocks of kElementwiseThreads threads (n > 0).
// reduce.cu's launches it as a CUDA kernel, host_grid.cc's thread by thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/errors.h"
#include "core/types.h"
#include "kernels/elementwise.h"
#include "kernels/grid.h"
#include "kernels/wire_cast.h"

namespace pyring {

constexpr int kElementwiseThreads = 256;

// The blocks of a launch that has `work` vectors and tail elements to cover.
inline int elementwise_blocks(size_t work) {
  const size_t b = (work + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<int>(b < 65535 ? (b ? b : 1) : 65535);
}

// N elements of T, loaded and stored as one access: 16 bytes, or more for a wider Acc beside a
// narrower T (two or more 16-byte accesses), or less for the narrower side of a cast (8 bytes
// of float16 beside 16 of float32). Its size is exactly N elements, so that vector v of an
// array starts at element v * N.
template <class T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) PYRING_MAY_ALIAS Vec {
  T v[N];
};

template <class T>
constexpr int lanes() {
  return sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
}

// Whether vectors of A and B over N lanes hold exactly N elements each (no padding).
template <class A, class B, int N>
constexpr bool packed() {
  return sizeof(Vec<A, N>) == sizeof(A) * N && sizeof(Vec<B, N>) == sizeof(B) * N;
}

// One thread's share of a launch: f.vec over the whole vectors where `vectors`, then f.one over
// the rest, both in grid-stride order.
template <int N, class F>
PYRING_HD void elementwise_thread(const F& f, size_t n, bool vectors, const GridPos& p) {
  const size_t stride = p.stride();
  const size_t tid = p.tid();
  const size_t nv = vectors ? n / N : 0;
  for (size_t v = tid; v < nv; v += stride) f.vec(v);
  for (size_t i = nv * N + tid; i < n; i += stride) f.one(i);
}

template <class T, class Op>
struct Accumulate {
  using Acc = typename Elem<T>::Acc;
  static constexpr int N = lanes<T>();
  static_assert(packed<T, Acc, N>(), "the vectors hold N elements");
  const T* a;
  const Acc* b;
  Acc* acc;
  PYRING_HD void vec(size_t v) const {
    const Vec<T, N> x = reinterpret_cast<const Vec<T, N>*>(a)[v];
    const Vec<Acc, N> y = reinterpret_cast<const Vec<Acc, N>*>(b)[v];
    Vec<Acc, N> r;
    PYRING_UNROLL
    for (int k = 0; k < N; ++k) r.v[k] = accumulate_one<T, Op>(x.v[k], y.v[k]);
    reinterpret_cast<Vec<Acc, N>*>(acc)[v] = r;
  }
  PYRING_HD void one(size_t i) const { acc[i] = accumulate_one<T, Op>(a[i], b[i]); }
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
  PYRING_HD void vec(size_t v) const {
    const Vec<T, N> x = reinterpret_cast<const Vec<T, N>*>(a)[v];
    const Vec<Acc, N> y = reinterpret_cast<const Vec<Acc, N>*>(b)[v];
    Vec<T, N> r;
    PYRING_UNROLL
    for (int k = 0; k < N; ++k) r.v[k] = finish_one<T, Op, kAvg>(x.v[k], y.v[k], div);
    reinterpret_cast<Vec<T, N>*>(out)[v] = r;
  }
  PYRING_HD void one(size_t i) const { out[i] = finish_one<T, Op, kAvg>(a[i], b[i], div); }
};

template <class T, bool kAvg>
struct FinishWide {
  using Acc = typename Elem<T>::Acc;
  static constexpr int N = lanes<T>();
  static_assert(packed<T, Acc, N>(), "the vectors hold N elements");
  const Acc* acc;
  T* out;
  Acc div;
  PYRING_HD T convert(Acc v) const {
    if (kAvg) v = static_cast<Acc>(v / div);
    return Elem<T>::narrow(v);
  }
  PYRING_HD void vec(size_t v) const {
    const Vec<Acc, N> x = reinterpret_cast<const Vec<Acc, N>*>(acc)[v];
    Vec<T, N> r;
    PYRING_UNROLL
    for (int k = 0; k < N; ++k) r.v[k] = convert(x.v[k]);
    reinterpret_cast<Vec<T, N>*>(out)[v] = r;
  }
  PYRING_HD void one(size_t i) const { out[i] = convert(acc[i]); }
};

template <class From, class To>
struct Cast {
  static constexpr int N = lanes<From>() < lanes<To>() ? lanes<From>() : lanes<To>();
  static_assert(packed<From, To, N>(), "a cast's vectors hold N elements");
  const From* in;
  To* out;
  PYRING_HD static To convert(From x) { return Elem<To>::narrow(Elem<From>::widen(x)); }
  PYRING_HD void vec(size_t v) const {
    const Vec<From, N> x = reinterpret_cast<const Vec<From, N>*>(in)[v];
    Vec<To, N> r;
    PYRING_UNROLL
    for (int k = 0; k < N; ++k) r.v[k] = convert(x.v[k]);
    reinterpret_cast<Vec<To, N>*>(out)[v] = r;
  }
  PYRING_HD void one(size_t i) const { out[i] = convert(in[i]); }
};

// Hands f to `launch` with the grid that covers n elements: nothing when n is 0.
template <class Launch, class F>
void launch_elementwise(const Launch& launch, const F& f, size_t n, bool vectors) {
  if (n == 0) return;
  const size_t work = vectors ? n / F::N + n % F::N : n;
  launch(f, n, vectors, elementwise_blocks(work));
}

namespace elementwise_detail {

template <class T, class Op, class Launch>
void accumulate_typed(const Launch& launch, const void* a, const void* b, void* acc, size_t n) {
  using Acc = typename Elem<T>::Acc;
  const Accumulate<T, Op> f{static_cast<const T*>(a), static_cast<const Acc*>(b),
                            static_cast<Acc*>(acc)};
  launch_elementwise(launch, f, n, aligned16(a) && aligned16(b) && aligned16(acc));
}

template <class T, class Launch>
void accumulate_op(const Launch& launch, ReduceOp op, const void* a, const void* b, void* acc,
                   size_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return accumulate_typed<T, OpSum>(launch, a, b, acc, n);
    case ReduceOp::kProd:
      return accumulate_typed<T, OpProd>(launch, a, b, acc, n);
    case ReduceOp::kMax:
      return accumulate_typed<T, OpMax>(launch, a, b, acc, n);
    case ReduceOp::kMin:
      return accumulate_typed<T, OpMin>(launch, a, b, acc, n);
  }
  PYRING_THROW(InvalidArgument, "unknown reduce op ", static_cast<int>(op));
}

template <class T, class Op, bool kAvg, class Launch>
void finish_typed(const Launch& launch, const void* a, const void* b, void* out, size_t n,
                  int world) {
  using Acc = typename Elem<T>::Acc;
  const Finish<T, Op, kAvg> f{static_cast<const T*>(a), static_cast<const Acc*>(b),
                              static_cast<T*>(out), static_cast<Acc>(world)};
  launch_elementwise(launch, f, n, aligned16(a) && aligned16(b) && aligned16(out));
}

template <class T, class Launch>
void finish_op(const Launch& launch, ReduceOp op, const void* a, const void* b, void* out, size_t n,
               int world) {
  switch (op) {
    case ReduceOp::kSum:
      return finish_typed<T, OpSum, false>(launch, a, b, out, n, world);
    case ReduceOp::kAvg:
      return finish_typed<T, OpSum, true>(launch, a, b, out, n, world);
    case ReduceOp::kProd:
      return finish_typed<T, OpProd, false>(launch, a, b, out, n, world);
    case ReduceOp::kMax:
      return finish_typed<T, OpMax, false>(launch, a, b, out, n, world);
    case ReduceOp::kMin:
      return finish_typed<T, OpMin, false>(launch, a, b, out, n, world);
  }
  PYRING_THROW(InvalidArgument, "unknown reduce op ", static_cast<int>(op));
}

template <class T, class Launch>
void finish_wide_typed(const Launch& launch, ReduceOp op, const void* acc, void* out, size_t n,
                       int world) {
  using Acc = typename Elem<T>::Acc;
  const bool vectors = aligned16(acc) && aligned16(out);
  if (op == ReduceOp::kAvg) {
    const FinishWide<T, true> f{static_cast<const Acc*>(acc), static_cast<T*>(out),
                                static_cast<Acc>(world)};
    return launch_elementwise(launch, f, n, vectors);
  }
  const FinishWide<T, false> f{static_cast<const Acc*>(acc), static_cast<T*>(out),
                               static_cast<Acc>(world)};
  launch_elementwise(launch, f, n, vectors);
}

template <class From, class To, class Launch>
void cast_typed(const Launch& launch, const void* in, void* out, size_t n) {
  const Cast<From, To> f{static_cast<const From*>(in), static_cast<To*>(out)};
  launch_elementwise(launch, f, n, aligned16(in) && aligned16(out));
}

}  // namespace elementwise_detail

// The kernels of cuda_kernels.h through `launch` (see the top of this file).
template <class Launch>
void reduce_accumulate_on(const Launch& launch, DType dtype, ReduceOp op, const void* a,
                          const void* b, void* acc, size_t n) {
  PYRING_DISPATCH(dtype, elementwise_detail::accumulate_op, launch, op, a, b, acc, n);
}

template <class Launch>
void reduce_finish_on(const Launch& launch, DType dtype, ReduceOp op, const void* a, const void* b,
                      void* out, size_t n, int world) {
  PYRING_DISPATCH(dtype, elementwise_detail::finish_op, launch, op, a, b, out, n, world);
}

template <class Launch>
void finish_wide_on(const Launch& launch, DType dtype, ReduceOp op, const void* acc, void* out,
                    size_t n, int world) {
  PYRING_DISPATCH(dtype, elementwise_detail::finish_wide_typed, launch, op, acc, out, n, world);
}

// `fn` names the caller in the error for a pair that is not a wire cast.
template <class Launch>
void cast_on(const Launch& launch, const char* fn, DType from, DType to, const void* in, void* out,
             size_t n) {
  check_wire_cast(fn, from, to);
  if (from == DType::kFloat32 && to == DType::kFloat16) {
    return elementwise_detail::cast_typed<float, Half>(launch, in, out, n);
  }
  if (from == DType::kFloat32 && to == DType::kBFloat16) {
    return elementwise_detail::cast_typed<float, BFloat16>(launch, in, out, n);
  }
  if (from == DType::kFloat16 && to == DType::kFloat32) {
    return elementwise_detail::cast_typed<Half, float>(launch, in, out, n);
  }
  if (from == DType::kBFloat16 && to == DType::kFloat32) {
    return elementwise_detail::cast_typed<BFloat16, float>(launch, in, out, n);
  }
}

}  // namespace pyring
