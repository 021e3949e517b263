#include "core/types.h"

#include "core/errors.h"

namespace pyring {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kInt8:
      return 1;
    case DType::kUInt8:
      return 1;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
  }
  PYRING_THROW(InvalidArgument, "unknown dtype code ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kProd:
      return "prod";
  }
  return "unknown";
}

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::kAuto:
      return "auto";
    case Algo::kRing:
      return "ring";
    case Algo::kDirect:
      return "direct";
    case Algo::kTree:
      return "tree";
  }
  return "unknown";
}

Algo algo_from_int(int v) {
  PYRING_CHECK_ARG(v >= 0 && v < kNumAlgos, "unknown algorithm code ", v, " (valid: 0..",
                   kNumAlgos - 1, ")");
  return static_cast<Algo>(v);
}

DType dtype_from_int(int v) {
  PYRING_CHECK_ARG(v >= 0 && v < kNumDTypes, "unknown dtype code ", v, " (valid: 0..",
                   kNumDTypes - 1, ")");
  return static_cast<DType>(v);
}

ReduceOp op_from_int(int v) {
  PYRING_CHECK_ARG(v >= 0 && v < kNumReduceOps, "unknown reduce op code ", v, " (valid: 0..",
                   kNumReduceOps - 1, ")");
  return static_cast<ReduceOp>(v);
}

const char* collective_kind_name(uint32_t kind) {
  switch (static_cast<CollectiveKind>(kind)) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter_tensor";
    case CollectiveKind::kAllGather:
      return "all_gather_into_tensor";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kGather:
      return "gather";
    case CollectiveKind::kScatter:
      return "scatter";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kHostsAllReduce:
      return "all_reduce (zero-copy within each host)";
  }
  return "an unknown collective";
}

const char* device_kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
    case DeviceKind::kSim:
      return "sim";
  }
  return "unknown";
}

DeviceKind device_kind_from_int(int v) {
  PYRING_CHECK_ARG(v >= 0 && v < kNumDeviceKinds, "device kind code ", v,
                   " out of range (valid: 0..", kNumDeviceKinds - 1, ")");
  return static_cast<DeviceKind>(v);
}

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  return str_cat(device_kind_name(kind), ":", index);
}

}  // namespace pyring
