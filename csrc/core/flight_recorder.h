// The flight recorder: this rank's last N collectives, kept in memory for post-mortems.
//
// Every collective the Communicator runs is recorded when it starts and updated when it ends;
// the selector notes the algorithm it chose. A snapshot can be taken from any thread while
// collectives run (Communicator::debug_dump), and the Communicator prints one to stderr the
// first time a collective fails or times out.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "core/work.h"

namespace pyring {

struct FlightEntry {
  enum State { kRunning, kCompleted, kFailed, kTimedOut };
  uint64_t seq = 0;  // the collective's sequence number on this communicator (1 for the first)
  std::string name;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  int op = -1;
  int root = -1;
  std::string algo;        // "" until the selector has chosen
  double start_s = 0;      // wall clock (seconds since the epoch), comparable across hosts
  double duration_s = -1;  // -1 while running
  State state = kRunning;
  std::string error;  // kFailed, kTimedOut: the exception's text
};
const char* flight_state_name(FlightEntry::State s);

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity) : capacity_(capacity) {}

  // Thread-safe. begin/end/set_algo are called by the thread running the collective.
  void begin(uint64_t seq, const CollectiveDesc& desc);
  void set_algo(const char* algo);
  void end(FlightEntry::State state, const std::string& error = "");
  std::vector<FlightEntry> snapshot() const;
  // One line per entry, oldest first.
  std::string format() const;
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<FlightEntry> entries_;  // guarded by mu_; newest at the back
  double started_ = 0;               // steady-clock start of the running entry
};

}  // namespace pyring
