// The compressed allreduce (collectives/compressed.h) and its onebit state, for
// pyring/compression.py.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "bindings/device_call.h"
#include "codecs/codec.h"
#include "codecs/message.h"
#include "collectives/codec_flat.h"
#include "collectives/compressed.h"
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
  py::list names, feedback;
  for (const Codec* c : codecs()) {
    names.append(c->name());
    if (c->error_feedback()) feedback.append(c->name());
  }
  m.attr("WIRE_NAMES") = py::tuple(names);         // indexed by the wire's code
  m.attr("FEEDBACK_WIRES") = py::tuple(feedback);  // those that need a state
  m.def(
      "_wire_encoded_bytes",
      [](const std::string& wire, size_t n) { return codec_of(wire_named(wire)).encoded_bytes(n); },
      py::arg("wire"), py::arg("n"),
      "Bytes of the wire's encoding of n values (the most: onebit).");
  m.def(
      "wire_message_max_bytes",
      [](const std::string& wire, size_t n) { return message_max_bytes(wire_named(wire), n); },
      py::arg("wire"), py::arg("n"), "The most bytes one message of n values takes on the wire.");
  m.def(
      "wire_encode_message",
      [](const std::string& wire, uintptr_t in, uintptr_t residual, size_t n, uintptr_t out) {
        const Wire w = wire_named(wire);
        py::gil_scoped_release nogil;
        return encode_message(w, reinterpret_cast<const float*>(in),
                              reinterpret_cast<float*>(residual), n,
                              reinterpret_cast<uint8_t*>(out));
      },
      py::arg("wire"), py::arg("inp"), py::arg("residual"), py::arg("n"), py::arg("out"),
      "Encodes n float32 at inp (+ the float32 residual, 0: none, which keeps what the encoding "
      "dropped) into out (room for wire_message_max_bytes); returns the bytes written "
      "(codecs/message.h).");
  m.def(
      "wire_decode_message",
      [](const std::string& wire, uintptr_t enc, size_t bytes, size_t n, uintptr_t out) {
        const Wire w = wire_named(wire);
        py::gil_scoped_release nogil;
        decode_message(w, reinterpret_cast<const uint8_t*>(enc), bytes, n,
                       reinterpret_cast<float*>(out));
      },
      py::arg("wire"), py::arg("enc"), py::arg("bytes"), py::arg("n"), py::arg("out"),
      "Decodes a message of `bytes` bytes into n float32 at out; raises CommError when its size "
      "is not an encoding of n values on the wire (codecs/message.h).");
  m.def("_codec_segments", &codec_segments, py::arg("widest"), py::arg("slowest_bytes_per_s"),
        "Segments per chunk of the generic codec schedule (collectives/codec_flat.h).");
  py::class_<WireState, std::shared_ptr<WireState>>(m, "WireState")
      .def(py::init<>())
      .def_property_readonly("empty",
                             [](const WireState& s) { return s.worker.empty() && s.masks.empty(); })
      .def(
          "get",
          [](WireState& s) {
            {
              py::gil_scoped_release nogil;
              s.to_host();
            }
            const py::tuple shape =
                s.bound_n() && !s.pending.empty()
                    ? py::make_tuple(s.bound_n(), s.bound_participants(), s.bound_index())
                    : py::tuple();
            return py::make_tuple(to_array(s.worker), to_array(s.server), to_array(s.masks),
                                  to_array(s.pending), shape);
          },
          "(worker, server, masks, scales, shape) copied out as numpy arrays (from the device, "
          "where they are): the kept residuals' bfloat16 bits as uint16, the mask caches, the "
          "deferred scales and the (n, participants, index) their layout follows (() when "
          "there is none); empty before first use.")
      .def(
          "settled",
          [](WireState& s) {
            py::array_t<float> w(static_cast<py::ssize_t>(s.worker.size()));
            py::array_t<float> sv(static_cast<py::ssize_t>(s.server.size()));
            {
              py::gil_scoped_release nogil;
              s.to_host();
              s.settled_copy(w.mutable_data(), sv.mutable_data());
            }
            return py::make_tuple(w, sv);
          },
          "(worker, server): the residuals the kept ones stand for, as float32 numpy arrays.")
      .def(
          "set",
          [](WireState& s,
             const py::array_t<uint16_t, py::array::c_style | py::array::forcecast>& w,
             const py::array_t<uint16_t, py::array::c_style | py::array::forcecast>& sv,
             const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& mk,
             const py::array_t<float, py::array::c_style | py::array::forcecast>& scales,
             const std::vector<int64_t>& shape) {
            PYRING_CHECK_ARG(shape.empty() || shape.size() == 3,
                             "WireState.set: shape is (n, participants, index) or (), not ",
                             shape.size(), " numbers");
            PYRING_CHECK_ARG(shape.empty() || scales.size() > 0,
                             "WireState.set: a shape goes with the scales it lays out");
            PYRING_CHECK_ARG(!shape.empty() || scales.size() == 0,
                             "WireState.set: deferred scales need the shape they follow");
            s.drop_device();
            s.worker = from_array(w);
            s.server = from_array(sv);
            s.masks = from_array(mk);
            s.pending = from_array(scales);
            if (shape.empty()) {
              s.restore(0, 0, 0);
            } else {
              PYRING_CHECK_ARG(shape[0] > 0 && shape[1] > 0 && shape[2] >= 0 && shape[2] < shape[1],
                               "WireState.set: shape (", shape[0], ", ", shape[1], ", ", shape[2],
                               ") is not (n > 0, participants > 0, 0 <= index < participants)");
              s.restore(static_cast<size_t>(shape[0]), static_cast<int>(shape[1]),
                        static_cast<int>(shape[2]));
            }
          },
          py::arg("worker"), py::arg("server"), py::arg("masks"), py::arg("scales"),
          py::arg("shape"),
          "Restores a state as get() gave it (scales empty and shape (): settled residuals); "
          "the next call checks it fits its tensor.");
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
        CallDesc call = call_of(CallKind::kWireAllReduce, "all_reduce_wire", v, da, a);
        call.wire = w;
        const CollectiveDesc desc = desc_of("all_reduce", v, op);
        if (codec_of(w).schedule() == Schedule::kExact) {  // no codec: the ordinary allreduce
          return py_run_plan(c, async_op, desc, call, da, [&](auto where) {
            return allreduce_bodies(where, c, v, v, rop, a, da.device);
          });
        }
        return py_run_plan(c, async_op, desc, call, da, [&](auto where) {
          return compressed_bodies(where, c, v, exact_tail, w, rop, state, a, da.device);
        });
      },
      py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("wire"),
      py::arg("state"), py::arg("exact_tail"), py::arg("async_op"), py::arg("algo") = -1,
      py::arg("device") = py::none(),
      "All_reduce on a compressed wire, in place: one collective (collectives/compressed.h).");
}

}  // namespace pyring::bindings
