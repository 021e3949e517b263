// The element operations of the reduction, cast and one-bit kernels, shared by the CPU
// kernels (reduce.cc, onebit.cc) and the CUDA kernels (*.cu): one definition of each piece of
// arithmetic, tested on the CPU.
#pragma once

#include <cstdint>

#include "core/errors.h"
#include "core/types.h"
#include "kernels/half.h"

namespace pyring {

// Storage type T, its accumulation type Acc (float for the half types) and the conversions.
template <class T>
struct Elem {
  using Acc = T;
  static PYRING_HD Acc widen(T v) { return v; }
  static PYRING_HD T narrow(Acc v) { return v; }
};
template <>
struct Elem<Half> {
  using Acc = float;
  static PYRING_HD float widen(Half v) { return to_float(v); }
  static PYRING_HD Half narrow(float v) { return to_half(v); }
};
template <>
struct Elem<BFloat16> {
  using Acc = float;
  static PYRING_HD float widen(BFloat16 v) { return to_float(v); }
  static PYRING_HD BFloat16 narrow(float v) { return to_bfloat16(v); }
};

struct OpSum {
  template <class A>
  static PYRING_HD A apply(A x, A y) {
    return static_cast<A>(x + y);
  }
};
struct OpProd {
  template <class A>
  static PYRING_HD A apply(A x, A y) {
    return static_cast<A>(x * y);
  }
};
struct OpMax {
  template <class A>
  static PYRING_HD A apply(A x, A y) {
    return x > y ? x : y;
  }
};
struct OpMin {
  template <class A>
  static PYRING_HD A apply(A x, A y) {
    return x < y ? x : y;
  }
};

// acc = op(widen(a), b)
template <class T, class Op>
PYRING_HD typename Elem<T>::Acc accumulate_one(T a, typename Elem<T>::Acc b) {
  return Op::apply(Elem<T>::widen(a), b);
}

// narrow(finish(op(widen(a), b))): avg divides the sum by `div` (the world size).
template <class T, class Op, bool kAvg>
PYRING_HD T finish_one(T a, typename Elem<T>::Acc b, typename Elem<T>::Acc div) {
  typename Elem<T>::Acc v = Op::apply(Elem<T>::widen(a), b);
  if (kAvg) v = static_cast<typename Elem<T>::Acc>(v / div);
  return Elem<T>::narrow(v);
}

// One value of a one-bit segment: 0 under the zero mask, else -scale where the sign bit is
// set and +scale elsewhere (bit k of the mask bytes).
PYRING_HD float onebit_value(uint32_t sign_bits, uint32_t zero_bits, int k, float scale) {
  if ((zero_bits >> k) & 1u) return 0.0f;
  return ((sign_bits >> k) & 1u) ? -scale : scale;
}

// The sign and zero bits of one value as the encoder packs them: -0.0 counts as negative,
// and its zero bit wins on decode.
PYRING_HD uint32_t onebit_sign_bit(float v) {
  return float_to_bits(v) >> 31;
}
PYRING_HD uint32_t onebit_zero_bit(float v) {
  return v == 0.0f ? 1u : 0u;
}

// A deferred residual settled (kernels/onebit.h): v - decode(v) for a value v encoded with
// `scale`; v itself when scale is 0.
PYRING_HD float onebit_settled(float v, float scale) {
  return v - onebit_value(onebit_sign_bit(v), onebit_zero_bit(v), 0, scale);
}

// A kept residual (kernels/onebit.h): the bfloat16 bits of v, rounded to nearest even, and
// their value.
PYRING_HD uint16_t onebit_kept(float v) {
  return to_bfloat16(v).bits;
}
PYRING_HD float onebit_kept_value(uint16_t bits) {
  return to_float(BFloat16{bits});
}

}  // namespace pyring

// Returns FN<T>(args...) for the storage type T of `dtype`; throws for an unknown code.
#define PYRING_DISPATCH(dtype, FN, ...) \
  switch (dtype) {                      \
    case DType::kFloat32:               \
      return FN<float>(__VA_ARGS__);    \
    case DType::kFloat64:               \
      return FN<double>(__VA_ARGS__);   \
    case DType::kFloat16:               \
      return FN<Half>(__VA_ARGS__);     \
    case DType::kBFloat16:              \
      return FN<BFloat16>(__VA_ARGS__); \
    case DType::kInt8:                  \
      return FN<int8_t>(__VA_ARGS__);   \
    case DType::kUInt8:                 \
      return FN<uint8_t>(__VA_ARGS__);  \
    case DType::kInt32:                 \
      return FN<int32_t>(__VA_ARGS__);  \
    case DType::kInt64:                 \
      return FN<int64_t>(__VA_ARGS__);  \
  }                                     \
  PYRING_THROW(InvalidArgument, "unknown dtype code ", static_cast<int>(dtype))
