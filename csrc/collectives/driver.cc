#include "collectives/driver.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "core/communicator.h"
#include "core/errors.h"
#include "transport/wait.h"

namespace pyring {

namespace {
constexpr int kMaxSleepMs = 50;  // how often a blocked rank re-checks its peers

// The warning at half a collective's deadline, once per collective.
void warn_at_half(const Deadline& d, Link* const* links, size_t n) {
  if (d.what == nullptr || d.warned == nullptr || *d.warned || Clock::now() < d.half) return;
  *d.warned = true;
  std::string pending;
  for (size_t i = 0; i < n; ++i) pending += str_cat(i ? "; " : "", links[i]->pending());
  const double left = std::chrono::duration<double>(d.at - Clock::now()).count();
  std::fprintf(stderr,
               "[pyring WARN] %s: half of the deadline has passed (%.1f s left), "
               "still waiting: %s\n",
               (*d.what)().c_str(), left, pending.c_str());
}
}  // namespace

namespace {
void dedup(std::vector<Link*>& links) {
  links.erase(std::remove(links.begin(), links.end(), nullptr), links.end());
  std::sort(links.begin(), links.end());
  links.erase(std::unique(links.begin(), links.end()), links.end());
}
}  // namespace

void drive(std::vector<Link*> links, Deadline deadline, int spin_us,
           std::vector<Link*> background) {
  const auto spin = std::chrono::microseconds(spin_us);
  dedup(links);
  const size_t n = links.size();
  // links[0, n) must go idle; the background links after them only keep moving.
  dedup(background);
  for (Link* l : background) {
    if (!std::binary_search(links.begin(), links.begin() + static_cast<long>(n), l)) {
      links.push_back(l);
    }
  }
  const size_t all = links.size();
  auto idle_since = Clock::now();
  auto last_check = idle_since;
  unsigned polls = 0;
  bool spinning = true;  // this idle period polls before it blocks
  for (;;) {
    // Idleness is read after every link has progressed: a piece landing on one link may post
    // a send on another.
    bool moved = false, idle = true;
    for (size_t i = 0; i < all; ++i) moved |= links[i]->progress();
    for (size_t i = 0; i < n && idle; ++i) idle = links[i]->idle();
    if (idle) return;
    if (moved) {
      polls = 0;
      continue;
    }
    if (polls == 0) {
      spinning = true;
      for (size_t i = 0; i < all && spinning; ++i) spinning = links[i]->spin_worthwhile(spin_us);
    }
    if (spinning && ++polls < 64) {
      cpu_relax();
      continue;
    }
    auto now = Clock::now();
    if (polls == 64) idle_since = now;
    if (spinning && now - idle_since < spin) {
      if ((polls & 255) == 0) sched_yield();
      cpu_relax();
      continue;
    }
    if (deadline.expired()) {
      std::string what;
      for (size_t i = 0; i < all; ++i) what += str_cat(i ? "; " : "", links[i]->pending());
      PYRING_THROW(TimeoutError, "Timed out waiting: ", what);
    }
    warn_at_half(deadline, links.data(), n);
    wait_for_links(links.data(), all, deadline.remaining_ms(kMaxSleepMs));
    polls = 64;
    idle_since = Clock::now();
    if (idle_since - last_check >= std::chrono::milliseconds(kMaxSleepMs)) {
      last_check = idle_since;
      try {
        // Only the links still waiting: a peer that finished its part and ended (or closed)
        // holds up nothing on a link with nothing queued.
        for (size_t i = 0; i < all; ++i) {
          if (!links[i]->idle()) links[i]->check_peer();
        }
      } catch (const std::exception&) {
        // A peer that ended right after its last send left those bytes in this rank's inbox:
        // the collective fails only once nothing more moves.
        bool moved = false;
        for (size_t i = 0; i < all; ++i) moved |= links[i]->progress();
        if (!moved) throw;
        polls = 0;
      }
    }
  }
}

void check_ring_header(Communicator& comm, HeaderExchange& header, Deadline deadline) {
  if (comm.size() == 1) return;
  header.post(&comm.left(), &comm.right(), comm.rank());
  drive({&comm.left(), &comm.right()}, deadline, comm.spin_us());
}

}  // namespace pyring
