#include "kernels/reduce.h"

#include <cstdint>
#include <cstring>

#include "core/errors.h"
#include "kernels/elementwise.h"

namespace pyring {

namespace {

template <class T, class Op>
void accumulate_impl(const void* a, const void* b, void* acc, size_t n) {
  using Acc = typename Elem<T>::Acc;
  const T* pa = static_cast<const T*>(a);
  const Acc* pb = static_cast<const Acc*>(b);
  Acc* pc = static_cast<Acc*>(acc);
  for (size_t i = 0; i < n; ++i) pc[i] = accumulate_one<T, Op>(pa[i], pb[i]);
}

template <class T, class Op, bool kAvg>
void finish_impl(const void* a, const void* b, void* out, size_t n, int world) {
  using Acc = typename Elem<T>::Acc;
  const T* pa = static_cast<const T*>(a);
  const Acc* pb = static_cast<const Acc*>(b);
  T* po = static_cast<T*>(out);
  const Acc div = static_cast<Acc>(world);
  for (size_t i = 0; i < n; ++i) po[i] = finish_one<T, Op, kAvg>(pa[i], pb[i], div);
}

template <class T>
void finish_wide_impl(ReduceOp op, const void* acc, void* out, size_t n, int world) {
  using Acc = typename Elem<T>::Acc;
  const Acc* pa = static_cast<const Acc*>(acc);
  T* po = static_cast<T*>(out);
  if (op == ReduceOp::kAvg) {
    const Acc div = static_cast<Acc>(world);
    for (size_t i = 0; i < n; ++i) po[i] = Elem<T>::narrow(static_cast<Acc>(pa[i] / div));
  } else {
    for (size_t i = 0; i < n; ++i) po[i] = Elem<T>::narrow(pa[i]);
  }
}

template <class T>
void widen_impl(const void* a, void* acc, size_t n) {
  using Acc = typename Elem<T>::Acc;
  const T* pa = static_cast<const T*>(a);
  Acc* pc = static_cast<Acc*>(acc);
  for (size_t i = 0; i < n; ++i) pc[i] = Elem<T>::widen(pa[i]);
}

template <class T>
void accumulate_op(ReduceOp op, const void* a, const void* b, void* acc, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return accumulate_impl<T, OpSum>(a, b, acc, n);
    case ReduceOp::kProd:
      return accumulate_impl<T, OpProd>(a, b, acc, n);
    case ReduceOp::kMax:
      return accumulate_impl<T, OpMax>(a, b, acc, n);
    case ReduceOp::kMin:
      return accumulate_impl<T, OpMin>(a, b, acc, n);
  }
  PYRING_THROW(InvalidArgument, "unknown reduce op ", static_cast<int>(op));
}

template <class T>
void finish_op(ReduceOp op, const void* a, const void* b, void* out, size_t n, int world) {
  switch (op) {
    case ReduceOp::kSum:
      return finish_impl<T, OpSum, false>(a, b, out, n, world);
    case ReduceOp::kAvg:
      return finish_impl<T, OpSum, true>(a, b, out, n, world);
    case ReduceOp::kProd:
      return finish_impl<T, OpProd, false>(a, b, out, n, world);
    case ReduceOp::kMax:
      return finish_impl<T, OpMax, false>(a, b, out, n, world);
    case ReduceOp::kMin:
      return finish_impl<T, OpMin, false>(a, b, out, n, world);
  }
  PYRING_THROW(InvalidArgument, "unknown reduce op ", static_cast<int>(op));
}

}  // namespace

void reduce_accumulate(DType dtype, ReduceOp op, const void* a, const void* b, void* acc,
                       size_t n) {
  PYRING_DISPATCH(dtype, accumulate_op, op, a, b, acc, n);
}

void reduce_finish(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t n,
                   int world) {
  PYRING_DISPATCH(dtype, finish_op, op, a, b, out, n, world);
}

void finish_wide(DType dtype, ReduceOp op, const void* acc, void* out, size_t n, int world) {
  PYRING_DISPATCH(dtype, finish_wide_impl, op, acc, out, n, world);
}

void widen(DType dtype, const void* a, void* acc, size_t n) {
  PYRING_DISPATCH(dtype, widen_impl, a, acc, n);
}

void finish_single(DType dtype, const void* a, void* out, size_t n) {
  if (a != out) std::memcpy(out, a, n * dtype_size(dtype));
}

}  // namespace pyring
