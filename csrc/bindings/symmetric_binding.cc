// Symmetric memory for Python (core/symmetric.h): the heap enabled at init, collective
// allocations as buffer objects that torch tensors wrap, and the zero-copy counters.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "core/errors.h"

namespace pyring::bindings {

namespace {

// This rank's mapping of one allocation, as a writable buffer. It keeps the communicator
// object (and so its heap) alive; its destruction forgets the allocation, whose mappings go
// with the last reference.
struct SymmetricBlock {
  py::object owner;  // the Python Communicator object of the heap
  std::shared_ptr<SymmetricAllocation> alloc;
  int local_index = 0;

  SymmetricBlock(py::object o, std::shared_ptr<SymmetricAllocation> a, int li)
      : owner(std::move(o)), alloc(std::move(a)), local_index(li) {}
  SymmetricBlock(const SymmetricBlock&) = delete;
  SymmetricBlock& operator=(const SymmetricBlock&) = delete;
  uint8_t* data() const { return alloc->bases[static_cast<size_t>(local_index)]; }
  ~SymmetricBlock() {
    if (!alloc) return;
    const uint64_t id = alloc->id;
    owner.cast<Communicator&>().symmetric()->release(id);
  }
};

SymmetricHeap& heap_of(Communicator& c) {
  SymmetricHeap* h = c.symmetric();
  PYRING_CHECK_ARG(h != nullptr,
                   "this communicator has no symmetric memory (it is enabled "
                   "by pyring.init)");
  return *h;
}

}  // namespace

void register_symmetric(CommunicatorClass& cls, py::module_& m) {
  py::class_<SymmetricBlock, std::unique_ptr<SymmetricBlock>>(
      m, "SymmetricBlock", py::buffer_protocol(),
      "This rank's mapping of one symmetric allocation (pyring.empty).")
      .def_buffer([](SymmetricBlock& b) {
        PYRING_CHECK_ARG(b.alloc->device.is_cpu(), "a symmetric block on ", b.alloc->device.str(),
                         " is device memory, which has no host buffer");
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.alloc->bytes)}, {1});
      })
      .def_property_readonly(
          "data_ptr", [](const SymmetricBlock& b) { return reinterpret_cast<uintptr_t>(b.data()); })
      .def_property_readonly("nbytes", [](const SymmetricBlock& b) { return b.alloc->bytes; })
      .def_property_readonly("id", [](const SymmetricBlock& b) { return b.alloc->id; })
      .def_property_readonly("device",
                             [](const SymmetricBlock& b) { return b.alloc->device.str(); })
      .def(
          "peer_ptr",
          [](const SymmetricBlock& b, int local_index) {
            PYRING_CHECK_ARG(
                local_index >= 0 && static_cast<size_t>(local_index) < b.alloc->bases.size(),
                "local index ", local_index, " out of range for a local world of ",
                b.alloc->bases.size());
            return reinterpret_cast<uintptr_t>(b.alloc->bases[static_cast<size_t>(local_index)]);
          },
          "The address of local rank `local_index`'s mapping of this allocation in this "
          "process.");
  cls.def(
         "enable_symmetric",
         [](Communicator& c, std::vector<int> local, std::string job, bool shared_cores,
            bool across_hosts) {
           c.enable_symmetric(std::move(local), std::move(job), shared_cores, across_hosts);
         },
         py::arg("local"), py::arg("job"), py::arg("shared_cores") = false,
         py::arg("across_hosts") = false,
         "Symmetric memory over `local` (this host's ranks, in rank order), segments named after "
         "`job`; shared_cores: some local ranks share a core; across_hosts: the job spans hosts "
         "of as many ranks each, grouped by host in its topology. Once, at init.")
      .def(
          "symmetric_empty",
          [](py::object self, size_t bytes, const std::string& what, int kind, int index) {
            Communicator& c = self.cast<Communicator&>();
            SymmetricHeap& h = heap_of(c);
            std::shared_ptr<SymmetricAllocation> a;
            CollectiveDesc d;
            d.name = "empty";
            d.count = bytes;
            d.dtype = DType::kUInt8;
            {
              py::gil_scoped_release nogil;
              const Device dev = kind == static_cast<int>(DeviceKind::kCpu)
                                     ? Device{}
                                     : Device{device_kind_from_int(kind), index};
              c.run_sync(d, [&](Deadline dl) { a = h.allocate(c, bytes, what, dev, dl); });
            }
            return std::make_unique<SymmetricBlock>(self, a, h.local_index());
          },
          py::arg("bytes"), py::arg("what"), py::arg("kind") = 0, py::arg("index") = -1,
          "Collective: every rank allocates `bytes` described by `what` on the device of kind "
          "`kind` (a DeviceKind code; 0: the host) and index `index`; a mismatch raises on "
          "every rank naming both calls. Returns this rank's SymmetricBlock.")
      .def("symmetric_stats", [](Communicator& c) {
        py::dict d;
        const SymmetricHeap* h = c.symmetric();
        d["zero_copy_calls"] = h ? h->zero_copy_calls() : 0;
        d["one_shot_calls"] = h ? h->one_shot_calls() : 0;
        d["slot_calls"] = h ? h->slot_calls() : 0;
        d["barriers"] = h ? h->barriers() : 0;
        d["streamed_calls"] = h ? h->streamed_calls() : 0;
        d["zero_copy_bytes"] = h ? h->zero_copy_bytes() : 0;
        d["symmetric_allocations"] = h ? h->allocations() : 0;
        d["symmetric_bytes"] = h ? h->allocated_bytes() : 0;
        return d;
      });
}

}  // namespace pyring::bindings
