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

namespace pyring {

constexpr size_t kHalfSegmentElems = size_t{1} << 20;

// v's memory, grown to at least n elements (never shrunk): the compressed collective's buffers
// are reused across calls, so that a size seen before takes no page faults.
template <class T>
T* grown(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// out = alpha * decoded 16-bit values (or out += with accumulate), in one pass.
void half_decode(Wire w, const uint8_t* enc, size_t n, float alpha, bool accumulate, float* out);
// out = the 16-bit encoding of in; returns the bytes written (2n).
size_t half_encode(Wire w, const float* in, size_t n, uint8_t* out);

// The flat schedule over `parts` (this rank is parts[me]) on x in place, for wire kFp16 or
// kBf16. `send`, `recv` and `back` are grown to what the call needs and reused.
void half_flat(Communicator& comm, float* x, size_t n, const std::vector<int>& parts, int me,
               Wire wire, float alpha, std::vector<uint8_t>& send, std::vector<uint8_t>& recv,
               std::vector<uint8_t>& back, std::vector<float>& acc, Deadline deadline);

}  // namespace pyring
