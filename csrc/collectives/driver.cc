#include "collectives/driver.h"

#include <sched.h>

#include <chrono>

#include "core/errors.h"
#include "transport/wait.h"

namespace pyring {

namespace {
constexpr int kMaxSleepMs = 50;  // how often a blocked rank re-checks its peers
}  // namespace

void drive(std::initializer_list<Link*> list, Deadline deadline, int spin_us) {
  const auto spin = std::chrono::microseconds(spin_us);
  Link* links[4];
  size_t n = 0;
  for (Link* l : list) {
    bool seen = false;
    for (size_t i = 0; i < n; ++i) seen |= links[i] == l;
    if (!seen && n < 4) links[n++] = l;
  }
  auto idle_since = Clock::now();
  auto last_check = idle_since;
  unsigned polls = 0;
  for (;;) {
    bool moved = false, idle = true;
    for (size_t i = 0; i < n; ++i) {
      moved |= links[i]->progress();
      idle &= links[i]->idle();
    }
    if (idle) return;
    if (moved) {
      polls = 0;
      continue;
    }
    if (++polls < 64) {
      cpu_relax();
      continue;
    }
    auto now = Clock::now();
    if (polls == 64) idle_since = now;
    if (now - idle_since < spin) {
      if ((polls & 255) == 0) sched_yield();
      cpu_relax();
      continue;
    }
    if (deadline.expired()) {
      std::string what;
      for (size_t i = 0; i < n; ++i) what += str_cat(i ? "; " : "", links[i]->pending());
      PYRING_THROW(TimeoutError, "timed out waiting: ", what);
    }
    wait_for_links(links, n, deadline.remaining_ms(kMaxSleepMs));
    polls = 64;
    idle_since = Clock::now();
    if (idle_since - last_check >= std::chrono::milliseconds(kMaxSleepMs)) {
      for (size_t i = 0; i < n; ++i) links[i]->check_peer();
      last_check = idle_since;
    }
  }
}

}  // namespace pyring
