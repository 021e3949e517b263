// Typed errors and the check macros that throw them. Each type maps to one Python exception
// (see bindings/errors_binding.cc): Error -> pyring.Error, CommError -> pyring.CommError,
// TimeoutError -> pyring.CommTimeout, CudaError -> pyring.CudaError, InvalidArgument ->
// ValueError, TypeMismatch -> TypeError.
#pragma once

#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

namespace pyring {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A link failed, a peer died or aborted, or peers disagreed on the protocol.
class CommError : public Error {
 public:
  using Error::Error;
};

// The peer's end of a link went away: it said it gave up (`gave_up`), or its connection closed
// or reset, because it died or gave up. A peer that gave up announces its cause on the
// point-to-point links (P2pEngine::announce_abort).
class PeerLost : public CommError {
 public:
  PeerLost(int peer, const std::string& what, bool gave_up = false)
      : CommError(what), peer_(peer), gave_up_(gave_up) {}
  int peer() const { return peer_; }
  bool gave_up() const { return gave_up_; }

 private:
  int peer_;
  bool gave_up_;
};

// A deadline passed before the operation completed.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// A device stopped with a fault (an illegal address, a failed launch: CUDA's sticky errors)
// while a collective waited on it; the message names the device's error, the device and what
// waited. A CommError: the communicator gives up and its peers are told at once.
class DeviceFault : public CommError {
 public:
  using CommError::CommError;
};

// A CUDA runtime call failed; the message names the call and the device.
class CudaError : public Error {
 public:
  using Error::Error;
};

// A device allocation failed for want of memory (cudaErrorMemoryAllocation).
class DeviceOutOfMemory : public CudaError {
 public:
  using CudaError::CudaError;
};

class InvalidArgument : public Error {
 public:
  using Error::Error;
};

class TypeMismatch : public Error {
 public:
  using Error::Error;
};

template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Rethrows the in-flight pyring error with `prefix` prepended, keeping its type.
[[noreturn]] void rethrow_with_prefix(const std::string& prefix);

}  // namespace pyring

#define PYRING_THROW(type, ...) throw type(::pyring::str_cat(__VA_ARGS__))

#define PYRING_CHECK(cond, type, ...)  \
  do {                                 \
    if (!(cond)) {                     \
      PYRING_THROW(type, __VA_ARGS__); \
    }                                  \
  } while (0)

#define PYRING_CHECK_ARG(cond, ...) PYRING_CHECK(cond, ::pyring::InvalidArgument, __VA_ARGS__)

// Throws CommError with strerror(errno) appended when `expr` is false.
#define PYRING_CHECK_ERRNO(cond, ...)                                                     \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      int pyring_errno_ = errno;                                                          \
      PYRING_THROW(::pyring::CommError, __VA_ARGS__, ": ", std::strerror(pyring_errno_)); \
    }                                                                                     \
  } while (0)
