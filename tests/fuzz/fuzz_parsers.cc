// libFuzzer target over the parsers of bytes and structures that come from other processes:
// the collective header, the tcp handshake messages, the topology the ranks agreed on, and
// one-bit wire segments. The first byte picks the parser. A refusal (pyring::Error) is a pass;
// a crash, a sanitizer report or a hang is a failure. Built and run by tests/test_fuzz_native.py.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/header.h"
#include "core/errors.h"
#include "core/topology.h"
#include "kernels/onebit.h"
#include "transport/tcp/tcp_handshake.h"

namespace {

using namespace pyring;

struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
};

void wire_header(const uint8_t* data, size_t size) {
  WireHeader h{};
  std::memcpy(&h, data, std::min(size, sizeof(h)));
  std::string s = describe_header(h);
  if (s.empty()) __builtin_trap();
}

void handshake(const uint8_t* data, size_t size) {
  static const std::string secret(kSecretBytes, 's');
  static const Challenge challenge = make_challenge();
  static const Hello hello = make_hello(secret, challenge, 0, 1);
  check_challenge(data, size);
  Hello got{};
  HelloVerdict v = check_hello(data, size, secret, challenge, 1, &got);
  // A hello nobody made with the secret must never pass.
  if (v == HelloVerdict::kOk && std::memcmp(data + 16, hello.nonce, kNonceBytes) != 0) {
    __builtin_trap();
  }
  if (check_ack(data, size, secret, challenge, hello)) __builtin_trap();
}

void topology(const uint8_t* data, size_t size) {
  Reader in{data, size};
  int world = 1 + in.byte() % 12;
  Topology t;
  int levels = in.byte() % 4;
  for (int l = 0; l < levels; ++l) {
    t.level_names.push_back("level" + std::to_string(l));
    std::vector<std::vector<int>> groups(in.byte() % 7);
    for (auto& g : groups) {
      g.resize(in.byte() % 7);
      for (auto& r : g) r = static_cast<int8_t>(in.byte()) % 16;
    }
    t.groups.push_back(std::move(groups));
  }
  try {
    t.validate(world);
  } catch (const InvalidArgument&) {
    return;
  }
  auto ring = t.ring_order();
  if (ring.size() != static_cast<size_t>(world)) __builtin_trap();
  address_order(t);
  t.str();
  for (int r = 0; r < world; ++r) {
    tree_plan(t, r);
    for (int p : needed_peers(t, r)) {
      if (p < 0 || p >= world || p == r) __builtin_trap();
    }
  }
}

void onebit(const uint8_t* data, size_t size) {
  if (size < 2) return;
  size_t n = (data[0] | (data[1] << 8)) % 2048;
  // The transport hands the decoder a whole segment's bytes: here the input, zero padded.
  std::vector<uint8_t> encoded(onebit_max_bytes(n) + size, 0);
  std::memcpy(encoded.data(), data + 2, size - 2);
  std::vector<float> out(n);
  std::vector<uint8_t> cache(onebit_cache_bytes(n), 0);
  try {
    if (onebit_bytes(encoded.data(), n) > encoded.size()) return;
    onebit_decode(encoded.data(), n, 0.5f, (size & 1) != 0, out.data(), cache.data());
  } catch (const CommError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t which = data[0] % 4;
  ++data;
  --size;
  try {
    switch (which) {
      case 0:
        wire_header(data, size);
        break;
      case 1:
        handshake(data, size);
        break;
      case 2:
        topology(data, size);
        break;
      default:
        onebit(data, size);
    }
  } catch (const InvalidArgument&) {
  }
  return 0;
}
