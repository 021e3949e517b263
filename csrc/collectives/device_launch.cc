#include "collectives/device_launch.h"

#include <string>
#include <utility>

#include "collectives/collectives.h"
#include "collectives/zero_copy.h"
#include "core/errors.h"
#include "device/runtime.h"

namespace pyring {

CallDesc call_of(CallKind kind, const char* name, const BufferView& v, const DeviceArgs& args,
                 Algo algo) {
  CallDesc d = call_of(kind, name, args);
  d.dtype = v.dtype;
  d.algo = algo;
  d.read = v.data;
  d.read_bytes = v.bytes();
  return d;
}

void run_host_allreduce(Communicator& comm, const CollectiveDesc& desc, const BufferView& v,
                        ReduceOp op, Algo algo) {
  const DeviceArgs host;
  const CallDesc call = call_of(CallKind::kAllReduce, "all_reduce", v, host, algo);
  const Placement where = place(comm, call).placement;
  if (where == Placement::kHost && !(comm.symmetric() && comm.symmetric()->active())) {
    comm.run_sync(desc, [&comm, &v, op, algo](Deadline d) { allreduce(comm, v, v, op, algo, d); });
    return;
  }
  if (where == Placement::kZeroCopy) {  // the short path of allreduce_bodies' zero-copy body
    const SymmetricSpan span = comm.symmetric()->find(v.data, v.bytes());
    PYRING_CHECK(static_cast<bool>(span), Error,
                 "all_reduce placed zero-copy off symmetric memory");
    struct Args {
      Communicator& comm;
      const SymmetricSpan& span;
      const BufferView& v;
      ReduceOp op;
    } args{comm, span, v, op};
    comm.run_sync(desc, [a = &args](Deadline d) {  // one pointer: no allocation
      zero_copy_allreduce(a->comm, a->span, a->span, a->v, a->v, a->op, d);
    });
    return;
  }
  run_placed(comm, false, desc, call, where, host,
             allreduce_bodies(where, comm, v, v, op, algo, Device{}));
}

CallDesc call_of(CallKind kind, const char* name, const DeviceArgs& args) {
  CallDesc d;
  d.kind = kind;
  d.name = name;
  d.device = args.device;
  return d;
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

Launched run_placed(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                    const CallDesc& call, Placement where, const DeviceArgs& args,
                    CallBodies bodies) {
  auto missing = [&] { return str_cat(call.name, " has no ", placement_name(where), " body"); };
  // Peers on the zero-copy path learn at once that this rank took another one (a zero-copy
  // call says so itself).
  const bool mark = where != Placement::kZeroCopy && comm.symmetric() && comm.symmetric()->active();
  auto marked = [&comm, mark](auto body) {
    return [&comm, mark, b = std::move(body)](auto&&... a) {
      if (mark) comm.symmetric()->enter(comm.seq(), false);
      b(std::forward<decltype(a)>(a)...);
    };
  };
  if (where == Placement::kZeroCopy && !call.device.is_cpu()) {
    PYRING_CHECK(bodies.resident != nullptr, Error, missing());
    return launch_resident(comm, async_op, desc, args, std::move(bodies.resident));
  }
  switch (where) {
    case Placement::kHost:
    case Placement::kZeroCopy: {
      PYRING_CHECK(bodies.host != nullptr, Error, missing());
      std::function<void(Deadline)> body = std::move(bodies.host);
      if (mark) body = marked(std::move(body));
      if (async_op) return {comm.submit(desc, std::move(body)), DeviceTicket{}};
      comm.run_sync(desc, body);
      return {};
    }
    case Placement::kResident:
      PYRING_CHECK(bodies.resident != nullptr, Error, missing());
      return launch_resident(comm, async_op, desc, args, marked(std::move(bodies.resident)));
    case Placement::kStaged:
      if (bodies.staged_by_queue) {
        return launch_device(comm, async_op, desc, args, marked(std::move(bodies.staged_by_queue)));
      }
      PYRING_CHECK(bodies.staged != nullptr, Error, missing());
      return launch_staged(comm, async_op, desc, args, std::move(bodies.regions),
                           marked(std::move(bodies.staged)));
  }
  PYRING_THROW(Error, "run_plan: unknown placement ", static_cast<int>(where));
}

}  // namespace pyring
