// Pipelining: every receive of a phase is posted up front; each piece (a segment as delivered
// by the link) is combined and forwarded to the right as soon as it lands, so a part's
// segments flow around the ring without waiting for whole steps. In reduce-scatter step s
// (0 <= s < n-1) position p sends part p-1-s and receives part p-2-s, so its last receive is
// part p; in allgather step s it receives part p-1-s, complete, from the left.
#include "collectives/ring_phases.h"

#include <algorithm>

#include "collectives/driver.h"
#include "core/errors.h"
#include "core/link.h"

namespace pyring {

int SubRing::at(long steps) const {
  return ranks[ring_index(pos + steps, size())];
}

SubRing SubRing::of(const std::vector<int>& ranks, int rank) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  PYRING_CHECK(it != ranks.end(), Error, "rank ", rank, " is not in its own sub-ring");
  return SubRing{ranks, static_cast<int>(it - ranks.begin())};
}

Parts Parts::even(size_t base, size_t count, size_t n) {
  Parts p;
  const Chunks chunks{count, n};
  for (size_t i = 0; i < n; ++i) {
    p.off.push_back(base + chunks.offset(i));
    p.len.push_back(chunks.size(i));
  }
  return p;
}

Parts Parts::blocks(const std::vector<int>& ranks, size_t m) {
  Parts p;
  for (int r : ranks) {
    p.off.push_back(static_cast<size_t>(r) * m);
    p.len.push_back(m);
  }
  return p;
}

std::vector<Parts> Parts::per_team(const TreePlan& plan, size_t base, size_t count) {
  std::vector<Parts> parts;
  for (const Team& t : plan.teams) {
    parts.push_back(Parts::even(base, count, t.ranks.size()));
    base = parts.back().off[static_cast<size_t>(t.pos)];
    count = parts.back().len[static_cast<size_t>(t.pos)];
  }
  return parts;
}

namespace {

struct Ends {
  Link* left;
  Link* right;
};

// The links the phase's data travels: host links, or the device links for device buffers.
Ends ends(Communicator& comm, const SubRing& ring, const KernelSite& site) {
  return Ends{&comm.link_for(site.device, ring.at(-1)), &comm.link_for(site.device, ring.at(1))};
}

// The links the phase's header travels: always the host links.
Ends header_ends(Communicator& comm, const SubRing& ring) {
  return Ends{&comm.link(ring.at(-1)), &comm.link(ring.at(1))};
}

size_t part_of(const SubRing& ring, long steps) {
  return ring_index(ring.pos + steps, ring.size());
}

// Posts the reduce-scatter steps. on_own(e, data, cnt) receives the last step's pieces (part
// pos), element e from the start of the buffer; other parts accumulate into acc and go right.
template <class OnOwn>
void post_reduce_scatter(const SubRing& ring, const Parts& parts, Ends links, const uint8_t* src,
                         DType src_type, uint8_t* acc, DType dtype, ReduceOp op,
                         const KernelSite& site, OnOwn on_own) {
  const int n = ring.size();
  const DType acc_type = accum_dtype(dtype);
  const size_t ssz = dtype_size(src_type), asz = dtype_size(acc_type);
  {
    const size_t c = part_of(ring, -1);
    const uint8_t* from = src + parts.off[c] * ssz;
    if (src_type != acc_type) {
      kern::widen(site, dtype, from, acc + parts.off[c] * asz, parts.len[c]);
      from = acc + parts.off[c] * asz;
    }
    links.right->post_send(from, parts.len[c] * asz);
  }
  for (int s = 0; s < n - 1; ++s) {
    const size_t c = part_of(ring, -2 - s);
    const size_t base = parts.off[c];
    const bool last = s == n - 2;
    Link* left = links.left;
    Link* right = links.right;
    RecvSpec spec;
    spec.bytes = parts.len[c] * asz;
    spec.on_piece = [=](const uint8_t* data, size_t off, size_t len) {
      PYRING_CHECK(off % asz == 0 && len % asz == 0, CommError, "piece of ", len,
                   " bytes at offset ", off, " from rank ", left->peer(),
                   " is not a whole number of ", dtype_name(acc_type), " elements");
      const size_t e = base + off / asz, cnt = len / asz;
      if (last) {
        on_own(e, data, cnt);
      } else {
        kern::accumulate(site, src_type, op, src + e * ssz, data, acc + e * asz, cnt);
        right->post_send(acc + e * asz, cnt * asz);
      }
    };
    links.left->post_recv(std::move(spec));
  }
}

// out[e..] = finished op(src[e..], data) in dtype; src has src_type.
void finish_piece(const KernelSite& site, DType dtype, DType src_type, ReduceOp op,
                  const uint8_t* src, uint8_t* acc, const uint8_t* data, uint8_t* out, size_t e,
                  size_t cnt, int world) {
  const size_t ssz = dtype_size(src_type);
  if (src_type == dtype) {
    kern::finish(site, dtype, op, src + e * ssz, data, out, cnt, world);
    return;
  }
  const size_t asz = dtype_size(accum_dtype(dtype));
  kern::accumulate(site, src_type, op, src + e * ssz, data, acc + e * asz, cnt);
  kern::finish_wide(site, dtype, op, acc + e * asz, out, cnt, world);
}

void post_allgather(const SubRing& ring, const Parts& parts, Ends links, uint8_t* buf, size_t esz) {
  const int n = ring.size();
  for (int s = 0; s < n - 1; ++s) {
    const size_t c = part_of(ring, -1 - s);
    RecvSpec spec;
    spec.bytes = parts.len[c] * esz;
    spec.copy_to = buf + parts.off[c] * esz;
    if (s < n - 2) {
      Link* right = links.right;
      spec.on_piece = [right](const uint8_t* data, size_t, size_t len) {
        right->post_send(data, len);
      };
    }
    links.left->post_recv(std::move(spec));
  }
}

// Posts the phase's header on its ring links; no links for a ring of one.
Posted start(Communicator& comm, const SubRing& ring, const PhaseInfo& info) {
  Posted posted;
  if (ring.size() < 2) return posted;
  const Ends links = ends(comm, ring, info.site);
  const Ends header = header_ends(comm, ring);
  posted.left = links.left;
  posted.right = links.right;
  posted.header_left = header.left;
  posted.header_right = header.right;
  posted.header = std::make_unique<HeaderExchange>(comm.seq(), info.kind, info.dtype, info.op,
                                                   info.count, info.root);
  posted.header->post(header.left, header.right, comm.rank());
  return posted;
}

}  // namespace

void Posted::complete(Communicator& comm, Deadline deadline, std::vector<Link*> background) {
  if (left) drive(links(), deadline, comm.spin_us(), std::move(background));
}

Posted post_rs(Communicator& comm, const SubRing& ring, const Parts& parts, const uint8_t* src,
               DType src_type, uint8_t* acc, uint8_t* finish_out, const PhaseInfo& info) {
  Posted posted = start(comm, ring, info);
  if (!posted.left) return posted;
  const DType dtype = info.dtype;
  const size_t own_base = parts.off[static_cast<size_t>(ring.pos)];
  const size_t esz = dtype_size(dtype), asz = dtype_size(accum_dtype(dtype));
  const size_t ssz = dtype_size(src_type);
  const ReduceOp op = info.op;
  const int world = info.world;
  const KernelSite site = info.site;
  post_reduce_scatter(ring, parts, Ends{posted.left, posted.right}, src, src_type, acc, dtype, op,
                      site, [=](size_t e, const uint8_t* data, size_t cnt) {
                        if (finish_out) {
                          finish_piece(site, dtype, src_type, op, src, acc, data,
                                       finish_out + (e - own_base) * esz, e, cnt, world);
                        } else {
                          kern::accumulate(site, src_type, op, src + e * ssz, data, acc + e * asz,
                                           cnt);
                        }
                      });
  return posted;
}

void rs_phase(Communicator& comm, const SubRing& ring, const Parts& parts, const uint8_t* src,
              DType src_type, uint8_t* acc, uint8_t* finish_out, const PhaseInfo& info,
              Deadline deadline) {
  post_rs(comm, ring, parts, src, src_type, acc, finish_out, info).complete(comm, deadline);
}

Posted post_ag(Communicator& comm, const SubRing& ring, const Parts& parts, uint8_t* buf,
               const PhaseInfo& info) {
  Posted posted = start(comm, ring, info);
  if (!posted.left) return posted;
  const size_t esz = dtype_size(info.dtype);
  const size_t own = static_cast<size_t>(ring.pos);
  posted.right->post_send(buf + parts.off[own] * esz, parts.len[own] * esz);
  post_allgather(ring, parts, Ends{posted.left, posted.right}, buf, esz);
  return posted;
}

void ag_phase(Communicator& comm, const SubRing& ring, const Parts& parts, uint8_t* buf,
              const PhaseInfo& info, Deadline deadline) {
  post_ag(comm, ring, parts, buf, info).complete(comm, deadline);
}

Posted post_ar(Communicator& comm, const SubRing& ring, const Parts& parts, const uint8_t* src,
               DType src_type, uint8_t* acc, uint8_t* out, const PhaseInfo& info) {
  Posted posted = start(comm, ring, info);
  if (!posted.left) return posted;
  const DType dtype = info.dtype;
  const size_t esz = dtype_size(dtype);
  const ReduceOp op = info.op;
  const int world = info.world;
  Link* right = posted.right;
  const Ends links{posted.left, posted.right};
  const KernelSite site = info.site;
  post_reduce_scatter(ring, parts, links, src, src_type, acc, dtype, op, site,
                      [=](size_t e, const uint8_t* data, size_t cnt) {
                        finish_piece(site, dtype, src_type, op, src, acc, data, out + e * esz, e,
                                     cnt, world);
                        right->post_send(out + e * esz, cnt * esz);
                      });
  post_allgather(ring, parts, links, out, esz);
  return posted;
}

void ar_phase(Communicator& comm, const SubRing& ring, const Parts& parts, const uint8_t* src,
              DType src_type, uint8_t* acc, uint8_t* out, const PhaseInfo& info,
              Deadline deadline) {
  post_ar(comm, ring, parts, src, src_type, acc, out, info).complete(comm, deadline);
}

void bcast_phase(Communicator& comm, const SubRing& ring, int root_pos, uint8_t* buf, size_t bytes,
                 const PhaseInfo& info, Deadline deadline) {
  if (ring.size() < 2 || bytes == 0) return;
  const Ends links = ends(comm, ring, info.site);
  const Ends hlinks = header_ends(comm, ring);
  const bool is_root = ring.pos == root_pos;
  const bool forwards = static_cast<int>(part_of(ring, 1)) != root_pos;
  // Headers go the whole ring, the root's left neighbour to the root too, although no data
  // does: ranks that name different roots each raise CommError instead of each keeping its own
  // data (and leaving its header for the next collective to trip on).
  HeaderExchange header(comm.seq(), info.kind, info.dtype, info.op, info.count, info.root);
  header.post(hlinks.left, hlinks.right, comm.rank());
  if (is_root) {
    links.right->post_send(buf, bytes);
  } else {
    RecvSpec spec;
    spec.bytes = bytes;
    spec.copy_to = buf;
    if (forwards) {
      Link* right = links.right;
      spec.on_piece = [right](const uint8_t* piece, size_t, size_t len) {
        right->post_send(piece, len);
      };
    }
    links.left->post_recv(std::move(spec));
  }
  drive({links.left, links.right, hlinks.left, hlinks.right}, deadline, comm.spin_us());
}

}  // namespace pyring
