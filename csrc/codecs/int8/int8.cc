// The int8 wire: blockwise-scaled 8-bit values with error feedback, the block quantization of
// ZeRO++ and bitsandbytes. Every block of kBlock values travels as its float32 scale (the
// block's largest magnitude / 127) and one signed byte per value, round(v / scale) in
// [-127, 127]: 1.016 bytes per value, a quarter of float32. A block of zeros (with zero
// residuals) decodes to exact zeros; a non-finite value makes its block's scale non-finite,
// and the block decodes to NaN and leaves no residual. Host kernels only: on a device, buffers are
// staged through pinned host memory (collectives/placement.h).
#include <cmath>
#include <cstring>

#include "codecs/codec.h"
#include "core/errors.h"
#include "kernels/half.h"

namespace pyring {

namespace {

constexpr size_t kBlock = 256;
constexpr float kRound = 12582912.0f;  // 1.5 * 2^23

class Int8 final : public Codec {
 public:
  const char* name() const override { return "int8"; }
  bool error_feedback() const override { return true; }
  size_t encoded_bytes(size_t n) const override { return n + 4 * ((n + kBlock - 1) / kBlock); }
  size_t block() const override { return kBlock; }

  void encode(const KernelSite& site, const float* in, uint16_t* residual, size_t n,
              uint8_t* out) const override {
    PYRING_CHECK(site.on_host(), Error, "the int8 codec has host kernels only");
    float v[kBlock];
    for (size_t b = 0; b < n; b += kBlock) {
      const size_t len = n - b < kBlock ? n - b : kBlock;
      // The largest magnitude by its bits (|v|'s bits order as |v| does, and every NaN's are
      // above infinity's): an integer max, which vectorizes, and a NaN is not skipped.
      uint32_t top = 0;
      for (size_t i = 0; i < len; ++i) {
        const float r = residual ? to_float(BFloat16{residual[b + i]}) : 0.0f;
        v[i] = in[b + i] + r;
        const uint32_t m = float_to_bits(v[i]) & 0x7fffffffu;
        top = m > top ? m : top;
      }
      const float amax = bits_to_float(top);
      const bool finite = std::isfinite(amax);
      const float scale = amax / 127.0f;
      const float inv = amax > 0.0f && finite ? 127.0f / amax : 0.0f;
      std::memcpy(out, &scale, sizeof scale);
      int8_t* q = reinterpret_cast<int8_t*>(out + sizeof scale);
      for (size_t i = 0; i < len; ++i) {
        // Round to nearest even by the float32 adder (|v * inv| <= 127 < 2^22): vectorizes,
        // where nearbyint is a call per value.
        float r = (v[i] * inv + kRound) - kRound;
        r = r > 127.0f ? 127.0f : r;
        r = r < -127.0f ? -127.0f : r;
        q[i] = static_cast<int8_t>(r);
      }
      if (residual) {
        // A non-finite block keeps no residual: it would poison every later call.
        for (size_t i = 0; i < len; ++i) {
          const float kept = finite ? v[i] - static_cast<float>(q[i]) * scale : 0.0f;
          residual[b + i] = to_bfloat16(kept).bits;
        }
      }
      out += sizeof scale + len;
    }
  }

  void decode(const KernelSite& site, const uint8_t* enc, size_t n, bool accumulate,
              float* out) const override {
    PYRING_CHECK(site.on_host(), Error, "the int8 codec has host kernels only");
    for (size_t b = 0; b < n; b += kBlock) {
      const size_t len = n - b < kBlock ? n - b : kBlock;
      float scale;
      std::memcpy(&scale, enc, sizeof scale);
      const int8_t* q = reinterpret_cast<const int8_t*>(enc + sizeof scale);
      if (accumulate) {
        for (size_t i = 0; i < len; ++i) out[b + i] = static_cast<float>(q[i]) * scale + out[b + i];
      } else {
        for (size_t i = 0; i < len; ++i) out[b + i] = static_cast<float>(q[i]) * scale;
      }
      enc += sizeof scale + len;
    }
  }
};

}  // namespace

const Codec& int8_codec() {
  static const Int8 c;
  return c;
}

}  // namespace pyring
