// A std::terminate handler that says where: the thread's name (pyring names its own, see
// core/thread_name.h) and its native stack, written to stderr before the handler it replaced
// runs (the C++ runtime's, which prints the reason and aborts). Installed once, when the module
// is imported. A terminate in a thread that Python unwinds at interpreter exit (see
// PythonEntry) otherwise leaves only "terminate called without an active exception".
#include <execinfo.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "bindings/bindings.h"

namespace pyring::bindings {

namespace {

std::terminate_handler g_previous = nullptr;

void write_all(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

[[noreturn]] void traced_terminate() {
  char name[17] = {};
  prctl(PR_GET_NAME, name, 0, 0, 0);
  char head[160];
  const int n = std::snprintf(head, sizeof head,
                              "pyring: std::terminate on thread '%s' (tid %ld, pid %d); its "
                              "native stack:\n",
                              name, static_cast<long>(syscall(SYS_gettid)), getpid());
  if (n > 0) write_all(head, std::min<size_t>(static_cast<size_t>(n), sizeof head - 1));
  void* frames[64];
  const int depth = backtrace(frames, 64);
  backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  if (g_previous) g_previous();
  std::abort();
}

}  // namespace

void install_terminate_trace() {
  static const bool once = [] {
    g_previous = std::set_terminate(traced_terminate);
    return true;
  }();
  (void)once;
}

}  // namespace pyring::bindings
