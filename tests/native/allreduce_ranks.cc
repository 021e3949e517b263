// All_reduce through the core's own API, with no pybind and no Python
// (tests/test_native_allreduce.py builds it against the core library and runs it).
//
//   native_allreduce WORLD TRANSPORT DIR
//
// Forks WORLD ranks. Each prepares its two host channels (transport/host_channel.h) with
// TRANSPORT ("shm", "tcp" or "auto") enabled, publishes their addresses as files in DIR, reads
// every rank's, readies the channels, waits for every rank (a file per rank and step),
// assembles its Communicator (transport/assemble.h), releases the channels, and runs
// all_reduce over sizes, dtypes, ops and algorithms whose results have a closed form, on host
// buffers and on buffers of the sim device (placed by the planner, collectives/placement.h,
// and run by collectives/device_launch.h). Exits 0 when every rank checked every result; else
// prints what went wrong and exits 1.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/device_launch.h"
#include "collectives/placement.h"
#include "core/communicator.h"
#include "core/errors.h"
#include "core/topology.h"
#include "core/work.h"
#include "device/runtime.h"
#include "transport/assemble.h"
#include "transport/host_channel.h"

using namespace pyring;

namespace {

std::string g_dir;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Publishes `text` as DIR/name.rank, whole (written aside, then renamed).
void publish(const std::string& name, int rank, const std::string& text) {
  const std::string path = g_dir + "/" + name + "." + std::to_string(rank);
  {
    std::ofstream f(path + ".tmp");
    f << text;
  }
  if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
    throw std::runtime_error("cannot publish " + path);
  }
}

// Every rank's DIR/name.r, waiting up to 30 s for the last.
std::vector<std::string> gather(const std::string& name, int world) {
  std::vector<std::string> out;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int r = 0; r < world; ++r) {
    const std::string path = g_dir + "/" + name + "." + std::to_string(r);
    while (access(path.c_str(), F_OK) != 0) {
      if (std::chrono::steady_clock::now() > until) {
        throw std::runtime_error("rank " + std::to_string(r) + " never published " + name);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    out.push_back(slurp(path));
  }
  return out;
}

void barrier(const std::string& name, int rank, int world) {
  publish(name, rank, "1");
  gather(name, world);
}

// "transport address" lines, one per published transport.
std::string encode(const std::map<std::string, std::string>& addresses) {
  std::string s;
  for (const auto& [t, a] : addresses) s += t + " " + a + "\n";
  return s;
}

std::vector<Endpoint> decode(const std::vector<std::string>& texts) {
  std::vector<Endpoint> out;
  for (size_t r = 0; r < texts.size(); ++r) {
    Endpoint e;
    e.rank = static_cast<int>(r);
    e.host = "this-host";  // every rank is a process of this machine
    std::istringstream lines(texts[r]);
    std::string t, a;
    while (lines >> t >> a) e.addresses[t] = a;
    out.push_back(std::move(e));
  }
  return out;
}

template <typename T>
int check(Communicator& comm, size_t n, DType dtype, ReduceOp op, Algo algo) {
  const int rank = comm.rank(), world = comm.size();
  std::vector<T> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>((i % 7) + rank + 1);
  BufferView v{x.data(), n, dtype};
  CollectiveDesc desc;
  desc.name = "all_reduce";
  desc.count = n;
  desc.dtype = dtype;
  desc.op = static_cast<int>(op);
  comm.run_sync(desc, [&](Deadline d) { allreduce(comm, v, v, op, algo, d); });
  int wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    const double base = static_cast<double>(i % 7) + 1;
    // sum over ranks of base + r, or the largest: base + world - 1
    const double want =
        op == ReduceOp::kSum ? world * base + world * (world - 1) / 2.0 : base + world - 1;
    if (static_cast<double>(x[i]) != want) ++wrong;
  }
  if (wrong) {
    std::fprintf(stderr, "rank %d: %d of %zu wrong (%s, %s, %s)\n", rank, wrong, n,
                 dtype_name(dtype), op_name(op), algo_name(algo));
  }
  return wrong;
}

// The same on a buffer of the sim device (csrc/device/sim/), placed by the planner (staged
// through pinned host memory: no device link joins processes here) and ordered on a stream of
// this rank's own.
template <typename T>
int check_sim(Communicator& comm, size_t n, DType dtype, ReduceOp op, Algo algo) {
  DeviceRuntime& rt = device_runtime(DeviceKind::kSim);
  const Device dev{DeviceKind::kSim, 0};
  const StreamId stream = rt.create_stream(dev.index);
  std::vector<T> x(n), y(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>((i % 7) + comm.rank() + 1);
  void* d = device_alloc(rt, dev.index, n * sizeof(T));
  rt.copy_async(dev.index, d, x.data(), n * sizeof(T), stream);
  const BufferView v{d, n, dtype, dev, stream};
  const DeviceArgs args{dev, stream};
  const CallDesc call = call_of(CallKind::kAllReduce, "all_reduce", v, args, algo);
  const Placement placement = place(comm, call).placement;  // for the message below
  CollectiveDesc desc;
  desc.name = "all_reduce";
  desc.count = n;
  desc.dtype = dtype;
  desc.op = static_cast<int>(op);
  const Launched l = run_placed(comm, false, desc, call, placement, args,
                                allreduce_bodies(placement, comm, v, v, op, algo, dev));
  rt.copy_async(dev.index, y.data(), d, n * sizeof(T), stream);  // ordered after the results
  rt.synchronize(dev.index, stream);
  l.ticket.queue->wait_done(l.ticket.ticket, Deadline::after(30));
  device_free(rt, dev.index, d);
  rt.destroy_stream(dev.index, stream);
  int wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    const double base = static_cast<double>(i % 7) + 1;
    const int world = comm.size();
    const double want =
        op == ReduceOp::kSum ? world * base + world * (world - 1) / 2.0 : base + world - 1;
    if (static_cast<double>(y[i]) != want) ++wrong;
  }
  if (wrong) {
    std::fprintf(stderr, "rank %d: %d of %zu wrong on the sim device (%s, %s, %s, %s)\n",
                 comm.rank(), wrong, n, dtype_name(dtype), op_name(op), algo_name(algo),
                 placement_name(placement));
  }
  return wrong;
}

int run_rank(int rank, int world, const std::string& transport) {
  const std::vector<std::string> enabled =
      transport == "auto" ? std::vector<std::string>{} : std::vector<std::string>{transport};
  HostSetup setup;
  setup.rank = rank;
  setup.job = "native-" + std::to_string(getppid());
  setup.host_ip = "127.0.0.1";
  setup.segment_bytes = 64 << 10;  // several segments per call at the larger sizes
  HostSetup p2p_setup = setup;
  p2p_setup.channel = "p2p";
  HostChannel channel(setup, enabled), p2p(p2p_setup, enabled);
  publish("endpoints", rank, encode(channel.addresses()));
  publish("p2p_endpoints", rank, encode(p2p.addresses()));
  const bool wait = channel.ready(decode(gather("endpoints", world)), world);
  const bool p2p_wait = p2p.ready(decode(gather("p2p_endpoints", world)), world);
  if (wait || p2p_wait) barrier("created", rank, world);
  AssembleArgs args;
  args.rank = rank;
  args.size = world;
  args.options.timeout_s = 30;
  args.options.segment_bytes = setup.segment_bytes;
  args.topology = Topology::flat(world);
  args.local_index = static_cast<uint32_t>(rank);
  args.local_world = static_cast<uint32_t>(world);
  args.secret = std::string(32, 's');  // the job's 32-byte secret, shared by its ranks
  args.needed = needed_peers(args.topology, rank);
  std::unique_ptr<Communicator> comm = assemble(args, channel, p2p);
  barrier("connected", rank, world);
  channel.release();
  p2p.release();
  for (int r = 0; r < world; ++r) {
    const char* t = channel.transport_of(r);
    if (r != rank && (t == nullptr || (transport != "auto" && transport != t))) {
      std::fprintf(stderr, "rank %d: link to rank %d over %s, not %s\n", rank, r, t ? t : "nothing",
                   transport.c_str());
      return 1;
    }
  }
  int wrong = 0;
  for (Algo algo : {Algo::kAuto, Algo::kRing, Algo::kDirect, Algo::kTree}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, (size_t{1} << 18) + 3}) {
      wrong += check<float>(*comm, n, DType::kFloat32, ReduceOp::kSum, algo);
      wrong += check<int32_t>(*comm, n, DType::kInt32, ReduceOp::kMax, algo);
      wrong += check<double>(*comm, n, DType::kFloat64, ReduceOp::kSum, algo);
    }
  }
  for (Algo algo : {Algo::kAuto, Algo::kRing}) {
    for (size_t n : {size_t{1}, size_t{1000}, (size_t{1} << 18) + 3}) {
      wrong += check_sim<float>(*comm, n, DType::kFloat32, ReduceOp::kSum, algo);
      wrong += check_sim<int32_t>(*comm, n, DType::kInt32, ReduceOp::kMax, algo);
    }
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s WORLD shm|tcp|auto DIR\n", argv[0]);
    return 2;
  }
  const int world = std::atoi(argv[1]);
  const std::string transport = argv[2];
  g_dir = argv[3];
  if (world < 1 || world > 16) {
    std::fprintf(stderr, "WORLD must be in 1..16, got %s\n", argv[1]);
    return 2;
  }
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      int rc = 1;
      try {
        rc = run_rank(rank, world, transport);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  if (failed) {
    std::fprintf(stderr, "%d of %d ranks failed\n", failed, world);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
