// CallbackRunner lifetimes under AddressSanitizer (tests/test_native_lifetimes.py): a task that
// drops the last reference to its runner, or stops the runner it runs on, must leave the
// runner's thread nothing freed to touch. Exits 0 when every case ends; ASan aborts otherwise.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "core/callbacks.h"

using pyring::CallbackRunner;

namespace {

// Waits up to 10 s for `flag`; false on timeout.
bool wait_for(const std::atomic<bool>& flag) {
  for (int i = 0; i < 10000 && !flag.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return flag.load();
}

// The task holds the only reference: the runner is destroyed on its own thread.
bool released_by_its_task() {
  auto runner = std::make_shared<CallbackRunner>();
  auto held = std::make_shared<std::shared_ptr<CallbackRunner>>(runner);
  std::atomic<bool> ran{false};
  CallbackRunner* r = runner.get();
  runner.reset();
  r->post([held, &ran] {
    held->reset();
    ran.store(true);
  });
  held.reset();
  return wait_for(ran);
}

// A task stops its own runner (a callback that closes its communicator); a later post runs
// inline, and the runner is then released from this thread.
bool stopped_by_its_task() {
  auto runner = std::make_shared<CallbackRunner>();
  std::atomic<bool> stopped{false};
  std::atomic<bool> inline_ran{false};
  runner->post([&runner, &stopped] {
    runner->stop();
    stopped.store(true);
  });
  if (!wait_for(stopped)) return false;
  runner->post([&inline_ran] { inline_ran.store(true); });
  runner.reset();
  return inline_ran.load();
}

// Both, with another task queued behind the one that releases the runner: it still runs.
bool released_with_work_queued() {
  auto runner = std::make_shared<CallbackRunner>();
  auto held = std::make_shared<std::shared_ptr<CallbackRunner>>(runner);
  std::atomic<bool> first{false};
  std::atomic<bool> second{false};
  std::atomic<bool> go{false};
  CallbackRunner* r = runner.get();
  runner.reset();
  r->post([held, &first, &go] {
    while (!go.load()) std::this_thread::yield();
    held->reset();
    first.store(true);
  });
  r->post([&second] { second.store(true); });
  held.reset();
  go.store(true);
  return wait_for(first) && wait_for(second);
}

}  // namespace

int main() {
  struct Case {
    const char* name;
    bool (*fn)();
  } cases[] = {{"released_by_its_task", released_by_its_task},
               {"stopped_by_its_task", stopped_by_its_task},
               {"released_with_work_queued", released_with_work_queued}};
  for (int round = 0; round < 50; ++round) {
    for (const Case& c : cases) {
      if (!c.fn()) {
        std::fprintf(stderr, "%s: a task did not run (round %d)\n", c.name, round);
        return 1;
      }
    }
  }
  // Detached runner threads finish leaving their loops before the process exits.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::puts("ok");
  return 0;
}
