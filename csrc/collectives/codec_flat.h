// The generic schedule of the compressed allreduce (compressed.h) for a codec with
// Schedule::kCodec (codecs/codec.h): fp16, bf16, int8, and any codec the registry adds. Each
// chunk is cut into codec_segments() segments; a segment is encoded and sent while the ones
// before it travel, the owner decodes and adds a segment's copies as soon as they are in,
// encodes the result and sends it on at once, and every rank decodes each returning segment as
// it lands. The p2p thread moves the bytes. Segment boundaries are multiples of the codec's
// block(), so that a segment's encoding is a piece of the chunk's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codecs/codec.h"
#include "collectives/compressed.h"
#include "collectives/wire_codec.h"

namespace pyring {

// Segments over fast links (shared memory): kCodecSegmentElems each. Each extra segment costs
// a cross-thread wake-up there, and one chunk in a segment was measured fastest up to 4 MiB.
constexpr size_t kCodecSegmentElems = size_t{1} << 20;
// Over a link the link model rates below kCodecFineBelowBytesPerS (the network): segments of
// kCodecFineSegmentElems, at most kCodecFineSegments per chunk. The owner then sends a
// segment's sum back while later segments still arrive, so the link does not idle while it
// waits for a whole chunk: a 1 MiB DDP bucket at 2 ranks is 5 segments per chunk, not 1.
constexpr double kCodecFineBelowBytesPerS = 2e9;
constexpr size_t kCodecFineSegmentElems = size_t{1} << 15;
constexpr size_t kCodecFineSegments = 16;

// The number of segments of every chunk when the widest holds `widest` values and the slowest
// link of the call's ranks is rated `slowest_bytes_per_s`.
size_t codec_segments(size_t widest, double slowest_bytes_per_s);

// The flat schedule over `parts` (this rank is parts[me]) on x in place (at the codec's site).
// With error feedback, `state` (bound here) keeps the worker residual of x and the server
// residual of the owned chunk. The owner's sum is own[i] + decode(copy 0)[i] + ... in
// participant order, in float32, divided by `divisor` (1: sum; the world size: avg).
void codec_flat(Communicator& comm, WireCodec& codec, float* x, size_t n,
                const std::vector<int>& parts, int me, const Codec& wire, int divisor,
                WireState* state, Deadline deadline);

}  // namespace pyring
