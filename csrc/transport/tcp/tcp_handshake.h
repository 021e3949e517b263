// The messages that open a tcp link, and their checks. Pure functions of bytes, so that the
// parser can be fuzzed (tests/fuzz/).
//
// The acceptor sends a Challenge as soon as it accepts; the connector answers with a Hello
// whose MAC covers both nonces and both ranks under the job's secret; the acceptor answers a
// valid Hello with an Ack whose MAC the connector checks in turn. The secret never travels,
// and a recorded exchange cannot be replayed (the acceptor's nonce is new on every accept).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pyring {

constexpr size_t kSecretBytes = 32;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;

// `nstreams`: the acceptor's connections per link, so that a connector with another count can
// fail naming both before it sends its Hello (the Hello's count is the authenticated one).
struct Challenge {
  uint32_t magic;
  uint16_t version;
  uint16_t nstreams;
  uint8_t nonce[kNonceBytes];
};
static_assert(sizeof(Challenge) == 40, "Challenge is part of the wire format");

// A link may be several connections (PYRING_SOCKET_NSTREAMS): `stream` numbers this one among
// the link's `nstreams`, and both count for the MAC.
struct Hello {
  uint32_t magic;
  int32_t from_rank;
  int32_t to_rank;
  uint16_t stream;
  uint16_t nstreams;
  uint8_t nonce[kNonceBytes];
  uint8_t mac[kMacBytes];
};
static_assert(sizeof(Hello) == 80, "Hello is part of the wire format");

struct Ack {
  uint8_t mac[kMacBytes];
};

// What the acceptor made of the bytes a connection sent.
enum class HelloVerdict {
  kOk,
  kGarbage,      // not a pyring hello (magic or version)
  kBadMac,       // a hello whose MAC fails: another job's secret, or forged
  kNotExpected,  // authentic, but not for this rank or from a rank it does not expect
};

// Fills `nonce` from the kernel's random source.
void random_nonce(uint8_t* nonce);

Challenge make_challenge(int nstreams = 1);
bool check_challenge(const uint8_t* bytes, size_t n);  // magic and version
Hello make_hello(const std::string& secret, const Challenge& challenge, int from_rank, int to_rank,
                 int stream = 0, int nstreams = 1);
// Checks `n` bytes received as a Hello against the Challenge this acceptor sent (a stream
// number not below the stream count is garbage). When the verdict is kOk or kNotExpected
// (addressed to another rank), `*hello` holds the Hello; whether this rank awaits its rank,
// stream and stream count is the caller's to check.
HelloVerdict check_hello(const uint8_t* bytes, size_t n, const std::string& secret,
                         const Challenge& challenge, int this_rank, Hello* hello);
Ack make_ack(const std::string& secret, const Challenge& challenge, const Hello& hello);
bool check_ack(const uint8_t* bytes, size_t n, const std::string& secret,
               const Challenge& challenge, const Hello& hello);

}  // namespace pyring
