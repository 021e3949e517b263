// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for authenticating tcp links with the job's
// secret without sending it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace pyring {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  Digest finish();  // the object may not be updated afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

// HMAC-SHA256 of the concatenation of `parts` under `key`.
struct Bytes {
  const void* data;
  size_t size;
};
Digest hmac_sha256(const void* key, size_t key_len, std::initializer_list<Bytes> parts);

// Compares in time independent of where the digests differ.
bool digest_equal(const uint8_t* a, const uint8_t* b);

}  // namespace pyring
