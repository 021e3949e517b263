// The wires pyring started with: fp32 (no codec), fp16 and bf16 (a cast each way, on the host
// and on devices), and onebit, whose schedule is its own (collectives/compressed.cc).
#include "codecs/codec.h"
#include "core/errors.h"
#include "kernels/wire_cast.h"

namespace pyring {

namespace {

class Fp32 final : public Codec {
 public:
  const char* name() const override { return "fp32"; }
  Schedule schedule() const override { return Schedule::kExact; }
  size_t encoded_bytes(size_t n) const override { return 4 * n; }
  bool device_kernels() const override { return true; }
  void encode(const KernelSite&, const float*, uint16_t*, size_t, uint8_t*) const override {
    PYRING_THROW(Error, "the fp32 wire is the ordinary allreduce: it encodes nothing");
  }
  void decode(const KernelSite&, const uint8_t*, size_t, bool, float*) const override {
    PYRING_THROW(Error, "the fp32 wire is the ordinary allreduce: it decodes nothing");
  }
};

// Rounds to nearest even each way; no residual (a residual, where given, stays as it is).
class Half final : public Codec {
 public:
  Half(const char* name, DType dtype) : name_(name), dtype_(dtype) {}
  const char* name() const override { return name_; }
  size_t encoded_bytes(size_t n) const override { return 2 * n; }
  bool device_kernels() const override { return true; }
  void encode(const KernelSite& site, const float* in, uint16_t*, size_t n,
              uint8_t* out) const override {
    if (site.on_host()) return wire_cast(DType::kFloat32, dtype_, in, out, n);
    kern::cast(site, DType::kFloat32, dtype_, in, out, n);
  }
  void decode(const KernelSite& site, const uint8_t* enc, size_t n, bool accumulate,
              float* out) const override {
    if (!accumulate) {
      if (site.on_host()) return wire_cast(dtype_, DType::kFloat32, enc, out, n);
      return kern::cast(site, dtype_, DType::kFloat32, enc, out, n);
    }
    if (!site.on_host()) return kern::accumulate(site, dtype_, ReduceOp::kSum, enc, out, out, n);
    constexpr size_t kBlock = 2048;  // a decoded block stays in L1
    float t[kBlock];
    for (size_t b = 0; b < n; b += kBlock) {
      const size_t len = n - b < kBlock ? n - b : kBlock;
      wire_cast(dtype_, DType::kFloat32, enc + 2 * b, t, len);
      for (size_t i = 0; i < len; ++i) out[b + i] = t[i] + out[b + i];
    }
  }

 private:
  const char* name_;
  DType dtype_;
};

class Onebit final : public Codec {
 public:
  const char* name() const override { return "onebit"; }
  Schedule schedule() const override { return Schedule::kOnebit; }
  bool error_feedback() const override { return true; }
  size_t encoded_bytes(size_t n) const override { return onebit_max_bytes(n); }
  bool device_kernels() const override { return true; }
  void encode(const KernelSite&, const float*, uint16_t*, size_t, uint8_t*) const override {
    PYRING_THROW(Error, "the onebit wire runs its own schedule (collectives/compressed.cc)");
  }
  void decode(const KernelSite&, const uint8_t*, size_t, bool, float*) const override {
    PYRING_THROW(Error, "the onebit wire runs its own schedule (collectives/compressed.cc)");
  }
};

}  // namespace

const Codec& fp32_codec() {
  static const Fp32 c;
  return c;
}
const Codec& fp16_codec() {
  static const Half c("fp16", DType::kFloat16);
  return c;
}
const Codec& bf16_codec() {
  static const Half c("bf16", DType::kBFloat16);
  return c;
}
const Codec& onebit_codec() {
  static const Onebit c;
  return c;
}

}  // namespace pyring
