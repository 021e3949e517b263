// Ring reduce-scatter: in step s (0 <= s < size-1) rank r sends chunk r-s-1 and receives chunk
// r-s-2, so that the last step yields chunk r, finished straight into `out`. Intermediate
// partial chunks live in scratch memory of the accumulation type. Pieces are combined and
// forwarded as they land, as in ring_allreduce.
#include "collectives/collectives.h"
#include "collectives/driver.h"
#include "collectives/header.h"
#include "core/errors.h"
#include "kernels/reduce.h"
#include "transport/link.h"

namespace pyring {

void ring_reduce_scatter(Communicator& comm, const BufferView& in, const BufferView& out,
                         ReduceOp op, Deadline deadline) {
  const int n = comm.size();
  const int r = comm.rank();
  const DType dtype = in.dtype;
  const size_t m = out.count;
  if (m == 0) return;
  if (n == 1) {
    finish_single(dtype, in.data, out.data, m);
    return;
  }
  const DType acc_type = accum_dtype(dtype);
  const size_t asz = dtype_size(acc_type);
  uint8_t* acc = comm.scratch(in.count * asz);
  auto acc_at = [&](size_t elem) { return acc + elem * asz; };
  Link& left = comm.left();
  Link& right = comm.right();
  HeaderExchange header(comm.seq(), CollectiveKind::kReduceScatter, dtype, op, in.count);
  header.post(&left, &right, r);

  {
    size_t off = ring_index(r - 1, n) * m;
    const uint8_t* src = in.at(off);
    if (acc_type != dtype) {
      widen(dtype, src, acc_at(off), m);
      src = acc_at(off);
    }
    right.post_send(src, m * asz);
  }
  for (int s = 0; s < n - 1; ++s) {
    size_t base = ring_index(r - s - 2, n) * m;
    bool last = s == n - 2;
    RecvSpec spec;
    spec.bytes = m * asz;
    spec.on_piece = [&, base, last](const uint8_t* data, size_t off, size_t len) {
      PYRING_CHECK(off % asz == 0 && len % asz == 0, CommError, "piece of ", len,
                   " bytes from rank ", left.peer(), " is not a whole number of elements");
      size_t e = base + off / asz, cnt = len / asz;
      if (last) {
        reduce_finish(dtype, op, in.at(e), data, out.at(off / asz), cnt, n);
      } else {
        reduce_accumulate(dtype, op, in.at(e), data, acc_at(e), cnt);
        right.post_send(acc_at(e), cnt * asz);
      }
    };
    left.post_recv(std::move(spec));
  }
  drive({&left, &right}, deadline, comm.spin_us());
}

}  // namespace pyring
