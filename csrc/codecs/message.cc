#include "codecs/message.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "codecs/codec.h"
#include "core/errors.h"
#include "kernels/onebit.h"

namespace pyring {

size_t message_max_bytes(Wire w, size_t n) {
  return codec_of(w).encoded_bytes(n);
}

size_t encode_message(Wire w, const float* in, float* residual, size_t n, uint8_t* out) {
  const Codec& c = codec_of(w);
  switch (c.schedule()) {
    case Schedule::kExact: {
      float* o = reinterpret_cast<float*>(out);
      if (residual == nullptr) {
        std::memcpy(o, in, 4 * n);
      } else {
        for (size_t i = 0; i < n; ++i) o[i] = in[i] + residual[i];
        std::memset(residual, 0, 4 * n);
      }
      return 4 * n;
    }
    case Schedule::kOnebit: {
      const size_t bytes = onebit_encode(in, residual, n, out);
      for (size_t i = 0; residual != nullptr && i < n; ++i) {
        if (!std::isfinite(residual[i])) residual[i] = 0.0f;
      }
      return bytes;
    }
    case Schedule::kCodec:
      break;
  }
  const KernelSite host{};
  if (residual == nullptr) {
    c.encode(host, in, nullptr, n, out);
    return c.encoded_bytes(n);
  }
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = in[i] + residual[i];
  c.encode(host, v.data(), nullptr, n, out);
  c.decode(host, out, n, false, residual);  // what arrives, then what it left behind
  for (size_t i = 0; i < n; ++i) {
    const float r = v[i] - residual[i];
    residual[i] = std::isfinite(r) ? r : 0.0f;
  }
  return c.encoded_bytes(n);
}

void decode_message(Wire w, const uint8_t* enc, size_t bytes, size_t n, float* out) {
  const Codec& c = codec_of(w);
  if (c.schedule() == Schedule::kOnebit) {
    PYRING_CHECK(bytes >= sizeof(OnebitHeader) && bytes <= onebit_max_bytes(n) &&
                     onebit_bytes(enc, n) == bytes,
                 CommError, "a ", c.name(), " message of ", bytes, " bytes is not an encoding of ",
                 n, " values");
    return onebit_decode(enc, n, 1.0f, false, out);
  }
  PYRING_CHECK(bytes == c.encoded_bytes(n), CommError, "a ", c.name(), " message of ", bytes,
               " bytes is not an encoding of ", n, " values (", c.encoded_bytes(n), " bytes)");
  if (c.schedule() == Schedule::kExact) {
    std::memcpy(out, enc, bytes);
    return;
  }
  c.decode(KernelSite{}, enc, n, false, out);
}

}  // namespace pyring
