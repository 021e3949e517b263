// Ring allreduce.
//
// Words: the buffer is split into `size` chunks; rank r owns chunk r+1 at the end of the
// reduce-scatter. In reduce-scatter step s (0 <= s < size-1) rank r sends chunk r-s and
// receives chunk r-s-1, which it combines with its own input; the last step yields the owned
// chunk, which is finished (avg divides, float16/bfloat16 round once) straight into `out`.
// In allgather step s rank r receives chunk r-s, complete, from its left neighbour.
//
// Pipelining: every receive is posted up front; each piece (a segment as delivered by the
// link) is combined and forwarded to the right as soon as it lands, so a chunk's segments flow
// around the ring without waiting for whole steps.
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/driver.h"
#include "collectives/header.h"
#include "core/errors.h"
#include "kernels/reduce.h"
#include "transport/link.h"

namespace pyring {

void ring_allreduce(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
                    Deadline deadline) {
  const int n = comm.size();
  const int r = comm.rank();
  const DType dtype = in.dtype;
  if (in.count == 0) return;
  if (n == 1) {
    finish_single(dtype, in.data, out.data, in.count);
    return;
  }
  const DType acc_type = accum_dtype(dtype);
  const size_t esz = dtype_size(dtype);
  const size_t asz = dtype_size(acc_type);
  const Chunks chunks{in.count, static_cast<size_t>(n)};
  // Partial results live in `out` when they have the caller's type, else in float32 scratch.
  uint8_t* acc = acc_type == dtype ? static_cast<uint8_t*>(out.data) : comm.scratch(in.count * asz);
  auto acc_at = [&](size_t elem) { return acc + elem * asz; };
  Link& left = comm.left();
  Link& right = comm.right();
  HeaderExchange header(comm.seq(), CollectiveKind::kAllReduce, dtype, op, in.count);
  header.post(&left, &right, r);

  // Step 0 sends this rank's own input chunk, in the accumulation type.
  {
    size_t c = static_cast<size_t>(r);
    size_t off = chunks.offset(c), len = chunks.size(c);
    const uint8_t* src = in.at(off);
    if (acc_type != dtype) {
      widen(dtype, src, acc_at(off), len);
      src = acc_at(off);
    }
    right.post_send(src, len * asz);
  }

  for (int s = 0; s < n - 1; ++s) {
    size_t c = ring_index(r - s - 1, n);
    size_t base = chunks.offset(c);
    bool last = s == n - 2;
    RecvSpec spec;
    spec.bytes = chunks.size(c) * asz;
    spec.on_piece = [&, base, last](const uint8_t* data, size_t off, size_t len) {
      PYRING_CHECK(off % asz == 0 && len % asz == 0, CommError, "piece of ", len,
                   " bytes at offset ", off, " from rank ", left.peer(),
                   " is not a whole number of ", dtype_name(acc_type), " elements");
      size_t e = base + off / asz, cnt = len / asz;
      if (last) {
        reduce_finish(dtype, op, in.at(e), data, out.at(e), cnt, n);
        right.post_send(out.at(e), cnt * esz);
      } else {
        reduce_accumulate(dtype, op, in.at(e), data, acc_at(e), cnt);
        right.post_send(acc_at(e), cnt * asz);
      }
    };
    left.post_recv(std::move(spec));
  }

  for (int s = 0; s < n - 1; ++s) {
    size_t c = ring_index(r - s, n);
    bool forward = s < n - 2;
    RecvSpec spec;
    spec.bytes = chunks.size(c) * esz;
    spec.copy_to = out.at(chunks.offset(c));
    if (forward) {
      spec.on_piece = [&right](const uint8_t* data, size_t, size_t len) {
        right.post_send(data, len);
      };
    }
    left.post_recv(std::move(spec));
  }

  drive({&left, &right}, deadline, comm.spin_us());
}

}  // namespace pyring
