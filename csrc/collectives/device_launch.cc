#include "collectives/device_launch.h"

#include <string>
#include <utility>

#include "collectives/collectives.h"
#include "core/errors.h"
#include "device/runtime.h"

namespace pyring {

CallDesc call_of(CallKind kind, const char* name, const BufferView& v, const DeviceArgs& args,
                 Algo algo) {
  CallDesc d = call_of(kind, name, args);
  d.dtype = v.dtype;
  d.algo = algo;
  return d;
}

CallDesc call_of(CallKind kind, const char* name, const DeviceArgs& args) {
  CallDesc d;
  d.kind = kind;
  d.name = name;
  d.device = args.device;
  return d;
}

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

Launched launch_resident(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                         const DeviceArgs& args, std::function<void(StreamId, Deadline)> body) {
  return launch_device(comm, async_op, desc, args,
                       [body = std::move(body)](DeviceQueue& q, uint64_t t, Deadline d) {
                         q.run_resident(t, [&](Deadline dl) { body(q.stream(), dl); }, d);
                       });
}

Launched launch_staged(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                       const DeviceArgs& args, std::vector<StagedRegion> regions,
                       std::function<void(Deadline, uint8_t* const*)> fn) {
  return launch_device(comm, async_op, desc, args,
                       [regions = std::move(regions), fn = std::move(fn)](
                           DeviceQueue& q, uint64_t t, Deadline d) { q.run(t, regions, fn, d); });
}

Launched launch_device(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                       const DeviceArgs& args,
                       std::function<void(DeviceQueue&, uint64_t, Deadline)> body) {
  check_not_capturing(args.device, args.stream);  // before anything allocates (runtime.h)
  std::shared_ptr<DeviceQueue> q = comm.device_queue(args.device);
  uint64_t ticket = 0;
  std::string fault;
  try {
    ticket = q->enter(args.stream, Deadline::after(comm.options().timeout_s));
  } catch (const CudaError& e) {
    fault = e.what();
  }
  // A device that failed before the collective could be ordered on it (a sticky fault) fails
  // the collective in its turn, so that the communicator gives up and its peers are told, as
  // for a fault found while the collective runs. Ticket 0 is always done.
  auto staged = [q, ticket, fault, body = std::move(body)](Deadline d) {
    PYRING_CHECK(fault.empty(), DeviceFault, fault);
    body(*q, ticket, d);
  };
  if (async_op) {
    std::shared_ptr<Work> work = comm.submit(desc, std::move(staged));
    // A work that fails, or never runs, still releases the streams waiting for it.
    work->add_callback([q, ticket](std::exception_ptr err) {
      if (err) q->abandon(ticket);
    });
    return {work, DeviceTicket{q, ticket}};
  }
  try {
    comm.run_sync(desc, staged);
  } catch (...) {
    q->abandon(ticket);
    throw;
  }
  q->order_after(args.stream, ticket);
  return {nullptr, DeviceTicket{q, ticket}};
}

Launched allreduce_on_device(Communicator& c, bool async_op, const BufferView& vi,
                             const BufferView& vo, ReduceOp rop, Algo a, const DeviceArgs& da,
                             Placement placement) {
  CollectiveDesc desc;
  desc.name = "all_reduce";
  desc.count = vi.count;
  desc.dtype = vi.dtype;
  desc.op = static_cast<int>(rop);
  if (placement == Placement::kResident) {
    return launch_resident(
        c, async_op, desc, da, [&c, vi, vo, rop, dev = da.device](StreamId s, Deadline d) {
          resident_allreduce(c, on_stream(vi, dev, s), on_stream(vo, dev, s), rop, d);
        });
  }
  return launch_device(c, async_op, desc, da,
                       [&c, vi, vo, rop, a](DeviceQueue& q, uint64_t t, Deadline dl) {
                         q.run_chunked(
                             t, vi, vo,
                             [&c, vi, rop, a](Deadline d, uint8_t* h, size_t, size_t n) {
                               BufferView part = host_view(vi, h);
                               part.count = n;
                               allreduce(c, part, part, rop, a, d);
                             },
                             dl);
                       });
}

}  // namespace pyring
