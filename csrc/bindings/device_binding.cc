// Device queries, the DeviceTicket of async device collectives, and the sim device's test
// hooks (pyring.testing). Addresses are integers; streams are StreamIds.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <cstring>

#include "bindings/bindings.h"
#include "bindings/device_call.h"
#include "core/errors.h"
#include "device/sim/sim_runtime.h"
#include "kernels/cuda_device.h"

namespace pyring::bindings {

namespace {

void* ptr(uintptr_t p) {
  return reinterpret_cast<void*>(p);
}

double timeout_or(double timeout_s, double fallback) {
  return timeout_s < 0 ? fallback : timeout_s;
}

void register_sim(py::module_& m) {
  m.def("sim_device_count", [] { return sim_runtime().device_count(); });
  m.def("sim_alloc", [](int index, size_t bytes) {
    return reinterpret_cast<uintptr_t>(sim_runtime().alloc_cached(index, bytes));
  });
  m.def("sim_free", [](int index, uintptr_t p) { sim_runtime().release(index, ptr(p)); });
  m.def(
      "sim_cuda_free",
      [](int index, uintptr_t p) {
        py::gil_scoped_release nogil;
        sim_runtime().free(index, ptr(p));
      },
      "What cudaFree does: waits for the device's streams, then frees (and unmaps: a late "
      "access faults) memory from sim_alloc.");
  m.def(
      "sim_synchronize_device",
      [](int index) {
        py::gil_scoped_release nogil;
        sim_runtime().synchronize_device(index);
      },
      "What cudaDeviceSynchronize does (and cudaMalloc, cudaFree or a kernel's first launch "
      "may): waits for every stream of the device, holding back other threads' work on it.");
  m.def("sim_allocated_bytes", [] { return sim_runtime().allocated_bytes(); });
  m.def(
      "sim_create_stream",
      [](int index, bool blocking) {
        return blocking ? sim_runtime().create_blocking_stream(index)
                        : sim_runtime().create_stream(index);
      },
      py::arg("index"), py::arg("blocking") = false);
  m.def("sim_ipc_mappings", [] { return sim_runtime().ipc_mappings(); });
  m.def(
      "sim_host_view",
      [](uintptr_t p) { return reinterpret_cast<uintptr_t>(sim_runtime().host_view(ptr(p))); },
      "Where queued operations reach sim device address p (host code touching p itself faults, "
      "as on a GPU).");
  m.def(
      "sim_write_flag",
      [](int index, StreamId s, uintptr_t flag, uint64_t value) {
        py::gil_scoped_release nogil;
        sim_runtime().write_flag(index, s, static_cast<Flag*>(ptr(flag)), value);
      },
      "Queues the raise of the 64-bit flag at `flag` on stream s (write_flag).");
  m.def("sim_destroy_stream", [](int index, StreamId s) {
    py::gil_scoped_release nogil;
    sim_runtime().destroy_stream(index, s);
  });
  m.def("sim_synchronize", [](int index, StreamId s) {
    py::gil_scoped_release nogil;
    sim_runtime().synchronize(index, s);
  });
  m.def("sim_copy", [](int index, uintptr_t dst, uintptr_t src, size_t bytes, StreamId s) {
    py::gil_scoped_release nogil;
    sim_runtime().copy_async(index, ptr(dst), ptr(src), bytes, s);
  });
  m.def("sim_set_delay_us", [](int us) { sim_runtime().set_delay_us(us); });
  m.def("sim_current_device", [] { return sim_runtime().current_device(); });
  m.def("sim_set_device", [](int index) { sim_runtime().make_current(index); });
  m.def("sim_set_capturing",
        [](int index, StreamId s, bool on) { sim_runtime().set_capturing(index, s, on); });
  m.def(
      "sim_launch",
      [](int index, StreamId s, py::function fn) {
        // Runs on the stream's thread: takes the GIL, and drops `fn` while holding it.
        auto holder = std::make_shared<py::function>(std::move(fn));
        // Without the GIL: a synchronizing call of another thread may hold the device until a
        // stream has run an earlier fn, which takes the GIL.
        py::gil_scoped_release nogil;
        sim_runtime().launch(index, s, [holder] {
          PythonEntry entry;
          if (!entry.ok()) {  // the interpreter is exiting: fn is left, not run
            holder->release();
            return;
          }
          py::gil_scoped_acquire gil;
          std::string error;
          try {
            (*holder)();
          } catch (py::error_already_set& e) {
            error = e.what();
          }
          *holder = py::function();
          if (!error.empty()) throw std::runtime_error(error);
        });
      },
      py::arg("index"), py::arg("stream"), py::arg("fn"),
      "Queues fn() on a sim stream: a kernel of the test's own.");
  m.def("sim_ipc_handle", [](int index, uintptr_t p) {
    IpcHandle h = sim_runtime().ipc_handle(index, ptr(p));
    return py::bytes(reinterpret_cast<const char*>(h.bytes), sizeof h.bytes);
  });
  m.def("sim_ipc_open", [](int index, py::bytes handle) {
    std::string b = handle;
    PYRING_CHECK_ARG(b.size() == sizeof(IpcHandle::bytes), "an IPC handle has ",
                     sizeof(IpcHandle::bytes), " bytes, got ", b.size());
    IpcHandle h;
    std::memcpy(h.bytes, b.data(), b.size());
    return reinterpret_cast<uintptr_t>(sim_runtime().ipc_open(index, h));
  });
  m.def("sim_ipc_close", [](int index, uintptr_t p) { sim_runtime().ipc_close(index, ptr(p)); });
}

}  // namespace

void register_device(py::module_& m) {
  m.def("built_with_cuda", &built_with_cuda, "True when the CUDA kernels were compiled in.");
  m.def("cuda_device_count", &cuda_device_count,
        "Usable CUDA devices; 0 without CUDA, a driver or a device.");
  m.def("cuda_device_name", &cuda_device_name, py::arg("index"));
  py::list kinds;
  for (int k = 0; k < kNumDeviceKinds; ++k) kinds.append(device_kind_name(DeviceKind(k)));
  m.attr("DEVICE_KIND_NAMES") = py::tuple(kinds);
  m.attr("SIM_DEFAULT_DEVICES") = kSimDefaultDevices;
  py::class_<DeviceTicket>(m, "DeviceTicket")
      .def_property_readonly("device",
                             [](const DeviceTicket& t) { return t.queue->device().str(); })
      .def(
          "order_after",
          [](const DeviceTicket& t, StreamId stream) {
            // Queueing may wait behind another thread's synchronizing call: not with the GIL.
            py::gil_scoped_release nogil;
            t.queue->order_after(stream, t.ticket);
          },
          py::arg("stream"), "Queues on `stream` a wait for the collective's device results.")
      .def("done", [](const DeviceTicket& t) { return t.queue->done(t.ticket); })
      .def("is_completed", [](const DeviceTicket& t) { return t.queue->done(t.ticket); })
      .def(
          "wait_done",
          [](const DeviceTicket& t, double timeout_s) {
            py::gil_scoped_release nogil;
            t.queue->wait_done(t.ticket, Deadline::after(timeout_or(timeout_s, 1e9)));
          },
          py::arg("timeout_s") = -1.0,
          "Blocks until the device results are in place; CommTimeout after timeout_s.");
  m.def(
      "device_copy",
      [](int kind, int index, StreamId stream, uintptr_t dst, uintptr_t src, size_t bytes) {
        DeviceRuntime& rt = device_runtime(device_kind_from_int(kind));
        py::gil_scoped_release nogil;
        rt.copy_async(index, ptr(dst), ptr(src), bytes, stream);
        rt.synchronize(index, stream);
      },
      py::arg("kind"), py::arg("index"), py::arg("stream"), py::arg("dst"), py::arg("src"),
      py::arg("bytes"),
      "Copies bytes between device and host memory on `stream`, after the work queued on it, "
      "and returns once the copy is done (the host waits).");
  m.def(
      "set_cached_memory_releaser",
      [](py::object fn) {
        if (fn.is_none()) {
          set_cached_memory_releaser({});
          return;
        }
        auto held = std::make_shared<PyCallable>(fn.cast<py::function>());
        set_cached_memory_releaser([held](const Device& device) {
          PythonEntry entry;
          if (!entry.ok()) return;
          py::gil_scoped_acquire gil;
          try {
            py::handle(held->fn)(device.str());
          } catch (py::error_already_set& e) {  // the retry's failure says the memory is short
            e.discard_as_unraisable("pyring's cached-memory releaser");
          }
        });
      },
      py::arg("fn"),
      "fn(device name) asks the caching allocator beside pyring to release its cached device "
      "memory; pyring calls it from any thread when a device allocation of its own fails, then "
      "tries once more. None: nothing to ask.");
  m.def("device_memory_held", [] {
    py::dict d;
    for (const auto& [name, bytes] : device_memory_held()) {
      if (bytes > 0) d[py::str(name)] = bytes;
    }
    return d;
  });
  m.def(
      "launch_out_of_bounds",
      [](int kind, int index, StreamId stream) {
        DeviceRuntime& rt = device_runtime(device_kind_from_int(kind));
        py::gil_scoped_release nogil;
        rt.launch_out_of_bounds(index, stream);
      },
      py::arg("kind"), py::arg("index"), py::arg("stream"),
      "Test-only: queues on `stream` a kernel that writes out of bounds, so that the device "
      "faults (an illegal address, sticky: the device is unusable in this process afterwards).");
  register_sim(m);
}

}  // namespace pyring::bindings
