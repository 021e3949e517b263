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

void FlightRecorder::begin(uint64_t seq, const CollectiveDesc& desc) {
  if (capacity_ == 0) return;
  FlightEntry e;
  e.seq = seq;
  e.name = desc.name;
  e.count = desc.has_data ? desc.count : 0;
  e.dtype = desc.dtype;
  e.op = desc.op;
  e.root = desc.root;
  e.start_s = wall_now();
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.size() == capacity_) entries_.pop_front();
  entries_.push_back(std::move(e));
  started_ = steady_now();
}

void FlightRecorder::set_algo(const char* algo) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!entries_.empty() && entries_.back().state == FlightEntry::kRunning) {
    entries_.back().algo = algo;
  }
}

void FlightRecorder::end(FlightEntry::State state, const std::string& error) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.empty() || entries_.back().state != FlightEntry::kRunning) return;
  FlightEntry& e = entries_.back();
  e.state = state;
  e.duration_s = steady_now() - started_;
  e.error = error;
}

std::vector<FlightEntry> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {entries_.begin(), entries_.end()};
}

std::string FlightRecorder::format() const {
  std::string out;
  for (const auto& e : snapshot()) {
    char when[64];
    std::snprintf(when, sizeof(when), "%.6f", e.start_s);
    out += str_cat("  #", e.seq, " ", e.name, " count=", e.count, " dtype=", dtype_name(e.dtype));
    if (e.op >= 0) out += str_cat(" op=", op_name(static_cast<ReduceOp>(e.op)));
    if (e.root >= 0) out += str_cat(" root=", e.root);
    if (!e.algo.empty()) out += str_cat(" algo=", e.algo);
    out += str_cat(" start=", when, " ", flight_state_name(e.state));
    if (e.duration_s >= 0) out += str_cat(" after ", e.duration_s * 1e3, " ms");
    if (!e.error.empty()) out += str_cat(": ", e.error);
    out += "\n";
  }
  return out;
}

}  // namespace pyring
