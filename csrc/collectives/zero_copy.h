// The zero-copy collectives on symmetric memory (core/symmetric.h), for a communicator whose
// ranks all share this host: each rank reads its peers' data straight from their mappings
// (and the host all_reduce writes its reduced chunk into every rank's output). No slot and no
// link carries data.
//
// Ordering: each rank raises its phase counter in its control page; a rank reads a peer's
// memory only after that peer raised the phase saying the data is there, and returns only
// after every peer raised the phase saying it no longer reads or writes this rank's memory for
// the call. On entering, each rank posts the call's description (kind, allocation, offset,
// bytes, dtype, op, root, all_reduce's output) and checks those of its peers: a disagreement
// fails every rank at once, naming both calls, and so does a peer that took the slot path for
// the same collective.
//
// Calls of 8 KiB and more time themselves: per size class, each rank keeps the cost of its
// last zero-copy calls and of its last calls that ran the slot schedule over the links
// instead (the same collective). Where some rank finds the slots cheaper (the cores far apart,
// where reading memory a peer just wrote costs more than the slots' streamed copies), every
// rank runs the slot schedule, decided alike from the flags posted on entry; every 64th call
// of a class (and every second of its first ten) runs the other schedule, so that both stay
// timed. Communicator.stats() counts the slot calls apart.
#pragma once

#include <cstddef>

#include "core/communicator.h"
#include "core/symmetric.h"
#include "core/types.h"

namespace pyring {

// At 3 ranks and more, all-reduces at or below this many bytes (at most kStagingBytes) run
// one-shot from the ranks' staging areas: each rank copies its input into its own, raises one
// flag, and reduces the whole buffer from every rank's area into its output (one round of
// flags; no peer ever reads the caller's buffer). The others run two-shot on the buffers
// themselves: each rank reduces its chunk from every mapping and writes it into every rank's
// output (two rounds). Measured on the 2-core machine (bench/allreduce.py, 2 ranks), with the
// two-shot of the time (which copied the others' chunks back in a third round): two-shot was
// the faster at every size (4 KiB: 1.60 us against 1.73; 16 KiB: 2.63 against 3.85; 32 KiB:
// 3.90 against 6.52); at 4 ranks (two per core) one-shot was at 32 KiB (78 us against 129-154)
// and two-shot at 64 KiB (155-163 us against 220).
constexpr size_t kOneShotBytes = 32 << 10;
static_assert(kOneShotBytes <= kStagingBytes);

// Whether `comm` can run zero-copy collectives: every rank is on this host and symmetric
// memory is mapped.
bool zero_copy_possible(const Communicator& comm);
// Whether `comm` can run all_reduce on symmetric host memory across hosts
// (zero_copy_hosts.cc): hosts of as many ranks each, grouped by host in the topology, and
// symmetric memory mapped. zero_copy_allreduce then runs that schedule.
bool zero_copy_across_hosts(const Communicator& comm);

// out = op over ranks of in. `in` lies in symmetric memory (span `si`); `so` is out's span, or
// empty where out is private (then the call runs one-shot at any size). in may be out. Across
// hosts (zero_copy_across_hosts) it runs zero_copy_hosts_allreduce.
void zero_copy_allreduce(Communicator& comm, const SymmetricSpan& si, const SymmetricSpan& so,
                         const BufferView& in, const BufferView& out, ReduceOp op,
                         Deadline deadline);
// The same across hosts: within each host zero-copy, across them a ring over the links. A
// private out of place runs the links' schedule instead (the peers cannot read it).
void zero_copy_hosts_allreduce(Communicator& comm, const SymmetricSpan& si, const SymmetricSpan& so,
                               const BufferView& in, const BufferView& out, ReduceOp op,
                               Deadline deadline);
// out (count m) = op over ranks of chunk `rank` of in (count size * m); in symmetric.
void zero_copy_reduce_scatter(Communicator& comm, const SymmetricSpan& si, const BufferView& in,
                              const BufferView& out, ReduceOp op, Deadline deadline);
// out (count size * m) = every rank's in (count m), in rank order; in symmetric (it may be
// chunk `rank` of out: the ranks' inputs may lie at different offsets of one allocation).
void zero_copy_allgather(Communicator& comm, const SymmetricSpan& si, const BufferView& in,
                         const BufferView& out, Deadline deadline);
// buf on every rank = buf on root; buf symmetric.
void zero_copy_broadcast(Communicator& comm, const SymmetricSpan& sb, const BufferView& buf,
                         int root, Deadline deadline);

// Whether `comm` can run its barrier on the ranks' control pages (zero_copy_barrier): every rank
// is on this host and the pages are mapped (the first symmetric allocation was made, at the
// same collective on every rank, so the ranks agree).
bool zero_copy_barrier_possible(const Communicator& comm);
// Returns once every rank has entered: one round of flags (each rank raises its phase, then
// waits for every peer's), so the ranks leave together, where the ring's token leaves them one
// hop apart (2 (n - 1) hops in all).
void zero_copy_barrier(Communicator& comm, Deadline deadline);

// The same four on symmetric device memory (zero_copy_device.cc), run inside the call's device
// ticket (DeviceQueue::run_resident: the caller's stream has reached the call). Host-driven:
// each step's kernels and copies are queued on pyring's stream and run to completion before
// the phase after them is raised (a round trip between the host and the device per phase), and
// all_reduce is two-shot at every size (one-shot into a private output): there are no staging
// areas and no slot schedule on a device.
void zero_copy_device_allreduce(Communicator& comm, const SymmetricSpan& si,
                                const SymmetricSpan& so, const BufferView& in,
                                const BufferView& out, ReduceOp op, Deadline deadline);
void zero_copy_device_reduce_scatter(Communicator& comm, const SymmetricSpan& si,
                                     const BufferView& in, const BufferView& out, ReduceOp op,
                                     Deadline deadline);
void zero_copy_device_allgather(Communicator& comm, const SymmetricSpan& si, const BufferView& in,
                                const BufferView& out, Deadline deadline);
void zero_copy_device_broadcast(Communicator& comm, const SymmetricSpan& sb, const BufferView& buf,
                                int root, Deadline deadline);

}  // namespace pyring
