// The CUDA kernels' bodies (kernels/reduce_functors.h, kernels/onebit_functors.h) run on the
// host over an emulated grid: the sim device's kernels. A launch of B blocks of T threads runs
// with the grid, the vector-or-scalar choice and the arguments the CUDA launch code gives it;
// thread (b, t) runs to its end for b = 0..B-1 and t = 0..T-1 in turn. That is one order the
// device may take: the threads of these kernels share nothing but the encoder's block sums,
// which run once every thread of the block has finished its sweep, in the device's order.
#include <cstring>

#include "kernels/onebit.h"
#include "kernels/onebit_functors.h"
#include "kernels/reduce.h"
#include "kernels/reduce_functors.h"
#include "kernels/wire_cast.h"

namespace pyring {

namespace {

// The launcher of reduce_functors.h: every thread of the grid in turn.
struct HostLaunch {
  template <class F>
  void operator()(const F& f, size_t n, bool vectors, int blocks) const {
    const auto grid = static_cast<unsigned>(blocks);
    for (unsigned b = 0; b < grid; ++b) {
      for (unsigned t = 0; t < kElementwiseThreads; ++t) {
        elementwise_thread<F::N>(f, n, vectors, GridPos{grid, kElementwiseThreads, b, t});
      }
    }
  }
};

// __shfl_down_sync's tree over one warp's values, in place: for d = 16, 8, 4, 2, 1 every lane l
// adds lane l + d's value (its own where l + d is past the warp, as the device gives), all
// lanes at once. Lane 0 ends with the warp's sum in the device's order.
template <class T>
void warp_tree(T* lane) {
  for (int d = kWarp / 2; d > 0; d >>= 1) {
    T before[kWarp];
    std::memcpy(before, lane, sizeof before);
    for (int l = 0; l < kWarp; ++l) lane[l] += l + d < kWarp ? before[l + d] : before[l];
  }
}

// onebit.cu's block_sum over one block whose threads' sums are sq[t] and z[t]: each warp's
// tree, then warps 1.. added in order to warp 0's, then the total added to ws (the device's
// atomics take the blocks in some order; here they go in block order).
void block_sum(double* sq, unsigned long long* z, OnebitWorkspace& ws) {
  for (int w = 0; w < kOnebitThreads / kWarp; ++w) {
    warp_tree(sq + w * kWarp);
    warp_tree(z + w * kWarp);
  }
  double block_sq = sq[0];
  unsigned long long block_z = z[0];
  for (int w = 1; w < kOnebitThreads / kWarp; ++w) {
    block_sq += sq[w * kWarp];
    block_z += z[w * kWarp];
  }
  ws.sumsq += block_sq;
  ws.zeros += block_z;
}

}  // namespace

void grid_reduce_accumulate(DType dtype, ReduceOp op, const void* a, const void* b, void* acc,
                            size_t n) {
  reduce_accumulate_on(HostLaunch{}, dtype, op, a, b, acc, n);
}

void grid_reduce_finish(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t n,
                        int world) {
  reduce_finish_on(HostLaunch{}, dtype, op, a, b, out, n, world);
}

void grid_finish_wide(DType dtype, ReduceOp op, const void* acc, void* out, size_t n, int world) {
  finish_wide_on(HostLaunch{}, dtype, op, acc, out, n, world);
}

void grid_cast(DType from, DType to, const void* in, void* out, size_t n) {
  cast_on(HostLaunch{}, "grid_cast", from, to, in, out, n);
}

size_t grid_onebit_encode(const float* in, uint16_t* residual, float pending, size_t n,
                          uint8_t* out, OnebitHeader* header) {
  OnebitWorkspace ws{0.0, 0};
  if (n) {
    const OnebitEncode f = onebit_encode_sweep(in, residual, pending, n, out);
    const auto grid = static_cast<unsigned>(onebit_blocks((n + 7) / 8));
    for (unsigned b = 0; b < grid; ++b) {
      double sq[kOnebitThreads];
      unsigned long long z[kOnebitThreads];
      for (unsigned t = 0; t < kOnebitThreads; ++t) {
        sq[t] = 0.0;
        z[t] = 0;
        f.thread(GridPos{grid, kOnebitThreads, b, t}, sq[t], z[t]);
      }
      block_sum(sq, z, ws);
    }
  }
  onebit_write_header(n, ws, out);
  std::memcpy(header, out, sizeof(OnebitHeader));
  return onebit_segment_bytes(*header, n);
}

void grid_onebit_decode(const OnebitHeader& header, const uint8_t* encoded, size_t n, float alpha,
                        bool accumulate, float* out) {
  const OnebitDecode f = onebit_decode_sweep(header, encoded, n, alpha, accumulate, out);
  if (n == 0) return;
  const auto grid = static_cast<unsigned>(onebit_blocks((n + 7) / 8));
  for (unsigned b = 0; b < grid; ++b) {
    for (unsigned t = 0; t < kOnebitThreads; ++t) f.thread(GridPos{grid, kOnebitThreads, b, t});
  }
}

}  // namespace pyring
