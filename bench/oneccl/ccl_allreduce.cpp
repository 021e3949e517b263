// oneCCL's allreduce, timed the way bench/interleaved.py times the other libraries: per size,
// blocks of iterations, each iteration refills the float32 buffer with rank+1, runs oneCCL's
// barrier, then times one in-place sum allreduce; an iteration's time is the slowest rank's.
// Launched by Intel MPI's mpiexec.hydra (its MPI only carries the KVS address and the
// per-iteration maxima). Prints one JSON line on rank 0:
//   {"sizes": [{"bytes": B, "blocks": [[us, ...], ...], "wrong": W}, ...]}
//
//   ccl_allreduce BYTES[,BYTES...] BLOCKS ITERS WARMUP
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "oneapi/ccl.hpp"

namespace {

std::vector<size_t> parse_sizes(const char* s) {
  std::vector<size_t> out;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!cur.empty()) out.push_back(std::stoull(cur));
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur.push_back(*p);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s BYTES[,BYTES...] BLOCKS ITERS WARMUP\n", argv[0]);
    return 2;
  }
  const std::vector<size_t> sizes = parse_sizes(argv[1]);
  const int blocks = std::atoi(argv[2]), iters0 = std::atoi(argv[3]), warmup0 = std::atoi(argv[4]);
  ccl::init();
  MPI_Init(&argc, &argv);
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ccl::shared_ptr_class<ccl::kvs> kvs;
  ccl::kvs::address_type address;
  if (rank == 0) {
    kvs = ccl::create_main_kvs();
    address = kvs->get_address();
  }
  MPI_Bcast(address.data(), static_cast<int>(address.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank != 0) kvs = ccl::create_kvs(address);
  auto comm = ccl::create_communicator(world, rank, kvs);
  const float want = static_cast<float>(world) * (world + 1) / 2.0f;
  std::string json = "{\"sizes\": [";
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t n = sizes[k] / sizeof(float);
    // As interleaved.py: --iters up to 1 MiB, fewer above (at least 3).
    const size_t scale = std::max<size_t>(1, sizes[k] >> 20);
    const int iters = std::max<int>(3, static_cast<int>(iters0 / scale));
    const int warmup = std::max<int>(1, static_cast<int>(warmup0 / scale));
    std::vector<float> buf(n);
    long wrong = 0;
    json += (k ? ", " : "") + std::string("{\"bytes\": ") + std::to_string(sizes[k]) +
            ", \"blocks\": [";
    for (int b = 0; b < blocks; ++b) {
      std::vector<double> mine, slowest(static_cast<size_t>(iters));
      for (int i = 0; i < warmup + iters; ++i) {
        std::fill(buf.begin(), buf.end(), static_cast<float>(rank + 1));
        ccl::barrier(comm);
        const auto t0 = std::chrono::steady_clock::now();
        ccl::allreduce(buf.data(), buf.data(), n, ccl::reduction::sum, comm).wait();
        const auto t1 = std::chrono::steady_clock::now();
        if (i >= warmup) mine.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      for (float v : buf) wrong += v != want;
      MPI_Reduce(mine.data(), slowest.data(), iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      json += b ? ", [" : "[";
      for (int i = 0; i < iters; ++i) json += (i ? ", " : "") + std::to_string(slowest[i]);
      json += "]";
    }
    long total = 0;
    MPI_Reduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    json += "], \"wrong\": " + std::to_string(total) + "}";
  }
  json += "]}";
  if (rank == 0) std::printf("%s\n", json.c_str());
  MPI_Finalize();
  return 0;
}
