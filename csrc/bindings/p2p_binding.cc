// Point-to-point calls and the collectives that travel the point-to-point links. Addresses
// are raw pointers and sizes are bytes; the Python side validates tensors and keeps them alive
// until the work completes. Every call releases the GIL.
#include <pybind11/stl.h>

#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/device_call.h"
#include "collectives/collectives.h"
#include "core/errors.h"
#include "core/p2p.h"

namespace pyring::bindings {

namespace {

using SpanList = std::vector<std::pair<uintptr_t, size_t>>;

std::vector<Span> spans(const SpanList& list, int size, const char* what) {
  PYRING_CHECK_ARG(list.size() == static_cast<size_t>(size), what, " holds ", list.size(),
                   " blocks for a world of ", size);
  std::vector<Span> out;
  for (const auto& [ptr, bytes] : list) out.push_back(Span{reinterpret_cast<uint8_t*>(ptr), bytes});
  return out;
}

Span span(uintptr_t ptr, size_t bytes) {
  return Span{reinterpret_cast<uint8_t*>(ptr), bytes};
}

void check_root(const Communicator& c, int root, const char* what) {
  PYRING_CHECK_ARG(root >= 0 && root < c.size(), what, " root ", root,
                   " out of range for world size ", c.size());
}

CollectiveDesc desc(const char* name, size_t bytes, int root = -1) {
  CollectiveDesc d;
  d.name = name;
  d.count = bytes;
  d.dtype = DType::kUInt8;
  d.root = root;
  return d;
}

// A queued work, or with async_op false the wait for it (GIL released) and `done(work)`.
py::object finish(std::shared_ptr<Work> work, bool async_op, bool return_source) {
  if (async_op) return py::cast(std::move(work));
  {
    py::gil_scoped_release nogil;
    work->wait(-1);
  }
  return return_source ? py::object(py::int_(work->source())) : py::object(py::none());
}

}  // namespace

void register_p2p(CommunicatorClass& cls) {
  cls.def(
         "send",
         [](Communicator& c, uintptr_t ptr, size_t bytes, int dst, int64_t tag, bool async_op,
            bool waits) {
           std::shared_ptr<Work> w;
           {
             py::gil_scoped_release nogil;
             w = c.p2p().send(reinterpret_cast<const void*>(ptr), bytes, P2pAddress{dst, tag},
                              Deadline::after(c.options().timeout_s), !async_op || waits);
           }
           return finish(std::move(w), async_op, false);
         },
         py::arg("ptr"), py::arg("nbytes"), py::arg("dst"), py::arg("tag"), py::arg("async_op"),
         py::arg("waits") = false,
         "Sends nbytes to rank dst; async: the Work, else None once the bytes have left. waits: "
         "the caller waits on the Work at once (the p2p thread is not woken for it).")
      .def(
          "recv",
          [](Communicator& c, uintptr_t ptr, size_t bytes, int src, int64_t tag, bool async_op,
             bool waits) {
            std::shared_ptr<Work> w;
            {
              py::gil_scoped_release nogil;
              w = c.p2p().recv(reinterpret_cast<void*>(ptr), bytes, P2pAddress{src, tag},
                               Deadline::after(c.options().timeout_s), !async_op || waits);
            }
            return finish(std::move(w), async_op, true);
          },
          py::arg("ptr"), py::arg("nbytes"), py::arg("src"), py::arg("tag"), py::arg("async_op"),
          py::arg("waits") = false,
          "Receives nbytes from rank src (-1: any); async: the Work (its source once complete), "
          "else the source rank.")
      .def_property("single_copy_bytes", &Communicator::single_copy_bytes,
                    &Communicator::set_single_copy_bytes,
                    "gather/scatter/all_to_all blocks from this size up go single copy between "
                    "ranks of one host (0: never).")
      .def(
          "p2p_bytes",
          [](Communicator& c) {
            return std::make_tuple(c.p2p().bytes_sent(), c.p2p().bytes_received(),
                                   c.single_copy_read());
          },
          "(bytes sent, bytes received) over the point-to-point links, frames included, and "
          "the payload bytes read single copy.")
      .def(
          "gather",
          [](Communicator& c, uintptr_t in, size_t bytes, const SpanList& blocks, int root,
             bool async_op, const py::object& device) {
            check_root(c, root, "gather");
            std::vector<Span> b;
            if (c.rank() == root) b = spans(blocks, c.size(), "gather's output list");
            Span s = span(in, bytes);
            const DeviceArgs da = device_args(device);
            return py_run_plan(c, async_op, desc("gather", bytes, root),
                               call_of(CallKind::kPersonal, "gather", da), da,
                               [&](auto where) { return gather_bodies(where, c, s, b, root); });
          },
          py::arg("inp"), py::arg("nbytes"), py::arg("blocks"), py::arg("root"),
          py::arg("async_op"), py::arg("device") = py::none())
      .def(
          "scatter",
          [](Communicator& c, const SpanList& blocks, uintptr_t out, size_t bytes, int root,
             bool async_op, const py::object& device) {
            check_root(c, root, "scatter");
            std::vector<Span> b;
            if (c.rank() == root) b = spans(blocks, c.size(), "scatter's input list");
            Span s = span(out, bytes);
            const DeviceArgs da = device_args(device);
            return py_run_plan(c, async_op, desc("scatter", bytes, root),
                               call_of(CallKind::kPersonal, "scatter", da), da,
                               [&](auto where) { return scatter_bodies(where, c, b, s, root); });
          },
          py::arg("blocks"), py::arg("out"), py::arg("nbytes"), py::arg("root"),
          py::arg("async_op"), py::arg("device") = py::none())
      .def(
          "all_to_all",
          [](Communicator& c, const SpanList& in, const SpanList& out, bool async_op,
             const py::object& device) {
            std::vector<Span> i = spans(in, c.size(), "all_to_all's input");
            std::vector<Span> o = spans(out, c.size(), "all_to_all's output");
            size_t total = 0;
            for (const auto& s : i) total += s.bytes;
            const DeviceArgs da = device_args(device);
            return py_run_plan(c, async_op, desc("all_to_all", total),
                               call_of(CallKind::kPersonal, "all_to_all", da), da,
                               [&](auto where) { return all_to_all_bodies(where, c, i, o); });
          },
          py::arg("inp"), py::arg("out"), py::arg("async_op"), py::arg("device") = py::none(),
          "inp[j] goes to rank j; out[j] comes from rank j. Lists of (address, bytes).");
}

}  // namespace pyring::bindings
