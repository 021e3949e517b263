// Element types, reduction ops and deadlines shared by every layer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace pyring {

// Codes and names of dtypes, ops and algorithms are defined here once; the bindings export
// the names in code order (pyring._C.DTYPE_NAMES, OP_NAMES, ALGO_NAMES) and Python maps them.
enum class DType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
};
constexpr int kNumDTypes = 8;

enum class ReduceOp : int { kSum = 0, kAvg = 1, kMax = 2, kMin = 3, kProd = 4 };
constexpr int kNumReduceOps = 5;

// How a collective is carried out; kAuto lets the selector choose.
enum class Algo : int { kAuto = 0, kRing = 1, kDirect = 2, kTree = 3 };
constexpr int kNumAlgos = 4;

size_t dtype_size(DType t);
const char* algo_name(Algo a);

// What a collective is, on the wire: in its header and in its point-to-point frames.
enum class CollectiveKind : uint32_t {
  kAllReduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kBarrier = 5,
  kGather = 6,
  kScatter = 7,
  kAllToAll = 8,
  // all_reduce zero-copy within each host, its leaders' phase over the links
  // (collectives/zero_copy.h): apart from kAllReduce so that ranks on different paths fail
  // their headers rather than pair their phases.
  kHostsAllReduce = 9,
};
// The torch name of `kind`, or "an unknown collective".
const char* collective_kind_name(uint32_t kind);
Algo algo_from_int(int v);  // throws InvalidArgument naming the valid range
const char* dtype_name(DType t);
const char* op_name(ReduceOp op);
DType dtype_from_int(int v);  // throws InvalidArgument naming the valid range
ReduceOp op_from_int(int v);  // throws InvalidArgument naming the valid range

// What a compressed all_reduce carries on the wire (collectives/compressed.h): a codec's index
// in codecs/registry.cc, which names them (codecs/codec.h); 0 is float32 as it is.
enum class Wire : int { kFp32 = 0 };

// The type partial results travel in during reduce-scatter: float16 and bfloat16 are
// accumulated in float32 and rounded once by the chunk's owner.
inline DType accum_dtype(DType t) {
  return (t == DType::kFloat16 || t == DType::kBFloat16) ? DType::kFloat32 : t;
}

// Where an accumulator (accum_dtype) follows `bytes` of narrower data in one scratch buffer:
// `bytes` rounded up to 8, the alignment of every accumulator type.
inline size_t accum_offset(size_t bytes) {
  return (bytes + 7) / 8 * 8;
}

using Clock = std::chrono::steady_clock;

// An absolute point in time after which a blocking call raises TimeoutError.
struct Deadline {
  Clock::time_point at;
  // A collective's deadline (Communicator::execute) also says what waits on it, so that a wait
  // still pending at `half` warns once (collectives/driver.h). Both pointers live as long as
  // the collective runs; null elsewhere. `what` formats the collective's description when
  // called: only a warning pays for it, not every call.
  Clock::time_point half{};
  const std::function<std::string()>* what = nullptr;
  bool* warned = nullptr;

  static Deadline after(double seconds) {
    return Deadline{Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds))};
  }
  bool expired() const { return Clock::now() >= at; }
  // Milliseconds left, clamped to [0, cap_ms].
  int remaining_ms(int cap_ms) const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now()).count();
    if (left < 0) return 0;
    return left > cap_ms ? cap_ms : static_cast<int>(left);
  }
};

// One alpha-beta figure: a message of n bytes over a link costs alpha_s + n / bytes_per_s.
struct LinkModel {
  double alpha_s;
  double bytes_per_s;
};

// Where a buffer lives. Codes defined once here; the bindings export the names in code order
// (pyring._C.DEVICE_KIND_NAMES).
enum class DeviceKind : int { kCpu = 0, kCuda = 1, kSim = 2 };
constexpr int kNumDeviceKinds = 3;
const char* device_kind_name(DeviceKind k);  // "cpu", "cuda", "sim"
DeviceKind device_kind_from_int(int v);      // throws InvalidArgument naming the valid range

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = -1;  // -1 for the host

  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu", "cuda:0", "sim:1"
};

// A stream of one device as an integer: a cudaStream_t (0: the legacy default stream), or a
// sim stream's id (0: the device's default stream).
using StreamId = uintptr_t;
// A typed view of caller memory. The caller keeps the memory alive and unchanged (for inputs)
// until the collective completes.
// The buffer descriptor: it travels from the Python edge to the kernels and links. `stream` is
// the caller's stream on `device` (0 on the host): work queued on it before the call is what
// the collective must see, and work queued after it must see the result.
struct BufferView {
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  Device device;
  StreamId stream = 0;

  size_t bytes() const { return count * dtype_size(dtype); }
  uint8_t* at(size_t elem) const { return static_cast<uint8_t*>(data) + elem * dtype_size(dtype); }
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace pyring
