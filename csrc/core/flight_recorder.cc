#include "core/flight_recorder.h"

#include <chrono>
#include <cstdio>

#include "core/errors.h"

namespace pyring {

namespace {
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double steady_now() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}
}  // namespace

const char* flight_state_name(FlightEntry::State s) {
  switch (s) {
    case FlightEntry::kRunning:
      return "running";
    case FlightEntry::kCompleted:
      return "completed";
    case FlightEntry::kFailed:
      return "failed";
    case FlightEntry::kTimedOut:
      return "timed out";
  }
  return "?";
}

FlightRecorder::FlightRecorder(size_t capacity)
    : capacity_(capacity), wall_minus_steady_(wall_now() - steady_now()), ring_(capacity) {}

FlightEntry* FlightRecorder::newest() {
  return recorded_ == 0 ? nullptr : &ring_[(recorded_ - 1) % capacity_];
}

void FlightRecorder::begin(uint64_t seq, const CollectiveDesc& desc) {
  if (capacity_ == 0) return;
  const double now = steady_now();
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry& e = ring_[recorded_++ % capacity_];
  e.seq = seq;
  e.name = desc.name;
  e.count = desc.has_data ? desc.count : 0;
  e.dtype = desc.dtype;
  e.op = desc.op;
  e.root = desc.root;
  e.algo = "";
  e.start_s = now;  // steady until snapshot() converts it
  e.duration_s = -1;
  e.state = FlightEntry::kRunning;
  e.error.clear();
}

void FlightRecorder::set_algo(const char* algo) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry* e = newest();
  if (e && e->state == FlightEntry::kRunning) e->algo = algo;
}

void FlightRecorder::end(FlightEntry::State state, const std::string& error) {
  if (capacity_ == 0) return;
  const double now = steady_now();
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry* e = newest();
  if (!e || e->state != FlightEntry::kRunning) return;
  e->state = state;
  e->duration_s = now - e->start_s;
  if (!error.empty()) e->error = error;
}

std::vector<FlightEntry> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FlightEntry> out;
  const uint64_t first = recorded_ > capacity_ ? recorded_ - capacity_ : 0;
  for (uint64_t i = first; i < recorded_; ++i) {
    out.push_back(ring_[i % capacity_]);
    out.back().start_s += wall_minus_steady_;
  }
  return out;
}

std::string FlightRecorder::format() const {
  std::string out;
  for (const auto& e : snapshot()) {
    char when[64];
    std::snprintf(when, sizeof(when), "%.6f", e.start_s);
    out += str_cat("  #", e.seq, " ", e.name, " count=", e.count, " dtype=", dtype_name(e.dtype));
    if (e.op >= 0) out += str_cat(" op=", op_name(static_cast<ReduceOp>(e.op)));
    if (e.root >= 0) out += str_cat(" root=", e.root);
    if (*e.algo) out += str_cat(" algo=", e.algo);
    out += str_cat(" start=", when, " ", flight_state_name(e.state));
    if (e.duration_s >= 0) out += str_cat(" after ", e.duration_s * 1e3, " ms");
    if (!e.error.empty()) out += str_cat(": ", e.error);
    out += "\n";
  }
  return out;
}

}  // namespace pyring
