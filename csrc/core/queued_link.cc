#include "core/queued_link.h"

#include <utility>

#include "core/errors.h"

namespace pyring {

void QueuedLink::post_send(const uint8_t* data, size_t bytes) {
  if (bytes > 0) sends_.push_back({data, bytes, 0});
}

void QueuedLink::post_recv(RecvSpec spec) {
  if (spec.bytes == 0) return;
  LinkRecv r;
  r.spec = std::move(spec);
  recvs_.push_back(std::move(r));
}

bool QueuedLink::progress() {
  PYRING_CHECK(!aborted_, CommError, "link to rank ", peer_, " was aborted");
  before_progress();
  bool moved = progress_send();
  moved |= progress_recv();
  if (!moved) after_idle_progress();
  return moved;
}

std::string QueuedLink::pending() const {
  size_t send_left = 0, recv_left = 0;
  for (const auto& s : sends_) send_left += s.bytes - s.done;
  for (const auto& r : recvs_) recv_left += r.spec.bytes - r.done;
  const size_t flying = in_flight();
  return str_cat(kind(), " link to rank ", peer_, where(), ": ", send_left, " bytes left to send, ",
                 flying ? str_cat(flying, " sends in flight, ") : std::string(), recv_left,
                 " bytes left to receive");
}

void QueuedLink::abort() {
  aborted_ = true;
  abort_transport();
}

}  // namespace pyring
