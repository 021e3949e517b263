// The queued operations and held messages of P2pEngine; private to its sources.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/host_memory.h"
#include "core/p2p.h"

namespace pyring {

struct P2pEngine::Op {
  std::shared_ptr<Work> work;
  bool is_send = false;
  P2pAddress addr{};
  uint8_t* data = nullptr;
  size_t bytes = 0;
  Deadline deadline{};
  P2pFrame frame{};        // send: what goes ahead of the payload
  uint64_t end = 0;        // send: Peer::posted_bytes once this op's bytes have left
  int landing = -1;        // receive: the peer whose message is landing in it
  bool into_user = false;  // receive: the link writes into `data` directly
  bool done = false;
};

struct P2pEngine::Held {
  int peer = -1;
  P2pFrame frame{};
  HostBuffer data;  // frame.bytes of it hold the message
  bool complete = false;
  std::shared_ptr<Op> claimed;  // a receive waiting for the rest of the message
};

}  // namespace pyring
