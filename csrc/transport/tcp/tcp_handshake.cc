#include "transport/tcp/tcp_handshake.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "core/errors.h"
#include "transport/tcp/hmac_sha256.h"

namespace pyring {

namespace {
constexpr uint32_t kChallengeMagic = 0x50524743;  // "PRGC"
constexpr uint32_t kHelloMagic = 0x50524748;      // "PRGH"
constexpr uint16_t kVersion = 3;
constexpr char kHelloLabel[] = "pyring-hello";
constexpr char kAckLabel[] = "pyring-ack";

Digest hello_mac(const std::string& secret, const Challenge& c, const Hello& h) {
  return hmac_sha256(secret.data(), secret.size(),
                     {{kHelloLabel, sizeof(kHelloLabel)},
                      {c.nonce, kNonceBytes},
                      {&h.from_rank, sizeof(h.from_rank)},
                      {&h.to_rank, sizeof(h.to_rank)},
                      {&h.stream, sizeof(h.stream)},
                      {&h.nstreams, sizeof(h.nstreams)},
                      {h.nonce, kNonceBytes}});
}
}  // namespace

void random_nonce(uint8_t* nonce) {
  size_t got = 0;
  while (got < kNonceBytes) {
    ssize_t r = getrandom(nonce + got, kNonceBytes - got, 0);
    if (r < 0 && errno == EINTR) continue;
    PYRING_CHECK_ERRNO(r > 0, "getrandom");
    got += static_cast<size_t>(r);
  }
}

Challenge make_challenge(int nstreams) {
  Challenge c{kChallengeMagic, kVersion, static_cast<uint16_t>(nstreams), {}};
  random_nonce(c.nonce);
  return c;
}

bool check_challenge(const uint8_t* bytes, size_t n) {
  if (n != sizeof(Challenge)) return false;
  Challenge c;
  std::memcpy(&c, bytes, sizeof(c));
  return c.magic == kChallengeMagic && c.version == kVersion;
}

Hello make_hello(const std::string& secret, const Challenge& challenge, int from_rank, int to_rank,
                 int stream, int nstreams) {
  PYRING_CHECK_ARG(nstreams >= 1 && nstreams <= UINT16_MAX && stream >= 0 && stream < nstreams,
                   "stream ", stream, " of ", nstreams, " is not a valid stream");
  Hello h{kHelloMagic,
          from_rank,
          to_rank,
          static_cast<uint16_t>(stream),
          static_cast<uint16_t>(nstreams),
          {},
          {}};
  random_nonce(h.nonce);
  Digest mac = hello_mac(secret, challenge, h);
  std::memcpy(h.mac, mac.data(), kMacBytes);
  return h;
}

HelloVerdict check_hello(const uint8_t* bytes, size_t n, const std::string& secret,
                         const Challenge& challenge, int this_rank, Hello* hello) {
  if (n != sizeof(Hello)) return HelloVerdict::kGarbage;
  Hello h;
  std::memcpy(&h, bytes, sizeof(h));
  if (h.magic != kHelloMagic || h.stream >= h.nstreams) return HelloVerdict::kGarbage;
  Digest mac = hello_mac(secret, challenge, h);
  if (!digest_equal(mac.data(), h.mac)) return HelloVerdict::kBadMac;
  *hello = h;
  return h.to_rank == this_rank ? HelloVerdict::kOk : HelloVerdict::kNotExpected;
}

Ack make_ack(const std::string& secret, const Challenge& challenge, const Hello& hello) {
  Digest mac = hmac_sha256(secret.data(), secret.size(),
                           {{kAckLabel, sizeof(kAckLabel)},
                            {hello.nonce, kNonceBytes},
                            {challenge.nonce, kNonceBytes},
                            {&hello.from_rank, sizeof(hello.from_rank)},
                            {&hello.to_rank, sizeof(hello.to_rank)}});
  Ack a;
  std::memcpy(a.mac, mac.data(), kMacBytes);
  return a;
}

bool check_ack(const uint8_t* bytes, size_t n, const std::string& secret,
               const Challenge& challenge, const Hello& hello) {
  if (n != sizeof(Ack)) return false;
  Ack want = make_ack(secret, challenge, hello);
  return digest_equal(want.mac, bytes);
}

}  // namespace pyring
