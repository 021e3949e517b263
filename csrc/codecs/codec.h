// The wires of the compressed allreduce (collectives/compressed.h): each is a Codec in one
// registry (codecs/registry.cc), which alone holds their names. A Wire is a codec's index there;
// the Python package, the hooks, the optimizers, the benchmarks and the fuzzers take the list
// from it (pyring._C.WIRES).
//
// A codec with Schedule::kCodec runs the generic pipelined schedule (collectives/codec_flat.h)
// through its kernels: fixed-size encodings (encoded_bytes(n) for any n), cut at multiples of
// block(). With error feedback the state keeps, per value, a residual in bfloat16
// (collectives/wire_state.h): encode adds it to what it encodes, and stores there what the
// encoding dropped. The owner's re-encoding of a sum keeps a server residual the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/types.h"
#include "kernels/dispatch.h"

namespace pyring {

enum class Schedule {
  kExact,   // no codec: the ordinary allreduce (fp32)
  kCodec,   // the generic schedule through the codec's kernels
  kOnebit,  // onebit's own schedule (mask caches, deferred scales: collectives/compressed.cc)
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual const char* name() const = 0;
  virtual Schedule schedule() const { return Schedule::kCodec; }
  // Whether calls keep residuals in a state (pyring.OneBitState), which they then require.
  virtual bool error_feedback() const { return false; }
  // The encoding's size for n values, a function of n alone (both ends know a payload's size).
  virtual size_t encoded_bytes(size_t n) const = 0;
  // The values an encoding may be cut at: the encoding of n values, cut after k * block() of
  // them, is the encoding of the first k * block() followed by that of the rest.
  virtual size_t block() const { return 1; }
  // Whether `site`'s device runs the kernels; a codec without device kernels has its device
  // buffers staged through pinned host memory (collectives/placement.h).
  virtual bool device_kernels() const { return false; }

  // out = the encoding of in[0, n) + residual[0, n) (residual: bfloat16 bits at the site, null:
  // none, else replaced by what the encoding dropped, in bfloat16). At a device site the
  // kernels are queued on its stream.
  virtual void encode(const KernelSite& site, const float* in, uint16_t* residual, size_t n,
                      uint8_t* out) const = 0;
  // out[0, n) = decode(enc), or += decode(enc) with accumulate (float32, added in that order:
  // out[i] = d[i] + out[i]).
  virtual void decode(const KernelSite& site, const uint8_t* enc, size_t n, bool accumulate,
                      float* out) const = 0;
};

// Every codec, indexed by Wire.
const std::vector<const Codec*>& codecs();
// The codec of `w`; throws InvalidArgument naming the valid wires for an unknown one.
const Codec& codec_of(Wire w);
// The wire named `name`; throws InvalidArgument naming the valid wires.
Wire wire_named(const std::string& name);
// "fp32", "int8", ..., or "an unknown wire".
const char* wire_name(Wire w);
// Wire from its index as Python passes it; throws InvalidArgument naming the valid wires.
Wire wire_from_int(int v);

}  // namespace pyring
