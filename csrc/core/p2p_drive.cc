// The driving half of P2pEngine: threads waiting on works drive the links themselves, and the
// p2p thread drives them when nobody waits, sleeping on the links when nothing moves.
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/p2p.h"

namespace pyring {

namespace {
constexpr int kMaxSleepMs = 50;        // how often the sleeping thread checks peers
constexpr unsigned kThreadPolls = 32;  // passes without progress before the thread sleeps
// Passes that take in what a dead peer left in this rank's inbox before its link is broken;
// each moves at least one slot, and an inbox holds a few.
constexpr int kDrainPasses = 1024;
// While waiting threads drive, the p2p thread parks: a helper that leaves with nothing else
// in flight does not wake it (a wake-up costs more than the message); a post that nobody
// helps does. It stays parked while helpers keep coming (a loop of synchronous sends and
// receives), rather than sleeping where every incoming message would wake it.
constexpr auto kParkTime = std::chrono::milliseconds(kMaxSleepMs);
}  // namespace

void P2pEngine::help(const Work& w) {
  drive_until([&w] { return w.is_completed(); }, false);
}

void P2pEngine::wait_all(const std::vector<std::shared_ptr<Work>>& works) {
  size_t next = 0;
  drive_until(
      [&] {
        while (next < works.size() && works[next]->is_completed()) ++next;
        return next == works.size();
      },
      true);
}

void P2pEngine::drive_until(const std::function<bool()>& done, bool to_the_end) {
  helpers_.fetch_add(1);
  helped_since_park_.store(true, std::memory_order_relaxed);
  const auto spin = std::chrono::microseconds(spin_us_);
  auto idle_since = Clock::now();
  auto last_check = idle_since;
  bool fresh = true, spinning = true;  // the idle period just began; it polls before blocking
  // The clock is read every 16 passes: a read costs as much as a pass.
  for (unsigned pass = 1; !done() && !stop_.load(); ++pass) {
    bool moved;
    {
      std::lock_guard<std::mutex> lock(mu_);
      moved = progress_locked();
      if (!moved && fresh && to_the_end) spinning = spin_worthwhile_locked();
    }
    if (moved) {
      idle_since = Clock::now();
      fresh = true;
      continue;
    }
    fresh = false;
    cpu_relax();
    // A peer sharing this core gets it now and then (as the collectives' driver does).
    if (pass % 256 == 0) sched_yield();
    if (!spinning || (pass % 16 == 0 && Clock::now() - idle_since >= spin)) {
      if (!to_the_end) break;
      block();  // the p2p thread stays parked meanwhile, so this thread checks the peers
      idle_since = Clock::now();
      if (idle_since - last_check >= std::chrono::milliseconds(kMaxSleepMs)) {
        last_check = idle_since;
        std::lock_guard<std::mutex> lock(mu_);
        check_peers_locked();
      }
    }
  }
  if (helpers_.fetch_sub(1) == 1) {
    bool pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending = in_flight_ > 0;
    }
    if (pending) wake();
  }
}

void P2pEngine::loop() {
  unsigned polls = 0;
  auto last_check = Clock::now();
  while (!stop_.load()) {
    if (helpers_.load() > 0) {
      park();  // a waiting thread drives the links; this one would only contend for them
      continue;
    }
    bool moved;
    {
      std::lock_guard<std::mutex> lock(mu_);
      moved = progress_locked();
    }
    if (moved) {
      polls = 0;
      continue;
    }
    if (++polls < kThreadPolls) {
      cpu_relax();
      continue;
    }
    if (helped_since_park_.exchange(false)) {
      park();
      continue;
    }
    block();
    polls = kThreadPolls - 1;  // one more pass after waking, then sleep again
    auto now = Clock::now();
    if (now - last_check >= std::chrono::milliseconds(kMaxSleepMs)) {
      last_check = now;
      std::lock_guard<std::mutex> lock(mu_);
      check_peers_locked();
    }
  }
}

void P2pEngine::check_peers_locked() {
  for (size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    if (!p.link || !p.broken.empty()) continue;
    try {
      p.link->check_peer();
    } catch (const std::exception& e) {
      // A peer that ended right after its last send left those bytes in this rank's inbox:
      // take them in first, so that what arrived whole stays claimable.
      for (int k = 0; k < kDrainPasses && p.broken.empty() && progress_locked(); ++k) {
      }
      break_peer_locked(static_cast<int>(i), e.what());
    }
  }
  if (in_flight_ > 0) expire_locked();
}

void P2pEngine::park() {
  std::unique_lock<std::mutex> lock(idle_mu_);
  parked_ = true;
  helped_since_park_.store(false);
  idle_cv_.wait_for(lock, kParkTime,
                    [&] { return (helpers_.load() == 0 && unhelped_) || stop_.load(); });
  // Called for (a post, or a helper that left work in flight): the helpers that came during
  // this park have all left, so they must not park the thread again; it drives, then sleeps on
  // the links, where an arriving message wakes it. (Parked again, nothing would call it before
  // kParkTime, and the work in flight would wait that long.)
  if (unhelped_) helped_since_park_.store(false);
  parked_ = unhelped_ = false;
}

bool P2pEngine::spin_worthwhile_locked() {
  for (const auto& p : peers_) {
    if (p.link && p.broken.empty() && !p.link->spin_worthwhile(spin_us_)) return false;
  }
  return true;
}

// Sleeps until a link may move, a caller posts, or kMaxSleepMs pass. Called by the p2p thread,
// or by a thread driving to the end while the p2p thread is parked. Sockets are polled with
// the eventfd callers write; shm links sleep on this rank's futex word after a last check.
void P2pEngine::block() {
  sleeping_.store(true);
  std::vector<pollfd> fds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& p : peers_) {
      if (p.link && p.broken.empty() && p.link->poll_fd() >= 0) {
        short events = POLLIN | (p.link->wants_write() ? POLLOUT : 0);
        fds.push_back(pollfd{p.link->poll_fd(), events, 0});
      }
    }
  }
  if (!fds.empty()) {
    fds.push_back(pollfd{event_fd_, POLLIN, 0});
    bool moved;
    {
      std::lock_guard<std::mutex> lock(mu_);
      moved = progress_locked();
    }
    if (!moved) poll(fds.data(), fds.size(), sleep_word_ ? 1 : kMaxSleepMs);
    uint64_t drain;
    while (read(event_fd_, &drain, sizeof(drain)) > 0) {
    }
  } else if (sleep_word_) {
    sleep_word_->store(1);
    bool moved;
    {
      std::lock_guard<std::mutex> lock(mu_);
      moved = progress_locked();
    }
    if (!moved && !stop_.load()) {
      timespec ts{0, static_cast<long>(kMaxSleepMs) * 1000000L};
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(sleep_word_), FUTEX_WAIT, 1, &ts, nullptr, 0);
    }
    sleep_word_->store(0);
  } else {
    std::unique_lock<std::mutex> lock(idle_mu_);
    idle_cv_.wait_for(lock, std::chrono::milliseconds(kMaxSleepMs), [&] { return stop_.load(); });
  }
  sleeping_.store(false);
}

void P2pEngine::wake() {
  {
    std::lock_guard<std::mutex> lock(idle_mu_);
    unhelped_ = true;
    if (parked_) idle_cv_.notify_all();
  }
  if (!sleeping_.load()) return;
  if (event_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t n = write(event_fd_, &one, sizeof(one));
    (void)n;
  }
  if (sleep_word_) {
    sleep_word_->store(0);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(sleep_word_), FUTEX_WAKE, INT32_MAX, nullptr,
            nullptr, 0);
  }
  std::lock_guard<std::mutex> lock(idle_mu_);
  idle_cv_.notify_all();
}

}  // namespace pyring
