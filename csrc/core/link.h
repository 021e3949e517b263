// The Link interface: moves byte ranges between this rank and one peer, in both directions.
// Implementations live in transport/ (one folder per transport); the Communicator owns them.
//
// Contract:
// - Sends and receives are queued and complete in the order they were posted, per direction.
//   Each direction is a byte stream: the receiver's messages must cover the sender's bytes in
//   order, but may cut them elsewhere (the ring receives as one message what its left
//   neighbour forwarded piece by piece); a zero-byte message is a no-op.
// - A Link is driven by one thread at a time (the thread running the current collective):
//   post_*() only queue, progress() moves bytes without blocking.
// - Memory passed to post_send() must stay valid and unchanged until idle() is true.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace pyring {

// Receive granularity: pieces handed to on_piece are multiples of kPieceAlign bytes (except the
// last of a message) when copy_to is null, so that every element type reduces in whole elements.
constexpr size_t kPieceAlign = 8;

struct RecvSpec {
  size_t bytes = 0;
  // When set, the message lands here in order.
  uint8_t* copy_to = nullptr;
  // Called for each piece in order; `data` is copy_to + offset when copy_to is set, otherwise
  // transport memory valid only during the call. May post sends on any link.
  std::function<void(const uint8_t* data, size_t offset, size_t len)> on_piece;
};

class Link {
 public:
  explicit Link(int peer) : peer_(peer) {}
  virtual ~Link() = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  int peer() const { return peer_; }
  virtual const char* kind() const = 0;

  virtual void post_send(const uint8_t* data, size_t bytes) = 0;
  virtual void post_recv(RecvSpec spec) = 0;

  // Moves what it can without blocking; returns true if any byte moved. Throws CommError when
  // the peer is gone or the stream is broken.
  virtual bool progress() = 0;
  // Nothing is queued in either direction.
  virtual bool idle() const = 0;
  // Some posted send has bytes not yet handed to the transport (its buffer is still read).
  virtual bool sending() const = 0;
  // A human-readable account of what is still queued, for timeout messages.
  virtual std::string pending() const = 0;

  // Blocking support for the driver: a socket to poll, or a futex word shared by every shm link
  // of this rank (see ShmLink). Exactly one of them applies.
  virtual int poll_fd() const { return -1; }
  virtual bool wants_write() const { return false; }
  virtual std::atomic<uint32_t>* sleep_word() { return nullptr; }
  // Whether a driver that found nothing to move should poll for up to `spin_us` before it
  // blocks: false when what this link waits for is not expected within that time (bytes of a
  // slow link still to come), so that polling would only take the core from the caller's
  // compute. A link that answers false also arranges that a blocked driver wakes once per
  // piece, not once per packet.
  virtual bool spin_worthwhile(int /*spin_us*/) { return true; }
  // The TCP connections this link uses (0: none, as for shm).
  virtual size_t connections() const { return 0; }

  // Throws CommError when the peer is known to have died, given up or closed its
  // communicator. A driver asks only while this link waits (not idle), and fails only once
  // nothing more moves: a peer that ended right after its last send left those bytes here.
  virtual void check_peer() {}
  // This rank will not use the link again (its communicator closed after its last
  // collective finished): the peer learns it, so that a peer still waiting on this rank for
  // bytes that will never come fails at once rather than at its deadline. Bytes already sent
  // stay receivable. Idempotent.
  virtual void announce_closed() {}
  // Tells the peer that this rank gave up; later calls on this link fail. The peer's link
  // throws PeerLost, and the cause travels on the p2p links (P2pEngine::announce_abort).
  virtual void abort() {}

  // Bytes moved over this link since it was created, collective headers included. Readable
  // from any thread while the link is driven.
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }
  // Of bytes_sent, those copied to the peer with non-temporal stores (shm; see SlotCopier).
  uint64_t bytes_streamed() const { return bytes_streamed_.load(std::memory_order_relaxed); }

 protected:
  // Called by the driving thread as bytes leave or arrive.
  void count_sent(size_t n) { bytes_sent_.fetch_add(n, std::memory_order_relaxed); }
  void count_received(size_t n) { bytes_received_.fetch_add(n, std::memory_order_relaxed); }
  void count_streamed(size_t n) { bytes_streamed_.fetch_add(n, std::memory_order_relaxed); }

  int peer_;

 private:
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> bytes_streamed_{0};
};

}  // namespace pyring
