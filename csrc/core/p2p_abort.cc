// P2pEngine's abort announcements: why a rank gave up, sent to its peers on the p2p links.
#include <thread>

#include "core/errors.h"
#include "core/p2p.h"
#include "core/p2p_state.h"

namespace pyring {

void P2pEngine::announce_abort(const std::string& cause) {
  std::vector<int> to;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_cause_.empty() || !closed_.empty()) return;
    abort_cause_ = cause.empty() ? std::string("(no cause given)") : cause;
    for (size_t p = 0; p < peers_.size(); ++p) {
      if (peers_[p].link && peers_[p].broken.empty()) to.push_back(static_cast<int>(p));
    }
  }
  for (int p : to) {
    try {
      send(abort_cause_.data(), abort_cause_.size(),
           P2pAddress{p, 0, P2pContext::kControl, kAbortCause}, Deadline::after(5.0), false);
    } catch (const Error&) {  // a peer already unreachable learns nothing
    }
  }
}

std::string P2pEngine::announced_by(int peer, std::chrono::milliseconds wait) {
  const auto until = Clock::now() + wait;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& h : held_) {
        if (h->peer == peer && h->complete &&
            h->frame.context == static_cast<uint8_t>(P2pContext::kControl) &&
            h->frame.kind == kAbortCause) {
          return std::string(reinterpret_cast<const char*>(h->data.data()), h->frame.bytes);
        }
      }
    }
    if (Clock::now() >= until) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void P2pEngine::fail_collective_recvs_locked(int peer) {
  peers_[static_cast<size_t>(peer)].gave_up = true;
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    const std::shared_ptr<Op>& op = *it;
    if (op->addr.peer == peer && op->addr.context == P2pContext::kCollective) {
      finish_locked(op, std::make_exception_ptr(PeerLost(
                            peer, str_cat("rank ", peer, " gave up on the communicator"), true)));
      it = recvs_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace pyring
