// The fp16 and bf16 wires of the compressed allreduce (compressed.h): their codec, and the flat
// schedule pipelined by segment. Each chunk is cut into segments of kHalfSegmentElems; a
// segment is encoded and sent while the ones before it travel, the owner decodes and adds a
// segment's copies as soon as they are in, encodes the result and sends it on at once, and
// every rank decodes each returning segment as it lands. The p2p thread moves the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/compressed.h"
#include "collectives/wire_codec.h"

namespace pyring {

constexpr size_t kHalfSegmentElems = size_t{1} << 20;

// out = alpha * decoded 16-bit values (or out += with accumulate), in one pass.
void half_decode(Wire w, const uint8_t* enc, size_t n, float alpha, bool accumulate, float* out);
// out = the 16-bit encoding of in; returns the bytes written (2n).
size_t half_encode(Wire w, const float* in, size_t n, uint8_t* out);

// The flat schedule over `parts` (this rank is parts[me]) on x in place (at the codec's site),
// for wire kFp16 or kBf16.
void half_flat(Communicator& comm, WireCodec& codec, float* x, size_t n,
               const std::vector<int>& parts, int me, Wire wire, float alpha, Deadline deadline);

}  // namespace pyring
