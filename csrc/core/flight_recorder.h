// The flight recorder: this rank's last N collectives, kept in memory for post-mortems.
//
// Every collective the Communicator runs is recorded when it starts and updated when it ends;
// the selector notes the algorithm it chose. A snapshot can be taken from any thread while
// collectives run (Communicator::debug_dump), and the Communicator prints one to stderr the
// first time a collective fails or times out.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/work.h"

namespace pyring {

struct FlightEntry {
  enum State { kRunning, kCompleted, kFailed, kTimedOut };
  uint64_t seq = 0;       // the collective's sequence number on this communicator (1 for the first)
  const char* name = "";  // static storage, as CollectiveDesc::name
  size_t count = 0;
  DType dtype = DType::kFloat32;
  int op = -1;
  int root = -1;
  const char* algo = "";   // "" until the selector has chosen; static storage
  double start_s = 0;      // wall clock (seconds since the epoch), comparable across hosts
  double duration_s = -1;  // -1 while running
  State state = kRunning;
  std::string error;  // kFailed, kTimedOut: the exception's text
};
const char* flight_state_name(FlightEntry::State s);

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity);

  // Thread-safe. begin/end/set_algo are called by the thread running the collective; they
  // allocate nothing (a ring of `capacity` entries) and read the clock once each.
  void begin(uint64_t seq, const CollectiveDesc& desc);
  void set_algo(const char* algo);  // `algo` has static storage
  void end(FlightEntry::State state, const std::string& error = "");
  std::vector<FlightEntry> snapshot() const;
  // One line per entry, oldest first.
  std::string format() const;
  size_t capacity() const { return capacity_; }

 private:
  FlightEntry* newest();  // null when empty; the caller holds mu_

  const size_t capacity_;
  const double wall_minus_steady_;  // converts steady-clock seconds to the wall clock
  mutable std::mutex mu_;
  std::vector<FlightEntry> ring_;  // guarded by mu_; entry i of the history at i % capacity_
  uint64_t recorded_ = 0;          // entries ever begun; guarded by mu_
};

}  // namespace pyring
