#include "transport/wait.h"

#include <linux/futex.h>
#include <poll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <vector>

namespace pyring {

namespace {
constexpr long kPollSleepNs = 20000;
}  // namespace

bool wait_for_links(Link* const* links, size_t n, int max_ms) {
  std::vector<pollfd> fds;
  std::atomic<uint32_t>* word = nullptr;
  bool polled = false;  // a link whose progress waits on device work (WaitKind::kPoll)
  for (size_t i = 0; i < n; ++i) {
    if (links[i]->poll_fd() >= 0) {
      short events = POLLIN | (links[i]->wants_write() ? POLLOUT : 0);
      fds.push_back(pollfd{links[i]->poll_fd(), events, 0});
    } else if (links[i]->sleep_word()) {
      word = links[i]->sleep_word();
    } else {
      polled = true;
    }
  }
  if (polled) {
    // Nothing wakes this thread when the device finishes: sleep a moment, then poll again.
    if (!fds.empty()) poll(fds.data(), fds.size(), 0);
    timespec ts{0, kPollSleepNs};
    nanosleep(&ts, nullptr);
    return false;
  }
  if (!fds.empty()) {
    poll(fds.data(), fds.size(), word ? (max_ms < 1 ? max_ms : 1) : max_ms);
    return false;
  }
  if (!word) return false;
  word->store(1, std::memory_order_seq_cst);
  bool moved = false;
  for (size_t i = 0; i < n; ++i) moved |= links[i]->progress();
  if (!moved) {
    timespec ts{max_ms / 1000, static_cast<long>(max_ms % 1000) * 1000000L};
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, 1, &ts, nullptr, 0);
  }
  word->store(0, std::memory_order_seq_cst);
  return moved;
}

}  // namespace pyring
