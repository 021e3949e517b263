#include "collectives/call_bodies.h"

#include <utility>

#include "collectives/collectives.h"
#include "collectives/zero_copy.h"
#include "core/errors.h"

namespace pyring {

namespace {

// One staged region per span: read (inputs) or written back (outputs).
void add_regions(std::vector<StagedRegion>& regions, const std::vector<Span>& list, bool read) {
  for (const auto& s : list) regions.push_back(StagedRegion{s.data, s.bytes, read, !read});
}

// The spans' host copies, at consecutive staged regions from `h`.
std::vector<Span> on_host(const std::vector<Span>& list, uint8_t* const* h) {
  std::vector<Span> out;
  for (size_t k = 0; k < list.size(); ++k) out.push_back(Span{h[k], list[k].bytes});
  return out;
}

// The symmetric span of v, which the planner found in symmetric memory.
SymmetricSpan symmetric_span(Communicator& c, const BufferView& v, const Device& dev) {
  SymmetricSpan s = c.symmetric()->find(v.data, v.bytes(), dev);
  PYRING_CHECK(static_cast<bool>(s), Error, "a buffer placed zero-copy is not symmetric memory");
  return s;
}

}  // namespace

BufferView host_view(const BufferView& v, uint8_t* host) {
  BufferView h = v;
  h.data = host;
  h.device = Device{};
  h.stream = 0;
  return h;
}

BufferView on_stream(const BufferView& v, const Device& device, StreamId stream) {
  BufferView s = v;
  s.device = device;
  s.stream = stream;
  return s;
}

CallBodies allreduce_bodies(Placement where, Communicator& c, const BufferView& vi,
                            const BufferView& vo, ReduceOp rop, Algo a, const Device& dev) {
  CallBodies b;
  if (where == Placement::kHost) {
    b.host = [&c, vi, vo, rop, a](Deadline d) { allreduce(c, vi, vo, rop, a, d); };
  }
  if (where == Placement::kZeroCopy) {
    const SymmetricSpan si = symmetric_span(c, vi, dev),
                        so = c.symmetric()->find(vo.data, vo.bytes(), dev);
    if (dev.is_cpu()) {
      b.host = [&c, si, so, vi, vo, rop](Deadline d) {
        zero_copy_allreduce(c, si, so, vi, vo, rop, d);
      };
    } else {
      b.resident = [&c, si, so, vi, vo, rop, dev](StreamId s, Deadline d) {
        zero_copy_device_allreduce(c, si, so, on_stream(vi, dev, s), on_stream(vo, dev, s), rop, d);
      };
    }
  }
  if (where == Placement::kResident) {
    b.resident = [&c, vi, vo, rop, dev](StreamId s, Deadline d) {
      resident_allreduce(c, on_stream(vi, dev, s), on_stream(vo, dev, s), rop, d);
    };
  }
  if (where == Placement::kStaged) {
    b.staged_by_queue = [&c, vi, vo, rop, a](DeviceQueue& q, uint64_t t, Deadline dl) {
      q.run_chunked(
          t, vi, vo,
          [&c, vi, rop, a](Deadline d, uint8_t* h, size_t, size_t n) {
            BufferView part = host_view(vi, h);
            part.count = n;
            allreduce(c, part, part, rop, a, d);
          },
          dl);
    };
  }
  return b;
}

CallBodies reduce_scatter_bodies(Placement where, Communicator& c, const BufferView& vi,
                                 const BufferView& vo, ReduceOp rop, const Device& dev) {
  CallBodies b;
  if (where == Placement::kHost) {
    b.host = [&c, vi, vo, rop](Deadline d) { reduce_scatter(c, vi, vo, rop, d); };
  }
  if (where == Placement::kZeroCopy && dev.is_cpu()) {
    b.host = [&c, si = symmetric_span(c, vi, dev), vi, vo, rop](Deadline d) {
      zero_copy_reduce_scatter(c, si, vi, vo, rop, d);
    };
  }
  if (where == Placement::kZeroCopy && !dev.is_cpu()) {
    b.resident = [&c, si = symmetric_span(c, vi, dev), vi, vo, rop, dev](StreamId s, Deadline d) {
      zero_copy_device_reduce_scatter(c, si, on_stream(vi, dev, s), on_stream(vo, dev, s), rop, d);
    };
  }
  if (where == Placement::kResident) {
    b.resident = [&c, vi, vo, rop, dev](StreamId s, Deadline d) {
      resident_reduce_scatter(c, on_stream(vi, dev, s), on_stream(vo, dev, s), rop, d);
    };
  }
  if (where == Placement::kStaged) {
    b.regions = {StagedRegion{vi.data, vi.bytes(), true, false},
                 StagedRegion{vo.data, vo.bytes(), false, true}};
    b.staged = [&c, vi, vo, rop](Deadline d, uint8_t* const* h) {
      reduce_scatter(c, host_view(vi, h[0]), host_view(vo, h[1]), rop, d);
    };
  }
  return b;
}

CallBodies allgather_bodies(Placement where, Communicator& c, const BufferView& vi,
                            const BufferView& vo, const Device& dev) {
  CallBodies b;
  if (where == Placement::kHost) b.host = [&c, vi, vo](Deadline d) { allgather(c, vi, vo, d); };
  if (where == Placement::kZeroCopy && dev.is_cpu()) {
    b.host = [&c, si = symmetric_span(c, vi, dev), vi, vo](Deadline d) {
      zero_copy_allgather(c, si, vi, vo, d);
    };
  }
  if (where == Placement::kZeroCopy && !dev.is_cpu()) {
    b.resident = [&c, si = symmetric_span(c, vi, dev), vi, vo, dev](StreamId s, Deadline d) {
      zero_copy_device_allgather(c, si, on_stream(vi, dev, s), on_stream(vo, dev, s), d);
    };
  }
  if (where == Placement::kResident) {
    b.resident = [&c, vi, vo, dev](StreamId s, Deadline d) {
      resident_allgather(c, on_stream(vi, dev, s), on_stream(vo, dev, s), d);
    };
  }
  if (where == Placement::kStaged) {
    b.regions = {StagedRegion{vi.data, vi.bytes(), true, false},
                 StagedRegion{vo.data, vo.bytes(), false, true}};
    b.staged = [&c, vi, vo](Deadline d, uint8_t* const* h) {
      allgather(c, host_view(vi, h[0]), host_view(vo, h[1]), d);
    };
  }
  return b;
}

CallBodies broadcast_bodies(Placement where, Communicator& c, const BufferView& v, int root,
                            const Device& dev) {
  const bool root_here = root == c.rank();
  CallBodies b;
  if (where == Placement::kHost) {
    b.host = [&c, v, root](Deadline d) { ring_broadcast(c, v, root, d); };
  }
  if (where == Placement::kZeroCopy && dev.is_cpu()) {
    b.host = [&c, sv = symmetric_span(c, v, dev), v, root](Deadline d) {
      zero_copy_broadcast(c, sv, v, root, d);
    };
  }
  if (where == Placement::kZeroCopy && !dev.is_cpu()) {
    b.resident = [&c, sv = symmetric_span(c, v, dev), v, root, dev](StreamId s, Deadline d) {
      zero_copy_device_broadcast(c, sv, on_stream(v, dev, s), root, d);
    };
  }
  if (where == Placement::kResident) {
    b.resident = [&c, v, root, dev](StreamId s, Deadline d) {
      ring_broadcast(c, on_stream(v, dev, s), root, d);
    };
  }
  if (where == Placement::kStaged) {
    b.regions = {StagedRegion{v.data, v.bytes(), root_here, !root_here}};
    b.staged = [&c, v, root](Deadline d, uint8_t* const* h) {
      ring_broadcast(c, host_view(v, h[0]), root, d);
    };
  }
  return b;
}

CallBodies compressed_bodies(Placement where, Communicator& c, const BufferView& x,
                             size_t exact_tail, Wire w, ReduceOp rop,
                             std::shared_ptr<WireState> state, Algo a, const Device& dev) {
  CallBodies b;
  if (where == Placement::kHost) {
    b.host = [&c, x, exact_tail, w, rop, state, a](Deadline d) {
      compressed_allreduce(c, x, exact_tail, w, rop, state.get(), a, d);
    };
  }
  if (where == Placement::kResident) {
    b.resident = [&c, x, exact_tail, w, rop, state, a, dev](StreamId s, Deadline d) {
      compressed_allreduce(c, on_stream(x, dev, s), exact_tail, w, rop, state.get(), a, d);
    };
  }
  if (where == Placement::kStaged) b.regions = {StagedRegion{x.data, x.bytes(), true, true}};
  if (where == Placement::kStaged) {
    b.staged = [&c, x, exact_tail, w, rop, state, a](Deadline d, uint8_t* const* h) {
      compressed_allreduce(c, host_view(x, h[0]), exact_tail, w, rop, state.get(), a, d);
    };
  }
  return b;
}

CallBodies gather_bodies(Placement where, Communicator& c, const Span& in,
                         const std::vector<Span>& blocks, int root) {
  CallBodies b;
  if (where == Placement::kHost) {
    b.host = [&c, in, blocks, root](Deadline d) { gather(c, in, blocks, root, d); };
  }
  if (where == Placement::kStaged) b.regions = {StagedRegion{in.data, in.bytes, true, false}};
  if (where == Placement::kStaged) add_regions(b.regions, blocks, false);
  if (where == Placement::kStaged) {
    b.staged = [&c, in, blocks, root](Deadline d, uint8_t* const* h) {
      gather(c, Span{h[0], in.bytes}, on_host(blocks, h + 1), root, d);
    };
  }
  return b;
}

CallBodies scatter_bodies(Placement where, Communicator& c, const std::vector<Span>& blocks,
                          const Span& out, int root) {
  CallBodies b;
  if (where == Placement::kHost) {
    b.host = [&c, blocks, out, root](Deadline d) { scatter(c, blocks, out, root, d); };
  }
  if (where == Placement::kStaged) b.regions = {StagedRegion{out.data, out.bytes, false, true}};
  if (where == Placement::kStaged) add_regions(b.regions, blocks, true);
  if (where == Placement::kStaged) {
    b.staged = [&c, blocks, out, root](Deadline d, uint8_t* const* h) {
      scatter(c, on_host(blocks, h + 1), Span{h[0], out.bytes}, root, d);
    };
  }
  return b;
}

CallBodies all_to_all_bodies(Placement where, Communicator& c, const std::vector<Span>& in,
                             const std::vector<Span>& out) {
  CallBodies b;
  if (where == Placement::kHost) b.host = [&c, in, out](Deadline d) { all_to_all(c, in, out, d); };
  if (where == Placement::kStaged) add_regions(b.regions, in, true);
  if (where == Placement::kStaged) add_regions(b.regions, out, false);
  if (where == Placement::kStaged) {
    b.staged = [&c, in, out, n = in.size()](Deadline d, uint8_t* const* h) {
      all_to_all(c, on_host(in, h), on_host(out, h + n), d);
    };
  }
  return b;
}

}  // namespace pyring
