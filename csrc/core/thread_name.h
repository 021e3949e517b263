// Names for pyring's own threads, as the OS shows them (top -H, ps -L, /proc/PID/task/*/comm,
// gdb, perf), so that their CPU time is told apart from the caller's.
#pragma once

#include <pthread.h>

#include <cstring>

namespace pyring {

constexpr const char* kProgressThreadName = "pyring-progress";  // collectives in order
constexpr const char* kP2pThreadName = "pyring-p2p";            // point-to-point frames
constexpr const char* kCallbackThreadName = "pyring-callback";  // futures' callbacks
constexpr const char* kSimStreamThreadName = "pyring-simstrm";  // a sim device stream

// Names the calling thread; the OS keeps at most 15 characters. Best effort: a failure leaves
// the inherited name.
inline void name_this_thread(const char* name) noexcept {
  char buf[16] = {};
  std::strncpy(buf, name, sizeof(buf) - 1);
  pthread_setname_np(pthread_self(), buf);
}

}  // namespace pyring
