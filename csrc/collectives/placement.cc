#include "collectives/placement.h"

#include "codecs/codec.h"
#include "collectives/zero_copy.h"
#include "core/errors.h"

namespace pyring {

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::kHost:
      return "host";
    case Placement::kResident:
      return "resident";
    case Placement::kStaged:
      return "staged";
    case Placement::kZeroCopy:
      return "zero-copy";
  }
  return "an unknown placement";
}

namespace {

Plan decide(const Communicator& comm, const CallDesc& call) {
  // An exact wire (fp32) is the ordinary all_reduce. Compressed wires keep their codec's
  // schedule over the links even on symmetric memory: their numerics (error feedback) are the
  // caller's choice, though on one host they are the slower (bench/symmetric_wires.py, 2 ranks,
  // 16 MiB: fp32 zero-copy 1.18 ms, one-bit 3.06 ms, bf16 6.44 ms; docs/symmetric.md).
  const bool exact_wire =
      call.kind == CallKind::kWireAllReduce && codec_of(call.wire).schedule() == Schedule::kExact;
  const bool zero_copy_kind =
      call.kind == CallKind::kAllReduce || call.kind == CallKind::kReduceScatter ||
      call.kind == CallKind::kAllGather || call.kind == CallKind::kBroadcast || exact_wire;
  const bool all_reduce = call.kind == CallKind::kAllReduce || exact_wire;
  const bool across_hosts = all_reduce && call.device.is_cpu() && zero_copy_across_hosts(comm);
  if (zero_copy_kind && (zero_copy_possible(comm) || across_hosts) &&
      comm.symmetric()->find(call.read, call.read_bytes, call.device)) {
    return {Placement::kZeroCopy,
            across_hosts ? std::string("symmetric memory, zero-copy within each host")
            : call.device.is_cpu()
                ? std::string("symmetric memory, every rank on this host")
                : str_cat(call.device.str(), ": symmetric device memory, every rank on this host")};
  }
  if (call.device.is_cpu()) return {Placement::kHost, "host buffers"};
  const std::string dev = call.device.str();
  // One rank moves nothing; else the device links must carry this device.
  const bool links = comm.size() == 1 || comm.resident_on(call.device);
  const char* no_links = "no device link of this communicator carries the device";
  switch (call.kind) {
    case CallKind::kPersonal:
      return {Placement::kStaged,
              str_cat(dev,
                      ": point-to-point and personalised collectives stage device buffers "
                      "through pinned host memory")};
    case CallKind::kWireAllReduce:
      if (codec_of(call.wire).schedule() != Schedule::kExact) {
        if (!codec_of(call.wire).device_kernels()) {
          return {Placement::kStaged,
                  str_cat(dev, ": the ", wire_name(call.wire), " codec has host kernels only")};
        }
        if (call.dtype == DType::kFloat64) {
          return {Placement::kStaged, str_cat(dev, ": float64 has no device cast to the ",
                                              wire_name(call.wire), " wire")};
        }
        return {Placement::kResident,
                str_cat(dev, ": the ", wire_name(call.wire), " codec runs on the device")};
      }
      [[fallthrough]];  // fp32: the ordinary all_reduce
    case CallKind::kAllReduce:
      if (!links) return {Placement::kStaged, str_cat(dev, ": ", no_links)};
      if (comm.size() > 1 && call.algo != Algo::kAuto && call.algo != Algo::kRing) {
        return {Placement::kStaged,
                str_cat(dev, ": the ", algo_name(call.algo), " algorithm runs on the host")};
      }
      return {Placement::kResident, str_cat(dev, ": the device ring")};
    case CallKind::kReduceScatter:
    case CallKind::kAllGather:
    case CallKind::kBroadcast:
      if (!links) return {Placement::kStaged, str_cat(dev, ": ", no_links)};
      return {Placement::kResident, str_cat(dev, ": the device ring")};
  }
  PYRING_THROW(InvalidArgument, "place: unknown call kind ", static_cast<int>(call.kind));
}

}  // namespace

Plan place(Communicator& comm, const CallDesc& call) {
  Plan p = decide(comm, call);
  if (comm.options().log_level >= 1 && p.placement != Placement::kHost) {
    comm.log_once(
        1, str_cat("place/", call.name, "/", placement_name(p.placement), "/", p.reason),
        [&] { return str_cat(call.name, ": ", placement_name(p.placement), " (", p.reason, ")"); });
  }
  return p;
}

}  // namespace pyring
