#include "kernels/wire_cast.h"

#include "core/errors.h"
#include "kernels/half.h"

namespace pyring {

namespace {
template <class From, class To, class Fn>
void cast_typed(const void* in, void* out, size_t n, Fn fn) {
  const auto* src = static_cast<const From*>(in);
  auto* dst = static_cast<To*>(out);
  for (size_t i = 0; i < n; ++i) dst[i] = fn(src[i]);
}
}  // namespace

void wire_cast(DType from, DType to, const void* in, void* out, size_t n) {
  if (from == DType::kFloat32 && to == DType::kFloat16) {
    return cast_typed<float, Half>(in, out, n, [](float f) { return to_half(f); });
  }
  if (from == DType::kFloat32 && to == DType::kBFloat16) {
    return cast_typed<float, BFloat16>(in, out, n, [](float f) { return to_bfloat16(f); });
  }
  if (from == DType::kFloat16 && to == DType::kFloat32) {
    return cast_typed<Half, float>(in, out, n, [](Half h) { return to_float(h); });
  }
  if (from == DType::kBFloat16 && to == DType::kFloat32) {
    return cast_typed<BFloat16, float>(in, out, n, [](BFloat16 h) { return to_float(h); });
  }
  PYRING_THROW(InvalidArgument, "wire_cast: no cast from ", dtype_name(from), " to ",
               dtype_name(to), " (the wire casts are float32 <-> float16/bfloat16)");
}

}  // namespace pyring
