// The fp16 and bf16 wires of the compressed allreduce (compressed.h): their codec, and the flat
// schedule pipelined by segment. Each chunk is cut into half_segments() segments; a segment is
// encoded and sent while the ones before it travel, the owner decodes and adds a
// segment's copies as soon as they are in, encodes the result and sends it on at once, and
// every rank decodes each returning segment as it lands. The p2p thread moves the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/compressed.h"
#include "collectives/wire_codec.h"

namespace pyring {

// Segments over fast links (shared memory): kHalfSegmentElems each. Each extra segment costs
// a cross-thread wake-up there, and one chunk in a segment was measured fastest up to 4 MiB.
constexpr size_t kHalfSegmentElems = size_t{1} << 20;
// Over a link the link model rates below kHalfFineBelowBytesPerS (the network): segments of
// kHalfFineSegmentElems, at most kHalfFineSegments per chunk. The owner then sends a
// segment's sum back while later segments still arrive, so the link does not idle while it
// waits for a whole chunk: a 1 MiB DDP bucket at 2 ranks is 5 segments per chunk, not 1.
constexpr double kHalfFineBelowBytesPerS = 2e9;
constexpr size_t kHalfFineSegmentElems = size_t{1} << 15;
constexpr size_t kHalfFineSegments = 16;

// The number of segments of every chunk when the widest holds `widest` values and the slowest
// link of the call's ranks is rated `slowest_bytes_per_s`.
size_t half_segments(size_t widest, double slowest_bytes_per_s);

// out = the decoded 16-bit values.
void half_decode(Wire w, const uint8_t* enc, size_t n, float* out);
// out = the 16-bit encoding of in; returns the bytes written (2n).
size_t half_encode(Wire w, const float* in, size_t n, uint8_t* out);
// The owner's sum: out[i] = (own[i] + decode(copies[0])[i] + ... + decode(copies[count - 1])[i])
// / divisor in float32, added in that order (divisor 1: no division), in one pass over out. The
// device path's kernels (accumulate, then finish_wide) give the same bits.
void half_sum(Wire w, const float* own, int divisor, const uint8_t* const* copies, size_t count,
              size_t n, float* out);

// The flat schedule over `parts` (this rank is parts[me]) on x in place (at the codec's site),
// for wire kFp16 or kBf16.
void half_flat(Communicator& comm, WireCodec& codec, float* x, size_t n,
               const std::vector<int>& parts, int me, Wire wire, int divisor, Deadline deadline);

}  // namespace pyring
