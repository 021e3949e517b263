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
      float amax = 0.0f;
      bool nan = false;  // fmax skips NaN: a block holding one must still decode to NaN
      for (size_t i = 0; i < len; ++i) {
        v[i] = in[b + i];
        if (residual) v[i] += to_float(BFloat16{residual[b + i]});
        amax = std::fmax(amax, std::fabs(v[i]));
        nan |= std::isnan(v[i]);
      }
      if (nan) amax = NAN;
      const bool finite = std::isfinite(amax);
      const float scale = amax / 127.0f;
      const float inv = amax > 0.0f && finite ? 127.0f / amax : 0.0f;
      std::memcpy(out, &scale, sizeof scale);
      int8_t* q = reinterpret_cast<int8_t*>(out + sizeof scale);
      for (size_t i = 0; i < len; ++i) {
        float r = std::nearbyint(v[i] * inv);
        r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
        q[i] = static_cast<int8_t>(r);
        // A non-finite block keeps no residual: it would poison every later call.
        if (residual) residual[b + i] = finite ? to_bfloat16(v[i] - r * scale).bits : 0;
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
