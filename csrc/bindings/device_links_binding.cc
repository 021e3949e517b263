// Links that carry device memory, made at init in three steps that pyring/_device_links.py runs
// with store exchanges between them, so that every rank takes the same path:
// prepare_device_transports (before the addresses are published), connect_device_links (every
// rank's addresses in hand), attach_device_links (once every rank connected).
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "core/communicator.h"
#include "core/device_queue.h"
#include "core/errors.h"
#include "core/link.h"
#include "core/shared_file.h"
#include "transport/factory.h"
#include "transport/registry.h"

namespace pyring::bindings {

namespace {

// What a rank made for the device transports before the rendezvous.
struct DevicePrepared {
  Device device;
  std::map<std::string, std::shared_ptr<void>> states;
  std::map<std::string, std::string> addresses;  // published
  std::map<std::string, std::string> refused;    // transport -> why it prepared nothing
};

// Device links made but not yet in use.
struct PendingDeviceLinks {
  std::shared_ptr<DeviceQueue> queue;
  Links links;
  std::string transport;
};

std::shared_ptr<DevicePrepared> prepare(int kind, int index, uint32_t local_world,
                                        size_t slot_bytes, const std::string& job, int rank,
                                        const std::vector<int>& senders) {
  auto p = std::make_shared<DevicePrepared>();
  p->device = Device{device_kind_from_int(kind), index};
  PYRING_CHECK_ARG(!p->device.is_cpu() && index >= 0, "device transports need a device, got ",
                   p->device.str());
  DeviceSetup setup;
  setup.device = p->device;
  setup.local_world = local_world;
  setup.slot_bytes = slot_bytes;
  setup.label = shared_file_label(job, rank, "device");
  setup.senders = senders;
  // Allocating device memory may wait for the device's streams: not with the GIL held.
  py::gil_scoped_release nogil;
  for (const Transport* t : transports()) {
    if (t->memory() != Memory::kDevice) continue;
    try {
      std::string address;
      p->states[t->name()] = t->prepare(setup, &address);
      p->addresses[t->name()] = address;
    } catch (const std::exception& e) {
      p->refused[t->name()] = e.what();
    }
  }
  return p;
}

// (pending links, "") or (None, why not): no exception, so that the ranks can agree.
py::tuple connect(Communicator& comm, const DevicePrepared& prepared,
                  const std::vector<EndpointTuple>& tuples, const std::vector<int>& needed,
                  uint32_t local_index, uint32_t local_world) {
  try {
    const std::vector<Endpoint> endpoints = endpoints_of(tuples);
    PYRING_CHECK_ARG(endpoints.size() == static_cast<size_t>(comm.size()),
                     "every rank's device endpoint is needed");
    const std::vector<int> plan = plan_transports(endpoints, Memory::kDevice);
    if (plan.empty()) return py::make_tuple(py::none(), "no device transport links every pair");
    auto pending = std::make_shared<PendingDeviceLinks>();
    {
      py::gil_scoped_release nogil;
      pending->queue = std::make_shared<DeviceQueue>(prepared.device);
      LinkSetup setup;
      setup.rank = comm.rank();
      setup.size = comm.size();
      setup.local_index = local_index;
      setup.local_world = local_world;
      setup.segment_bytes = comm.options().segment_bytes;
      setup.device = prepared.device;
      setup.stream = pending->queue->stream();
      setup.stream_owner = pending->queue;
      setup.prepared = prepared.states;
      pending->links =
          make_links(setup, endpoints, plan, needed, Deadline::after(comm.options().timeout_s));
    }
    for (int p : needed) {
      const int t = plan[static_cast<size_t>(comm.rank()) * static_cast<size_t>(comm.size()) +
                         static_cast<size_t>(p)];
      pending->transport = transports()[static_cast<size_t>(t)]->name();
    }
    return py::make_tuple(py::cast(pending), "");
  } catch (const std::exception& e) {
    return py::make_tuple(py::none(), std::string(e.what()));
  }
}

}  // namespace

void register_device_links(CommunicatorClass& cls, py::module_& m) {
  py::class_<DevicePrepared, std::shared_ptr<DevicePrepared>>(m, "DevicePrepared")
      .def_readonly("addresses", &DevicePrepared::addresses)
      .def_readonly("refused", &DevicePrepared::refused)
      .def(
          "release",
          [](DevicePrepared& p) {
            for (const auto& [name, state] : p.states) {
              transports()[static_cast<size_t>(transport_index(name))]->release(state.get());
            }
          },
          "Removes what strangers could still find (descriptors peers open shared files "
          "through); the links stay up.");
  py::class_<PendingDeviceLinks, std::shared_ptr<PendingDeviceLinks>>(m, "PendingDeviceLinks")
      .def_readonly("transport", &PendingDeviceLinks::transport);
  m.def("prepare_device_transports", &prepare, py::arg("kind"), py::arg("index"),
        py::arg("local_world"), py::arg("slot_bytes"), py::arg("job"), py::arg("rank"),
        py::arg("senders"),
        "Makes this rank's resources for every device transport, receive memory for the "
        "ranks in `senders` alone; their addresses to publish. release() once every rank "
        "connected, or on failure.");
  cls.def("connect_device_links", &connect, py::arg("prepared"), py::arg("endpoints"),
          py::arg("needed"), py::arg("local_index"), py::arg("local_world"),
          "(PendingDeviceLinks, '') or (None, why the device links could not be made).")
      .def(
          "attach_device_links",
          [](Communicator& c, PendingDeviceLinks& p) {
            PYRING_CHECK_ARG(p.queue != nullptr, "these device links were attached already");
            c.set_device_links(std::move(p.queue), std::move(p.links.by_rank), p.links.keepalive(),
                               p.transport);
          },
          py::arg("pending"))
      .def_property_readonly("device_transport",
                             [](const Communicator& c) -> py::object {
                               if (c.device_transport().empty()) return py::none();
                               return py::str(c.device_transport());
                             })
      .def(
          "device_link_stats",
          [](const Communicator& c) {
            py::dict out;
            for (int p = 0; p < c.size(); ++p) {
              const Link* l = c.device_link(p);
              if (l)
                out[py::int_(p)] = py::make_tuple(l->kind(), l->bytes_sent(), l->bytes_received());
            }
            return out;
          },
          "{peer: (transport, bytes sent, bytes received)} over the device links since start.")
      .def("device_host_bytes", &Communicator::device_host_bytes,
           "Bytes copied between this rank's devices and the host (staging, encoded wire "
           "bytes), since start.");
}

}  // namespace pyring::bindings
