// pyring._C.Communicator and Work. Arguments arrive validated by pyring/ (contiguous, supported
// dtype, matching sizes); addresses are raw pointers whose owners the Python side keeps alive
// until the work completes. Every collective releases the GIL.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <tuple>

#include "bindings/bindings.h"
#include "bindings/device_call.h"
#include "collectives/collectives.h"
#include "collectives/selector.h"
#include "core/communicator.h"
#include "core/errors.h"
#include "core/link.h"
#include "core/topology.h"
#include "transport/factory.h"
#include "transport/registry.h"
#include "transport/shm/shm_segment.h"
#include "transport/tcp/tcp_connect.h"

namespace pyring::bindings {

namespace {

BufferView view(uintptr_t ptr, size_t count, int dtype) {
  return BufferView{reinterpret_cast<void*>(ptr), count, dtype_from_int(dtype)};
}

Algo call_algo(Communicator& c, int algo) {
  return algo < 0 ? c.options().algo : algo_from_int(algo);
}

bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

std::atomic<int> g_in_python{0};     // PythonEntry objects alive
std::atomic<bool> g_exiting{false};  // drain_python_callbacks() has run

// Owns a Python callable held by the core, which may drop it on a thread without the GIL; at
// interpreter exit the reference is left.
Communicator::HangAccount hang_account_from(py::function f) {
  auto held = std::make_shared<PyCallable>(std::move(f));
  return [held](uint64_t seq, const std::string& what) -> std::string {
    PythonEntry entry;
    if (!entry.ok()) return "";
    py::gil_scoped_acquire gil;
    try {
      return py::cast<std::string>(py::handle(held->fn)(seq, what));
    } catch (const std::exception&) {  // an account that fails leaves the message as it was
      return "";
    }
  };
}

}  // namespace

PythonEntry::PythonEntry() {
  g_in_python.fetch_add(1);  // seq_cst, before the flag is read: drain() sees it or it sees drain
  ok_ = !g_exiting.load() && !python_finalizing();
}

PythonEntry::~PythonEntry() {
  g_in_python.fetch_sub(1);
}

CollectiveDesc desc_of(const char* name, const BufferView& v, int op, int root) {
  CollectiveDesc d;
  d.name = name;
  d.count = v.count;
  d.dtype = v.dtype;
  d.op = op;
  d.root = root;
  return d;
}

py::object launch(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                  std::function<void(Deadline)> fn) {
  if (async_op) {
    std::shared_ptr<Work> work;
    {
      py::gil_scoped_release nogil;
      work = comm.submit(desc, std::move(fn));
    }
    return py::cast(work);
  }
  {
    py::gil_scoped_release nogil;
    comm.run_sync(desc, fn);
  }
  return py::none();  // a reference taken with the GIL held
}

void register_communicator(py::module_& m) {
  py::list algos, dtypes, sizes, ops;
  for (int a = 0; a < kNumAlgos; ++a) algos.append(algo_name(static_cast<Algo>(a)));
  for (int d = 0; d < kNumDTypes; ++d) {
    dtypes.append(dtype_name(static_cast<DType>(d)));
    sizes.append(dtype_size(static_cast<DType>(d)));
  }
  for (int o = 0; o < kNumReduceOps; ++o) ops.append(op_name(static_cast<ReduceOp>(o)));
  m.attr("ALGO_NAMES") = py::tuple(algos);
  m.attr("DEFAULT_SINGLE_COPY_BYTES") = kDefaultSingleCopyBytes;
  m.attr("DTYPE_NAMES") = py::tuple(dtypes);
  m.attr("DTYPE_SIZES") = py::tuple(sizes);
  m.attr("OP_NAMES") = py::tuple(ops);
  m.def(
      "drain_python_callbacks",
      [](double timeout_s) {
        g_exiting.store(true);
        py::gil_scoped_release nogil;  // the ones running may be waiting for it
        using Steady = std::chrono::steady_clock;
        const auto until = Steady::now() + std::chrono::duration<double>(timeout_s);
        while (g_in_python.load() > 0 && Steady::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return g_in_python.load() == 0;
      },
      py::arg("timeout_s"),
      "At interpreter exit: pyring's threads run no more Python; waits up to timeout_s for the "
      "Python they are running. True when none is left.");
  py::list copies;
  for (int c = 0; c < kNumShmCopies; ++c) copies.append(shm_copy_name(static_cast<ShmCopy>(c)));
  m.attr("SHM_COPY_NAMES") = py::tuple(copies);
  m.attr("MAX_TCP_STREAMS") = kMaxTcpStreams;
  const Options defaults;
  m.attr("DEFAULT_REDUCE_BYTES_PER_S") = defaults.reduce_bytes_per_s;
  m.attr("DEFAULT_TIMEOUT_S") = defaults.timeout_s;
  m.attr("DEFAULT_SEGMENT_BYTES") = defaults.segment_bytes;
  m.attr("DEFAULT_FLIGHT_ENTRIES") = defaults.flight_entries;
  m.attr("PROGRESS_SPIN_US") = Communicator::kProgressSpinUs;
  m.def(
      "needed_peers",
      [](int rank, int size, std::vector<std::string> names, Groups groups) {
        Topology t{std::move(names), std::move(groups)};
        t.validate(size);
        return needed_peers(t, rank);
      },
      py::arg("rank"), py::arg("size"), py::arg("level_names"), py::arg("groups"),
      "The peers this rank's algorithms need links to under the topology, ascending.");
  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def_property_readonly("description", &Work::description)
      .def_property_readonly("source", &Work::source,
                             "The rank a completed receive's message came from; else -1.")
      .def("is_completed", &Work::is_completed)
      .def(
          "wait",
          [](Work& w, double timeout_s) {
            py::gil_scoped_release nogil;
            return w.wait(timeout_s);
          },
          py::arg("timeout_s") = -1.0,
          "Waits for completion; False on timeout; raises the collective's error.")
      .def(
          "add_done_callback",
          [](Work& w, py::function fn) {
            // The callback may run on the progress thread: it takes the GIL itself and drops its
            // reference to `fn` while holding it.
            auto holder = std::make_shared<py::function>(std::move(fn));
            w.add_callback([holder](std::exception_ptr err) {
              // At interpreter exit the callback and its reference are left (PythonEntry).
              PythonEntry entry;
              if (!entry.ok()) {
                holder->release();  // forgets fn without touching the interpreter
                return;
              }
              py::gil_scoped_acquire gil;
              try {
                (*holder)(err ? to_python_exception(err) : py::none());
              } catch (py::error_already_set& e) {
                e.discard_as_unraisable("pyring work callback");
              }
              *holder = py::function();
            });
          },
          py::arg("fn"), "Calls fn(error_or_None) once the work completes.");

  CommunicatorClass cls(m, "Communicator");
  cls.def(py::init(&make_communicator), py::arg("rank"), py::arg("size"), py::arg("timeout_s"),
          py::arg("segment_bytes"), py::arg("local_index"), py::arg("local_world"),
          py::arg("channel"), py::arg("secret"), py::arg("algo"), py::arg("spin_us"),
          py::arg("needed"), py::arg("level_names"), py::arg("groups"), py::arg("log_level"),
          py::arg("model"), py::arg("reduce_bytes_per_s"), py::arg("p2p_channel"),
          py::arg("flight_entries") = 256, py::arg("shm_copy") = 0, py::arg("tcp_streams") = 1)
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("broken", &Communicator::broken)
      .def("link_kind",
           [](Communicator& c, int peer) -> py::object {
             if (!c.has_link(peer)) return py::none();
             return py::str(c.link(peer).kind());
           })
      .def("link_bytes",
           [](Communicator& c, int peer) {
             Link& l = c.link(peer);
             return std::make_pair(l.bytes_sent(), l.bytes_received());
           })
      .def(
          "raw_stats",
          [](Communicator& c) {
            py::dict links, calls;
            for (int p = 0; p < c.size(); ++p) {
              if (!c.has_link(p)) continue;
              Link& l = c.link(p);
              links[py::int_(p)] = py::make_tuple(l.kind(), l.bytes_sent(), l.bytes_received(),
                                                  l.bytes_streamed(), l.connections());
            }
            for (int a = 1; a < kNumAlgos; ++a) {
              calls[py::str(algo_name(static_cast<Algo>(a)))] =
                  c.calls().by_algo[static_cast<size_t>(a)].load(std::memory_order_relaxed);
            }
            return py::make_tuple(links, calls);
          },
          "({peer: (transport, bytes sent, bytes received, bytes streamed, tcp connections)}, "
          "{algorithm: calls}) since start.")
      .def(
          "estimate_allreduce",
          [](Communicator& c, size_t bytes) {
            Estimate e = estimate_allreduce(c, bytes);
            py::dict d;
            d["ring"] = e.ring_s;
            d["direct"] = e.direct_s;
            d["tree"] = e.tree_s;
            return d;
          },
          py::arg("bytes"), "The selector's time estimates in seconds, per algorithm.")
      .def(
          "debug_dump",
          [](const Communicator& c) {
            py::list out;
            for (const auto& e : c.recorder().snapshot()) {
              py::dict d;
              d["seq"] = e.seq;
              d["kind"] = e.name;
              d["count"] = e.count;
              d["dtype"] = dtype_name(e.dtype);
              d["op"] = e.op >= 0 ? py::object(py::str(op_name(static_cast<ReduceOp>(e.op))))
                                  : py::object(py::none());
              d["root"] = e.root >= 0 ? py::object(py::int_(e.root)) : py::object(py::none());
              d["algo"] = *e.algo ? py::object(py::str(e.algo)) : py::object(py::none());
              d["start"] = e.start_s;
              d["duration_s"] =
                  e.duration_s >= 0 ? py::object(py::float_(e.duration_s)) : py::object(py::none());
              d["state"] = flight_state_name(e.state);
              d["error"] = e.error.empty() ? py::object(py::none()) : py::object(py::str(e.error));
              out.append(d);
            }
            return out;
          },
          "The flight recorder: this rank's last collectives, oldest first.")
      .def_property_readonly("ring_order", &Communicator::ring_order)
      .def_property_readonly("entered_seq", &Communicator::entered_seq,
                             "The sequence number of the last collective entered (0: none).")
      .def_property_readonly("completed_seq", &Communicator::completed_seq,
                             "The sequence number of the last collective completed (0: none).")
      .def(
          "set_hang_account",
          [](Communicator& c, py::function f) { c.set_hang_account(hang_account_from(f)); },
          "fn(seq, description) -> str, called when a collective times out (before any "
          "collective runs).")
      .def("close",
           [](Communicator& c) {
             py::gil_scoped_release nogil;
             c.close();
           })
      .def(
          "all_reduce",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t count, int dtype, int op,
             bool async_op, int algo, const py::object& device, int root) {
            BufferView vi = view(in, count, dtype), vo = view(out, count, dtype);
            ReduceOp rop = op_from_int(op);
            Algo a = call_algo(c, algo);
            const DeviceArgs da = device_args(device);
            // root >= 0: a reduce to that rank, run as this all_reduce (its headers carry it).
            PYRING_CHECK_ARG(root >= -1 && root < c.size(), "reduce: dst=", root,
                             " is not a rank of a world of ", c.size());
            return py_run_plan(
                c, async_op, desc_of(root >= 0 ? "reduce" : "all_reduce", vi, op, root),
                call_of(CallKind::kAllReduce, "all_reduce", vi, da, a), da,
                [&](auto where) { return allreduce_bodies(where, c, vi, vo, rop, a, da.device); });
          },
          py::arg("inp"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("async_op"), py::arg("algo") = -1, py::arg("device") = py::none(),
          py::arg("root") = -1)
      .def(
          "reduce_scatter",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t out_count, int dtype, int op,
             bool async_op, const py::object& device) {
            BufferView vi = view(in, out_count * static_cast<size_t>(c.size()), dtype);
            BufferView vo = view(out, out_count, dtype);
            ReduceOp rop = op_from_int(op);
            const DeviceArgs da = device_args(device);
            return py_run_plan(c, async_op, desc_of("reduce_scatter_tensor", vi, op),
                               call_of(CallKind::kReduceScatter, "reduce_scatter", vi, da), da,
                               [&](auto where) {
                                 return reduce_scatter_bodies(where, c, vi, vo, rop, da.device);
                               });
          },
          py::arg("inp"), py::arg("out"), py::arg("out_count"), py::arg("dtype"), py::arg("op"),
          py::arg("async_op"), py::arg("device") = py::none())
      .def(
          "all_gather",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t in_count, int dtype,
             bool async_op, const py::object& device) {
            BufferView vi = view(in, in_count, dtype);
            BufferView vo = view(out, in_count * static_cast<size_t>(c.size()), dtype);
            const DeviceArgs da = device_args(device);
            return py_run_plan(
                c, async_op, desc_of("all_gather_into_tensor", vo),
                call_of(CallKind::kAllGather, "all_gather", vi, da), da,
                [&](auto where) { return allgather_bodies(where, c, vi, vo, da.device); });
          },
          py::arg("inp"), py::arg("out"), py::arg("in_count"), py::arg("dtype"),
          py::arg("async_op"), py::arg("device") = py::none())
      .def(
          "broadcast",
          [](Communicator& c, uintptr_t ptr, size_t count, int dtype, int root, bool async_op,
             const py::object& device) {
            PYRING_CHECK_ARG(root >= 0 && root < c.size(), "broadcast root ", root,
                             " out of range for world size ", c.size());
            BufferView v = view(ptr, count, dtype);
            const DeviceArgs da = device_args(device);
            return py_run_plan(
                c, async_op, desc_of("broadcast", v, -1, root),
                call_of(CallKind::kBroadcast, "broadcast", v, da), da,
                [&](auto where) { return broadcast_bodies(where, c, v, root, da.device); });
          },
          py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("root"), py::arg("async_op"),
          py::arg("device") = py::none())
      .def("barrier", [](Communicator& c, bool async_op) {
        CollectiveDesc d;
        d.name = "barrier";
        d.has_data = false;
        return launch(c, async_op, d, [&c](Deadline dl) { barrier(c, dl); });
      });
  register_p2p(cls);
  register_fast_call(cls);
  register_device_links(cls, m);
  register_wire(cls, m);
  register_symmetric(cls, m);
}

}  // namespace pyring::bindings
