#include <cuda.h>  // CU* types only: libcuda is not linked, its functions are looked up at run time
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/errors.h"
#include "device/cuda/cuda_runtime.h"
#include "kernels/cuda_kernels.h"

// Throws CudaError naming `call`, device `index` and CUDA's message when `call` does not return
// cudaSuccess. Clears the thread's last error before throwing, so that a later launch check
// (cudaGetLastError) does not report this failure again.
#define PYRING_CUDA_CHECK_ON(index, call)                                                      \
  do {                                                                                         \
    const cudaError_t pyring_err_ = (call);                                                    \
    if (pyring_err_ != cudaSuccess) {                                                          \
      cudaGetLastError();                                                                      \
      PYRING_THROW(::pyring::CudaError, #call, " failed on CUDA device ", (index), ": ",       \
                   cudaGetErrorName(pyring_err_), " (", cudaGetErrorString(pyring_err_), ")"); \
    }                                                                                          \
  } while (0)

namespace pyring {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) + sizeof(uint64_t) <= sizeof(IpcHandle::bytes),
              "an IpcHandle holds a cudaIpcMemHandle_t and a 64-bit offset");
static_assert(sizeof(Flag) == sizeof(uint64_t) && alignof(Flag) >= 8,
              "a flag is an aligned 64-bit word the stream memory operations read and write");

// The driver API version whose prototypes the PFN types below describe; CMake refuses toolkits
// before it.
constexpr unsigned int kDriverApiVersion = 12000;

// The driver functions pyring calls, looked up once per process. A null function is missing
// from the driver (or there is no driver); `missing` says which and why.
struct DriverApi {
  PFN_cuStreamWriteValue64_v11070 write_value64 = nullptr;
  PFN_cuStreamWaitValue64_v11070 wait_value64 = nullptr;
  PFN_cuMemGetAddressRange_v3020 get_address_range = nullptr;
  PFN_cuGetErrorString_v6000 error_string = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_attribute = nullptr;
  PFN_cuDevicePrimaryCtxGetState_v7000 primary_ctx_state = nullptr;
  std::string missing;
};

template <class Fn>
void lookup(const char* symbol, Fn* fn, std::string* missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &p, kDriverApiVersion, cudaEnableDefault, &status);
  const char* query = "cudaGetDriverEntryPointByVersion";
#else
  // Before CUDA 12.5 the symbol's version is the one of the toolkit pyring was built with (12.0
  // or later), whose prototypes the PFN types below describe as well.
  const cudaError_t err = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &status);
  const char* query = "cudaGetDriverEntryPoint";
#endif
  if (err == cudaSuccess && status == cudaDriverEntryPointSuccess && p != nullptr) {
    *fn = reinterpret_cast<Fn>(p);
    return;
  }
  if (err != cudaSuccess) cudaGetLastError();
  const std::string why = err != cudaSuccess ? str_cat(query, " failed: ", cudaGetErrorString(err),
                                                       " (a driver older than CUDA 12.0, or none)")
                          : status == cudaDriverEntryPointVersionNotSufficent
                              ? std::string("not available at driver API version 12.0")
                              : std::string("not provided by the driver");
  missing->append(str_cat(missing->empty() ? "" : "; ", symbol, ": ", why));
}

const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi a;
    lookup("cuStreamWriteValue64", &a.write_value64, &a.missing);
    lookup("cuStreamWaitValue64", &a.wait_value64, &a.missing);
    lookup("cuMemGetAddressRange", &a.get_address_range, &a.missing);
    lookup("cuGetErrorString", &a.error_string, &a.missing);
    lookup("cuDeviceGet", &a.device_get, &a.missing);
    lookup("cuDeviceGetAttribute", &a.device_attribute, &a.missing);
    lookup("cuDevicePrimaryCtxGetState", &a.primary_ctx_state, &a.missing);
    return a;
  }();
  return api;
}

// Throws CudaError naming `call`, device `index` and the driver's message unless r succeeded.
void check_driver(CUresult r, const char* call, int index) {
  if (r == CUDA_SUCCESS) return;
  const char* msg = nullptr;
  if (driver().error_string == nullptr || driver().error_string(r, &msg) != CUDA_SUCCESS) {
    msg = nullptr;
  }
  PYRING_THROW(CudaError, call, " failed on CUDA device ", index, ": CUresult ",
               static_cast<int>(r), " (", msg ? msg : "unknown error", ")");
}

// The stream memory operations; throws CudaError when the driver lacks them.
const DriverApi& stream_mem_ops(int index) {
  const DriverApi& d = driver();
  PYRING_CHECK(d.write_value64 != nullptr && d.wait_value64 != nullptr, CudaError,
               "stream memory operations are unavailable on CUDA device ", index, " (", d.missing,
               ")");
  return d;
}

// An address no allocation of the device holds: writing it is an illegal address.
constexpr uintptr_t kUnmappedAddress = 0x8;

// The planted fault of launch_out_of_bounds: every thread writes past any allocation.
__global__ void write_out_of_bounds(int* p) {
  p[threadIdx.x] = 1;
}

cudaStream_t to_stream(StreamId s) {
  return reinterpret_cast<cudaStream_t>(s);
}
void* to_ptr(StreamId s) {
  return reinterpret_cast<void*>(s);
}
// With unified addressing a pointer (device memory, or mapped pinned host memory) is its own
// device address.
CUdeviceptr to_address(const void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
}

// Relaxes this thread's stream capture mode for its life, as NCCL does around its own
// allocations: while another thread of the process captures a graph in the global mode (torch's
// default), CUDA refuses the calls that may synchronize (allocations, frees, stream queries and
// synchronizes) on every thread that is not relaxed, and invalidates that capture. pyring's
// calls never touch the capturing stream (a collective on it is refused at the call), so they
// are not the capture's.
class RelaxedCapture {
 public:
  RelaxedCapture() noexcept {
    if (cudaThreadExchangeStreamCaptureMode(&mode_) != cudaSuccess) {
      cudaGetLastError();
      restore_ = false;
    }
  }
  ~RelaxedCapture() {
    if (restore_ && cudaThreadExchangeStreamCaptureMode(&mode_) != cudaSuccess) {
      cudaGetLastError();
    }
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool restore_ = true;
};

// Whether a failed cudaStreamQuery says the stream's work faulted (CUDA's sticky errors: an
// illegal address, a failed launch), rather than that the query itself was refused: a graph
// capture in progress on the stream or elsewhere, or a stream its owner has destroyed since
// (then the flags alone tell, within the deadline).
bool is_stream_fault(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
    case cudaErrorNotReady:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorCapturedEvent:
    case cudaErrorStreamCaptureWrongThread:
      return false;
    default:
      return true;
  }
}

// Whether this thread has called cudaSetDevice, which also makes the device's primary context
// current for the driver functions (a thread's default device 0 has no current context).
thread_local bool t_context_bound = false;

class CudaRuntime final : public DeviceRuntime {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }

  int make_current(int index) override {
    int current = -1;
    PYRING_CUDA_CHECK_ON(index, cudaGetDevice(&current));
    if (current != index || !t_context_bound) {
      PYRING_CUDA_CHECK_ON(index, cudaSetDevice(index));
      t_context_bound = true;
    }
    return current;
  }

  void restore_current(int previous) noexcept override {
    const DriverApi& d = driver();
    CUdevice dev = 0;
    unsigned int flags = 0;
    int active = 0;
    if (d.device_get == nullptr || d.primary_ctx_state == nullptr ||
        d.device_get(&dev, previous) != CUDA_SUCCESS ||
        d.primary_ctx_state(dev, &flags, &active) != CUDA_SUCCESS || active == 0) {
      return;
    }
    if (cudaSetDevice(previous) != cudaSuccess) cudaGetLastError();
  }

  int device_count() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver" error
      return 0;
    }
    return n;
  }

  void* alloc(int index, size_t bytes) override {
    DeviceGuard guard(*this, index);
    RelaxedCapture relaxed;
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      PYRING_THROW(DeviceOutOfMemory, "cudaMalloc of ", bytes, " bytes failed on CUDA device ",
                   index, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
    }
    PYRING_CUDA_CHECK_ON(index, err);
    return p;
  }

  void free(int index, void* p) noexcept override {
    if (p == nullptr) return;
    DeviceGuard guard(*this, index, std::nothrow);
    RelaxedCapture relaxed;
    if (cudaFree(p) != cudaSuccess) cudaGetLastError();
  }

  // Zeroed, mapped into every device's address space (portable and mapped).
  void* alloc_host(int index, size_t bytes) override {
    DeviceGuard guard(*this, index);
    RelaxedCapture relaxed;
    void* p = nullptr;
    PYRING_CUDA_CHECK_ON(index,
                         cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    if (p != nullptr) std::memset(p, 0, bytes);
    return p;
  }

  void free_host(int index, void* p) noexcept override {
    if (p == nullptr) return;
    DeviceGuard guard(*this, index, std::nothrow);
    RelaxedCapture relaxed;
    if (cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
  }

  StreamId create_stream(int index) override {
    DeviceGuard guard(*this, index);
    cudaStream_t s = nullptr;
    PYRING_CUDA_CHECK_ON(index, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return reinterpret_cast<StreamId>(s);
  }

  void destroy_stream(int index, StreamId s) noexcept override {
    if (s == 0) return;  // the legacy default stream is not ours to destroy
    DeviceGuard guard(*this, index, std::nothrow);
    if (cudaStreamDestroy(to_stream(s)) != cudaSuccess) cudaGetLastError();
  }

  void copy_async(int index, void* dst, const void* src, size_t bytes, StreamId s) override {
    DeviceGuard guard(*this, index);
    PYRING_CUDA_CHECK_ON(index, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, to_stream(s)));
  }

  void require_stream_flags(int index) override {
    DeviceGuard guard(*this, index);
    const DriverApi& d = stream_mem_ops(index);
    PYRING_CHECK(d.device_get != nullptr && d.device_attribute != nullptr, CudaError,
                 "cannot ask CUDA device ", index, " for its stream memory operations (", d.missing,
                 ")");
    CUdevice dev = 0;
    check_driver(d.device_get(&dev, index), "cuDeviceGet", index);
    int can = 0;
    check_driver(d.device_attribute(&can, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev),
                 "cuDeviceGetAttribute", index);
    PYRING_CHECK(can != 0, CudaError, kNoStreamFlags, " (CUDA device ", index,
                 ": CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0)");
  }

  void write_flag(int index, StreamId s, Flag* flag, uint64_t value) override {
    DeviceGuard guard(*this, index);
    const DriverApi& d = stream_mem_ops(index);
    check_driver(
        d.write_value64(to_stream(s), to_address(flag), value, CU_STREAM_WRITE_VALUE_DEFAULT),
        "cuStreamWriteValue64", index);
  }

  void wait_flag(int index, StreamId s, Flag* flag, uint64_t value) override {
    DeviceGuard guard(*this, index);
    const DriverApi& d = stream_mem_ops(index);
    check_driver(d.wait_value64(to_stream(s), to_address(flag), value, CU_STREAM_WAIT_VALUE_GEQ),
                 "cuStreamWaitValue64", index);
  }

  void synchronize(int index, StreamId s) override {
    DeviceGuard guard(*this, index);
    RelaxedCapture relaxed;
    PYRING_CUDA_CHECK_ON(index, cudaStreamSynchronize(to_stream(s)));
  }

  bool is_capturing(int index, StreamId s) noexcept override {
    DeviceGuard guard(*this, index, std::nothrow);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(to_stream(s), &status) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return status != cudaStreamCaptureStatusNone;
  }

  std::string stream_error(int index, StreamId s) noexcept override {
    DeviceGuard guard(*this, index, std::nothrow);
    RelaxedCapture relaxed;
    const cudaError_t err = cudaStreamQuery(to_stream(s));
    if (err == cudaSuccess || err == cudaErrorNotReady) return std::string();
    cudaGetLastError();
    if (!is_stream_fault(err)) return std::string();
    try {
      return str_cat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
    } catch (...) {
      return std::string("a CUDA error");
    }
  }

  void launch_out_of_bounds(int index, StreamId s) override {
    DeviceGuard guard(*this, index);
    write_out_of_bounds<<<1, 32, 0, to_stream(s)>>>(reinterpret_cast<int*>(kUnmappedAddress));
    PYRING_CUDA_CHECK_ON(index, cudaGetLastError());
  }

  void reduce_accumulate(int index, DType dtype, ReduceOp op, const void* a, const void* b,
                         void* acc, size_t n, StreamId s) override {
    DeviceGuard guard(*this, index);
    cuda_reduce_accumulate(dtype, op, a, b, acc, n, to_ptr(s));
  }

  void reduce_finish(int index, DType dtype, ReduceOp op, const void* a, const void* b, void* out,
                     size_t n, int world, StreamId s) override {
    DeviceGuard guard(*this, index);
    cuda_reduce_finish(dtype, op, a, b, out, n, world, to_ptr(s));
  }

  void finish_wide(int index, DType dtype, ReduceOp op, const void* acc, void* out, size_t n,
                   int world, StreamId s) override {
    DeviceGuard guard(*this, index);
    cuda_finish_wide(dtype, op, acc, out, n, world, to_ptr(s));
  }

  void cast(int index, DType from, DType to, const void* in, void* out, size_t n,
            StreamId s) override {
    DeviceGuard guard(*this, index);
    cuda_cast(from, to, in, out, n, to_ptr(s));
  }

  // Holds the device's workspace until the encode has synchronized s.
  size_t onebit_encode(int index, const float* in, uint16_t* residual, float pending, size_t n,
                       uint8_t* out, OnebitHeader* header, StreamId s) override {
    DeviceGuard guard(*this, index);
    OnebitWorkspace& ws = onebit_workspace(index);
    std::lock_guard<std::mutex> lock(ws.mu);
    if (ws.ptr == nullptr) {
      ws.ptr = device_alloc(*this, index, cuda_onebit_workspace_bytes());
    }
    return cuda_onebit_encode(in, residual, pending, n, out, ws.ptr, header, to_ptr(s));
  }

  void onebit_decode(int index, const OnebitHeader& header, const uint8_t* encoded, size_t n,
                     float alpha, bool accumulate, float* out, StreamId s) override {
    DeviceGuard guard(*this, index);
    cuda_onebit_decode(header, encoded, n, alpha, accumulate, out, to_ptr(s));
  }

  // bytes: the cudaIpcMemHandle_t of p's allocation, then p's offset in it (8 bytes, host
  // order).
  IpcHandle ipc_handle(int index, void* p) override {
    DeviceGuard guard(*this, index);
    const DriverApi& d = driver();
    PYRING_CHECK(d.get_address_range != nullptr, CudaError,
                 "cuMemGetAddressRange is unavailable on CUDA device ", index, " (", d.missing,
                 ")");
    CUdeviceptr base = 0;
    size_t size = 0;
    check_driver(d.get_address_range(&base, &size, to_address(p)), "cuMemGetAddressRange", index);
    cudaIpcMemHandle_t mem{};
    PYRING_CUDA_CHECK_ON(
        index, cudaIpcGetMemHandle(&mem, reinterpret_cast<void*>(static_cast<uintptr_t>(base))));
    const uint64_t offset = to_address(p) - base;
    IpcHandle h;
    std::memcpy(h.bytes, &mem, sizeof(mem));
    std::memcpy(h.bytes + sizeof(mem), &offset, sizeof(offset));
    return h;
  }

  void* ipc_open(int index, const IpcHandle& h) override {
    cudaIpcMemHandle_t mem;
    uint64_t offset = 0;
    std::memcpy(&mem, h.bytes, sizeof(mem));
    std::memcpy(&offset, h.bytes + sizeof(mem), sizeof(offset));
    DeviceGuard guard(*this, index);
    RelaxedCapture relaxed;
    void* base = nullptr;
    PYRING_CUDA_CHECK_ON(index, cudaIpcOpenMemHandle(&base, mem, cudaIpcMemLazyEnablePeerAccess));
    void* p = static_cast<char*>(base) + offset;
    std::lock_guard<std::mutex> lock(ipc_mu_);
    IpcMapping& m = ipc_opened_[p];
    m.base = base;
    ++m.opens;
    return p;
  }

  // Unknown pointers are ignored.
  void ipc_close(int index, void* p) noexcept override {
    void* base = nullptr;
    {
      std::lock_guard<std::mutex> lock(ipc_mu_);
      auto it = ipc_opened_.find(p);
      if (it == ipc_opened_.end()) return;
      base = it->second.base;
      if (--it->second.opens == 0) ipc_opened_.erase(it);
    }
    DeviceGuard guard(*this, index, std::nothrow);
    RelaxedCapture relaxed;
    if (cudaIpcCloseMemHandle(base) != cudaSuccess) cudaGetLastError();
  }

 private:
  struct OnebitWorkspace {
    std::mutex mu;
    void* ptr = nullptr;  // device memory, never freed
  };
  // Each open of a handle is matched by one close of its base (the driver counts opens of the
  // same allocation), so a pointer opened twice stays mapped until closed twice.
  struct IpcMapping {
    void* base = nullptr;
    int opens = 0;
  };

  OnebitWorkspace& onebit_workspace(int index) {
    std::lock_guard<std::mutex> lock(onebit_mu_);
    std::unique_ptr<OnebitWorkspace>& ws = onebit_[index];
    if (!ws) ws = std::make_unique<OnebitWorkspace>();
    return *ws;
  }

  std::mutex onebit_mu_;
  std::unordered_map<int, std::unique_ptr<OnebitWorkspace>> onebit_;
  std::mutex ipc_mu_;
  std::unordered_map<void*, IpcMapping> ipc_opened_;
};

}  // namespace

DeviceRuntime& cuda_runtime() {
  // Never destroyed: CUDA may be torn down before static destructors run at exit.
  static CudaRuntime* runtime = new CudaRuntime();
  return *runtime;
}

}  // namespace pyring
