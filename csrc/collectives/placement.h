// The one place that decides where a collective's buffers are worked on: on the host, on the
// device buffers themselves (resident: pyring's kernels and device links, ordered on the
// device's stream), staged through pinned host memory, or zero-copy on symmetric memory
// (collectives/zero_copy.h: ranks read each other's mappings). The bindings turn a call into a
// CallDesc, ask place() and run the plan it returns; they hold no such decision themselves.
// The algorithm is the selector's (collectives/selector.h), decided when the collective runs.
#pragma once

#include <string>

#include "core/communicator.h"
#include "core/types.h"

namespace pyring {

enum class Placement : int { kHost = 0, kResident = 1, kStaged = 2, kZeroCopy = 3 };
const char* placement_name(Placement p);  // "host", "resident", "staged", "zero-copy"

// What the planner needs of a call.
enum class CallKind : int {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kWireAllReduce,  // all_reduce on a wire format (collectives/compressed.h)
  kPersonal,       // point-to-point and the personalised collectives (gather, scatter, all_to_all)
};

struct CallDesc {
  CallKind kind = CallKind::kAllReduce;
  const char* name = "";  // the collective's name, for the reason
  Device device;          // of the call's buffers (all on one device: checked at the edge)
  DType dtype = DType::kFloat32;
  Algo algo = Algo::kAuto;  // the call's algorithm, or the communicator's
  Wire wire = Wire::kFp32;
  // The buffer the peers would read (all_reduce's and reduce_scatter's input, all_gather's
  // input, broadcast's buffer): zero-copy when it lies in symmetric memory.
  const void* read = nullptr;
  size_t read_bytes = 0;
};

struct Plan {
  Placement placement = Placement::kHost;
  std::string reason;
};

// The plan of `call` on `comm`. Every rank of a collective decides alike: the inputs are the
// call's and the communicator's device links. Logs each distinct decision once at INFO.
Plan place(Communicator& comm, const CallDesc& call);

}  // namespace pyring
