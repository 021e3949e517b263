// One message of float32 values on any wire of the registry, on the host, for point-to-point
// senders that keep their own error feedback (the parameter server's pushes,
// pyring/optim/parameter_server.py). The compressed allreduce does not use it: it runs the
// codecs' kernels through its own schedules (collectives/compressed.h).
//
// Contract:
// - encode_message writes the encoding of v = in + residual (residual null: v = in) and returns
//   its bytes, at most message_max_bytes(w, n); with a residual it stores there what the
//   encoding dropped, v - decode(encoding), in float32 (zero on fp32, which drops nothing; zero
//   where that is not finite, so that one non-finite value does not poison later messages).
// - decode_message writes decode(enc) into out[0, n) and throws CommError, before writing, when
//   `bytes` is not what the wire's encoding of n values takes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/types.h"

namespace pyring {

size_t message_max_bytes(Wire w, size_t n);
size_t encode_message(Wire w, const float* in, float* residual, size_t n, uint8_t* out);
void decode_message(Wire w, const uint8_t* enc, size_t bytes, size_t n, float* out);

}  // namespace pyring
