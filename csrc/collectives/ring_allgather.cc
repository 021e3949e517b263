// Ring allgather: rank r places its input at chunk r of `out` and sends it right; in step s it
// receives chunk r-s-1 from the left straight into `out` and forwards each piece as it lands.
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/driver.h"
#include "collectives/header.h"
#include "transport/link.h"

namespace pyring {

void ring_allgather(Communicator& comm, const BufferView& in, const BufferView& out,
                    Deadline deadline) {
  const int n = comm.size();
  const int r = comm.rank();
  const size_t m = in.count;
  const size_t bytes = in.bytes();
  uint8_t* own = out.at(static_cast<size_t>(r) * m);
  if (own != in.data && bytes > 0) std::memcpy(own, in.data, bytes);
  if (n == 1 || bytes == 0) return;
  Link& left = comm.left();
  Link& right = comm.right();
  HeaderExchange header(comm.seq(), CollectiveKind::kAllGather, in.dtype, ReduceOp::kSum,
                        out.count);
  header.post(&left, &right, r);
  right.post_send(own, bytes);
  for (int s = 0; s < n - 1; ++s) {
    RecvSpec spec;
    spec.bytes = bytes;
    spec.copy_to = out.at(ring_index(r - s - 1, n) * m);
    if (s < n - 2) {
      spec.on_piece = [&right](const uint8_t* data, size_t, size_t len) {
        right.post_send(data, len);
      };
    }
    left.post_recv(std::move(spec));
  }
  drive({&left, &right}, deadline, comm.spin_us());
}

}  // namespace pyring
