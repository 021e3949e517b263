// The compressed allreduce (collectives/compressed.h) and its onebit state, for
// pyring/compression.py.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "bindings/device_call.h"
#include "collectives/compressed.h"
#include "collectives/compressed_half.h"
#include "core/errors.h"

namespace pyring::bindings {

namespace {

template <class T>
py::array_t<T> to_array(const std::vector<T>& v) {
  return py::array_t<T>(static_cast<py::ssize_t>(v.size()), v.data());
}

template <class T>
std::vector<T> from_array(const py::array_t<T, py::array::c_style | py::array::forcecast>& a) {
  return std::vector<T>(a.data(), a.data() + a.size());
}

}  // namespace

void register_wire(CommunicatorClass& cls, py::module_& m) {
  py::list names;
  for (int w = 0; w < kNumWires; ++w) names.append(wire_name(static_cast<Wire>(w)));
  m.attr("WIRE_NAMES") = py::tuple(names);
  m.def("_half_segments", &half_segments, py::arg("widest"), py::arg("slowest_bytes_per_s"),
        "Segments per chunk of the fp16/bf16 wires (collectives/compressed_half.h).");
  py::class_<WireState, std::shared_ptr<WireState>>(m, "WireState")
      .def(py::init<>())
      .def_property_readonly("empty",
                             [](const WireState& s) { return s.worker.empty() && s.masks.empty(); })
      .def(
          "get",
          [](WireState& s) {
            py::array_t<float> w(static_cast<py::ssize_t>(s.worker.size()));
            py::array_t<float> sv(static_cast<py::ssize_t>(s.server.size()));
            {
              py::gil_scoped_release nogil;
              s.to_host();
              s.settled_copy(w.mutable_data(), sv.mutable_data());
            }
            return py::make_tuple(w, sv, to_array(s.masks));
          },
          "(worker, server, masks) copied out as numpy arrays (from the device, where they "
          "are), the residuals settled; empty before first use.")
      .def(
          "set",
          [](WireState& s, const py::array_t<float, py::array::c_style | py::array::forcecast>& w,
             const py::array_t<float, py::array::c_style | py::array::forcecast>& sv,
             const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& mk) {
            s.drop_device();
            s.worker = from_array(w);
            s.server = from_array(sv);
            s.masks = from_array(mk);
            s.pending.clear();  // settled residuals
          },
          py::arg("worker"), py::arg("server"), py::arg("masks"),
          "Restores a state; the next call checks it fits its tensor.");
  cls.def(
      "all_reduce_wire",
      [](Communicator& c, uintptr_t ptr, size_t count, int dtype, int op, int wire,
         std::shared_ptr<WireState> state, size_t exact_tail, bool async_op, int algo,
         const py::object& device) {
        BufferView v{reinterpret_cast<void*>(ptr), count, dtype_from_int(dtype)};
        const ReduceOp rop = op_from_int(op);
        const Wire w = wire_from_int(wire);
        const Algo a = algo < 0 ? c.options().algo : algo_from_int(algo);
        check_compressed(c, v, exact_tail, w, rop, state.get(), a);
        const DeviceArgs da = device_args(device);
        if (w == Wire::kFp32 && !da.device.is_cpu()) {  // no codec: the ordinary allreduce
          return allreduce_on_device(c, async_op, v, v, rop, a, da);
        }
        const CollectiveDesc desc = desc_of("all_reduce", v, op);
        if (!da.device.is_cpu() && v.dtype != DType::kFloat64) {  // the codec on the device
          return launch_resident(c, async_op, desc, da,
                                 [&c, v, exact_tail, w, rop, state, a, da](StreamId s, Deadline d) {
                                   compressed_allreduce(c, on_stream(v, da.device, s), exact_tail,
                                                        w, rop, state.get(), a, d);
                                 });
        }
        if (!da.device.is_cpu()) {  // float64: no device cast; staged through the host
          return launch_staged(
              c, async_op, desc, da, {StagedRegion{v.data, v.bytes(), true, true}},
              [&c, v, exact_tail, w, rop, state, a](Deadline d, uint8_t* const* h) {
                compressed_allreduce(c, host_view(v, h[0]), exact_tail, w, rop, state.get(), a, d);
              });
        }
        return launch(c, async_op, desc, [&c, v, exact_tail, w, rop, state, a](Deadline d) {
          compressed_allreduce(c, v, exact_tail, w, rop, state.get(), a, d);
        });
      },
      py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("wire"),
      py::arg("state"), py::arg("exact_tail"), py::arg("async_op"), py::arg("algo") = -1,
      py::arg("device") = py::none(),
      "All_reduce on a compressed wire, in place: one collective (collectives/compressed.h).");
}

}  // namespace pyring::bindings
