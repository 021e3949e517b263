#include "transport/factory.h"

#include "core/errors.h"

namespace pyring {

Links make_links(const LinkSetup& setup, const std::vector<Endpoint>& endpoints,
                 const std::vector<int>& plan, const std::vector<int>& needed, Deadline deadline) {
  const size_t n = static_cast<size_t>(setup.size);
  PYRING_CHECK_ARG(endpoints.size() == n && plan.size() == n * n, "endpoints for ",
                   endpoints.size(), " ranks and a plan of ", plan.size(), " pairs for world ",
                   setup.size);
  Links out;
  out.by_rank.resize(n);
  std::vector<std::vector<const Endpoint*>> by_transport(transports().size());
  for (int p : needed) {
    PYRING_CHECK_ARG(p >= 0 && p < setup.size && p != setup.rank, "peer rank ", p,
                     " out of range for rank ", setup.rank, " of ", setup.size);
    const int t = plan[static_cast<size_t>(setup.rank) * n + static_cast<size_t>(p)];
    by_transport[static_cast<size_t>(t)].push_back(&endpoints[static_cast<size_t>(p)]);
  }
  for (size_t t = 0; t < transports().size(); ++t) {
    const Transport& tr = *transports()[t];
    tr.connect(setup, by_transport[t], endpoints, out, deadline);
    // A waiting thread blocks on a link as its transport declares (transport/wait.h).
    for (const Endpoint* p : by_transport[t]) {
      Link* link = out.by_rank[static_cast<size_t>(p->rank)].get();
      PYRING_CHECK(link != nullptr, CommError, tr.name(), " made no link to rank ", p->rank);
      const WaitKind kind = tr.wait_kind();
      const bool ok = kind == WaitKind::kPollFd      ? link->poll_fd() >= 0
                      : kind == WaitKind::kFutexWord ? link->sleep_word() != nullptr
                                                     : link->poll_fd() < 0 && !link->sleep_word();
      PYRING_CHECK(ok, CommError, "the ", tr.name(), " link to rank ", p->rank,
                   " does not block the way its transport declares");
    }
  }
  for (const auto& [name, state] : setup.prepared) {
    if (state) out.segments.push_back(state);  // what the links map or read
  }
  return out;
}

}  // namespace pyring
