// Shared declarations of the pyring._C binding files, one file per area.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/communicator.h"
#include "transport/host_channel.h"
#include "transport/registry.h"

namespace pyring::bindings {

namespace py = pybind11;

void register_errors(py::module_& m);
void register_transport(py::module_& m);
void register_communicator(py::module_& m);
void register_device(py::module_& m);
void register_kernels(py::module_& m);
void register_cuda(py::module_& m);
// Names the thread and prints its native stack when std::terminate runs (terminate_trace.cc).
void install_terminate_trace();

// One rank's published endpoint for a channel: (host key, {transport: address}).
using EndpointTuple = std::tuple<std::string, std::map<std::string, std::string>>;
// The endpoints as the transport registry takes them, rank = index.
std::vector<Endpoint> endpoints_of(const std::vector<EndpointTuple>& tuples);

// Python code run by pyring's own threads (work callbacks, the hang account, sim stream
// functions). Python ends a foreign thread that takes the GIL once the interpreter is
// finalizing by unwinding it (pthread_exit) through frames that cannot unwind, torch's
// destructors among them: std::terminate. So such a thread holds a PythonEntry while it runs
// Python (constructed before it takes the GIL, destroyed after it has let go of it), and runs
// nothing (leaving its references) where ok() is false; drain_python_callbacks(), which
// pyring registers with atexit, turns ok() off for new entries and waits for those running.
class PythonEntry {
 public:
  PythonEntry();
  ~PythonEntry();
  PythonEntry(const PythonEntry&) = delete;
  PythonEntry& operator=(const PythonEntry&) = delete;
  bool ok() const { return ok_; }

 private:
  bool ok_;
};

// A Python callable that native threads may hold and drop without the GIL: the last owner's
// release takes the GIL (and leaves the reference at interpreter exit, see PythonEntry). A
// caller of fn holds a PythonEntry and the GIL.
struct PyCallable {
  explicit PyCallable(py::function f) : fn(f.release().ptr()) {}
  ~PyCallable() {
    PythonEntry entry;
    if (!entry.ok()) return;
    py::gil_scoped_acquire gil;
    Py_DECREF(fn);
  }
  PyCallable(const PyCallable&) = delete;
  PyCallable& operator=(const PyCallable&) = delete;
  PyObject* fn;
};

// Destroying a communicator joins its progress and callback threads, and a callback may be
// waiting for the GIL: the GIL is released for the destruction.
struct ReleaseGilDelete {
  void operator()(Communicator* c) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      delete c;
    } else {
      delete c;
    }
  }
};
using CommunicatorPtr = std::unique_ptr<Communicator, ReleaseGilDelete>;
using CommunicatorClass = py::class_<Communicator, CommunicatorPtr>;

using Groups = std::vector<std::vector<std::vector<int>>>;
// Link class name -> (alpha in seconds, bytes per second), over the transports' defaults.
using ModelMap = std::map<std::string, std::pair<double, double>>;

// The Communicator of one rank, connected over the two readied channels (make_communicator.cc).
CommunicatorPtr make_communicator(int rank, int size, double timeout_s, size_t segment_bytes,
                                  uint32_t local_index, uint32_t local_world,
                                  std::shared_ptr<HostChannel> channel, py::bytes secret, int algo,
                                  int spin_us, const std::vector<int>& needed,
                                  std::vector<std::string> level_names, Groups groups,
                                  int log_level, const ModelMap& model, double reduce_bytes_per_s,
                                  std::shared_ptr<HostChannel> p2p_channel, size_t flight_entries,
                                  int shm_copy, int tcp_streams);

// Adds the point-to-point calls and the collectives built on them to the Communicator class.
void register_p2p(CommunicatorClass& cls);

// Links that carry device memory, made at init (device_links_binding.cc).
void register_device_links(CommunicatorClass& cls, py::module_& m);

// The compressed allreduce and its state (wire_binding.cc).
void register_wire(CommunicatorClass& cls, py::module_& m);

// Symmetric memory: enable_symmetric, symmetric_empty, SymmetricBlock (symmetric_binding.cc).
void register_symmetric(CommunicatorClass& cls, py::module_& m);

// Adds fast_all_reduce, the short path of a synchronous in-place all_reduce (fast_call.cc).
void register_fast_call(CommunicatorClass& cls);

// The description of a collective `name` over `v` (op and root -1 where they do not apply).
CollectiveDesc desc_of(const char* name, const BufferView& v, int op = -1, int root = -1);

// Runs `fn` now (returns None) or queues it (returns the Work), with the GIL released.
py::object launch(Communicator& comm, bool async_op, const CollectiveDesc& desc,
                  std::function<void(Deadline)> fn);

// The Python exception instance for a pyring error (GIL held).
py::object to_python_exception(std::exception_ptr error);

// Sets the Python error matching the C++ exception `error` (GIL held).
void set_python_error(std::exception_ptr error);

}  // namespace pyring::bindings
