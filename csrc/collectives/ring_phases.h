// Ring phases over a sub-ring: any list of ranks, run by each of them with the same list.
//
// Words: the buffer region a phase works on is cut into parts, one per ring position; the rank
// at position p owns part p (one convention for every phase and algorithm). Offsets and counts
// are in elements from the start of the caller's buffers, so the parts need not be contiguous
// or in order. A phase posts a collective header on the links it uses and drives them until
// its last byte has moved; the tree chains phases over different sub-rings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/header.h"
#include "core/communicator.h"
#include "core/types.h"
#include "kernels/dispatch.h"

namespace pyring {

struct SubRing {
  std::vector<int> ranks;
  int pos = 0;  // this rank's index in `ranks`

  int size() const { return static_cast<int>(ranks.size()); }
  // The rank `steps` positions to the right (negative: left) of this one.
  int at(long steps) const;
  static SubRing of(const std::vector<int>& ranks, int rank);  // throws if rank is absent
};

struct Parts {
  std::vector<size_t> off;
  std::vector<size_t> len;

  // [base, base + count) cut into n parts whose sizes differ by at most one element.
  static Parts even(size_t base, size_t count, size_t n);
  // Part p is block ranks[p] of `m` elements: rank-ordered chunks in ring order.
  static Parts blocks(const std::vector<int>& ranks, size_t m);
  // The parts of each of plan's teams for [base, base + count), lowest team first: each team
  // cuts the part this rank owns at the team below, down to this rank's own part.
  static std::vector<Parts> per_team(const TreePlan& plan, size_t base, size_t count);
};

// What every phase of one collective puts in its headers.
struct PhaseInfo {
  CollectiveKind kind;
  DType dtype;  // the caller's element type
  ReduceOp op = ReduceOp::kSum;
  uint64_t count = 0;  // the collective's element count, for mismatch messages
  int root = -1;
  int world = 1;  // the divisor of avg
  // Where the phase's buffers live (kernels/dispatch.h): on a device, the data travels the
  // communicator's device links and the kernels queue on site.stream.
  KernelSite site;
};

// A phase whose header, receives and first sends are posted. Keep it alive until its links
// are idle (its header lives here): complete() it, or keep its links moving as the background
// of another phase on other links. Phases posted on one link complete in posting order, so
// every rank must post them in the same order.
struct Posted {
  std::unique_ptr<HeaderExchange> header;
  Link* left = nullptr;  // the data's links; null: a ring of one rank, nothing to move
  Link* right = nullptr;
  Link* header_left = nullptr;  // the header's: the host links, also for device buffers
  Link* header_right = nullptr;

  std::vector<Link*> links() const { return {left, right, header_left, header_right}; }
  // Drives the phase's links until idle, also moving `background` (see drive()).
  void complete(Communicator& comm, Deadline deadline, std::vector<Link*> background = {});
};

// Reduce-scatter: part `pos` of the result is op over the ring of `src`, whose elements have
// type src_type (info.dtype or accum_dtype(info.dtype)). With finish_out null it is left
// unfinished (avg not divided) in acc, of type accum_dtype; otherwise it is finished and
// rounded into finish_out (info.dtype, indexed from the start of part `pos`). Every other part
// of acc is clobbered. src may be acc.
Posted post_rs(Communicator& comm, const SubRing& ring, const Parts& parts, const uint8_t* src,
               DType src_type, uint8_t* acc, uint8_t* finish_out, const PhaseInfo& info);
void rs_phase(Communicator& comm, const SubRing& ring, const Parts& parts, const uint8_t* src,
              DType src_type, uint8_t* acc, uint8_t* finish_out, const PhaseInfo& info,
              Deadline deadline);

// Allgather: part `pos` of buf (info.dtype) is this rank's; on return every part is filled.
Posted post_ag(Communicator& comm, const SubRing& ring, const Parts& parts, uint8_t* buf,
               const PhaseInfo& info);
void ag_phase(Communicator& comm, const SubRing& ring, const Parts& parts, uint8_t* buf,
              const PhaseInfo& info, Deadline deadline);

// Allreduce, reduce-scatter and allgather fused so that finished pieces travel on at once:
// out (info.dtype) = finished op over the ring of src (src_type). acc (accum_dtype) holds the
// partial results; it may be src, and may be out when the two types agree.
Posted post_ar(Communicator& comm, const SubRing& ring, const Parts& parts, const uint8_t* src,
               DType src_type, uint8_t* acc, uint8_t* out, const PhaseInfo& info);
void ar_phase(Communicator& comm, const SubRing& ring, const Parts& parts, const uint8_t* src,
              DType src_type, uint8_t* acc, uint8_t* out, const PhaseInfo& info, Deadline deadline);

// Broadcast: buf (bytes) on every rank = buf on the rank at position root_pos, pipelined
// along the ring.
void bcast_phase(Communicator& comm, const SubRing& ring, int root_pos, uint8_t* buf, size_t bytes,
                 const PhaseInfo& info, Deadline deadline);

}  // namespace pyring
