#include "collectives/selector.h"

#include <algorithm>
#include <cstdio>

#include "collectives/collectives.h"
#include "collectives/zero_copy.h"
#include "core/errors.h"

namespace pyring {

namespace {

// The class of the links a team of `component` crosses: the slowest of its nodes' classes.
int component_class(const Communicator& comm, int component) {
  const Topology& t = comm.topology();
  if (component >= t.levels()) return slowest_class(comm, comm.ring_order());
  int c = 0;
  for (const auto& g : t.groups[static_cast<size_t>(component)]) {
    c = std::max(c, slowest_class(comm, g));
  }
  return c;
}

double steps(const LinkModel& m, double count, double bytes_each) {
  return count * (m.alpha_s + bytes_each / m.bytes_per_s);
}

}  // namespace

int slowest_class(const Communicator& comm, const std::vector<int>& ranks) {
  int c = 0;
  for (int r : ranks) {
    if (r != ranks.front()) c = std::max(c, comm.link_class(ranks.front(), r));
  }
  return c;
}

std::string human_bytes(size_t bytes) {
  char buf[32];
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) {
    std::snprintf(buf, sizeof(buf), "%zu MiB", bytes >> 20);
  } else if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) {
    std::snprintf(buf, sizeof(buf), "%zu KiB", bytes >> 10);
  } else {
    std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  }
  return buf;
}

Estimate estimate_allreduce(const Communicator& comm, size_t bytes) {
  const Options& o = comm.options();
  const double n = static_cast<double>(bytes);
  const double N = comm.size();
  const double gamma = o.reduce_bytes_per_s;
  const int ring_class = component_class(comm, comm.topology().levels());
  const LinkModel& r = o.links[static_cast<size_t>(ring_class)];
  Estimate e;
  e.ring_s = steps(r, 2 * (N - 1), n / N) + (N - 1) / N * n / gamma;
  e.direct_s = steps(r, N - 1, n) + (N - 1) * n / gamma;
  // Tree: folds in and out, then reduce-scatter up the teams, allreduce at the top, allgather
  // down. The members of a group each run their own team above it, so `flows` of them share
  // that group's link. K slices pipeline the levels: the sum of one slice's level times fills
  // the pipeline, then each further slice costs the slowest level's time.
  const TreePlan& plan = comm.tree_plan();
  double active = 1;
  size_t teams = 0;
  for (int s : plan.shape) {
    active *= s;
    teams += s > 1;
  }
  const double folds = N / active - 1;  // ranks each active rank stands in for, on average
  double t = folds > 0 ? 2 * steps(r, std::max(1.0, folds), n) + folds * n / gamma : 0;
  const double slices = static_cast<double>(tree_slices(bytes, teams));
  double region = n / slices, flows = 1, fill = 0, slowest = 0;
  // From the shape, which every rank shares (a folded rank has no teams of its own).
  for (size_t c = 0; c < plan.shape.size(); ++c) {
    const double s = plan.shape[c];
    if (s < 2) continue;
    const LinkModel& m = o.links[static_cast<size_t>(component_class(comm, static_cast<int>(c)))];
    const double level = 2 * (s - 1) * (m.alpha_s + region / s * flows / m.bytes_per_s) +
                         (s - 1) / s * region / gamma;
    fill += level;
    slowest = std::max(slowest, level);
    region /= s;
    flows *= s;
  }
  t += fill + (slices - 1) * slowest;
  e.tree_s = t;
  return e;
}

namespace {

// The auto choice for an allreduce of `bytes`; its reason goes to `why` when that is set.
Algo choose_allreduce(const Communicator& comm, size_t bytes, std::string* why) {
  const Estimate e = estimate_allreduce(comm, bytes);
  const TreePlan& plan = comm.tree_plan();
  // The tree differs from the ring when it has two teams or more, or folds (every rank
  // computes this from the shape it shares); it must beat the ring clearly.
  int teams = 0;
  double active = 1;
  for (int s : plan.shape) {
    teams += s > 1;
    active *= s;
  }
  const bool tree_differs = teams > 1 || active < comm.size();
  const int n = comm.size();
  if (e.direct_s <= e.ring_s && (e.direct_s <= e.tree_s || !tree_differs)) {
    if (why) {
      *why = str_cat("estimated ", e.direct_s * 1e6, " us against the ring's ", e.ring_s * 1e6,
                     " us: ", n - 1, " dependent hops instead of ", 2 * (n - 1));
    }
    return Algo::kDirect;
  }
  if (tree_differs && e.tree_s < 0.97 * e.ring_s) {
    if (why) {
      const int groups = plan.shape.back();
      const int top = comm.link_class(comm.ring_order().front(), comm.ring_order().back());
      *why = str_cat(
          groups, " groups over ", comm.link_class_name(top), "; estimated ", e.tree_s * 1e6,
          " us against the ring's ", e.ring_s * 1e6, " us, which would send ",
          2.0 * (n - 1) / n / (2.0 * (groups - 1) / std::max(1, groups)), "x the bytes over them");
    }
    return Algo::kTree;
  }
  if (why) {
    *why = tree_differs ? str_cat("estimated ", e.ring_s * 1e6, " us against the tree's ",
                                  e.tree_s * 1e6, " us")
                        : std::string("one group: the tree would be the ring itself");
  }
  return Algo::kRing;
}

}  // namespace

Algo select_allreduce(Communicator& comm, size_t bytes, Algo requested) {
  Algo algo = requested;
  if (algo == Algo::kAuto) {
    algo = comm.cached_choice(bytes, [&] { return choose_allreduce(comm, bytes, nullptr); });
  }
  comm.count_call(algo);
  if (comm.options().log_level >= 1) {
    comm.log_once(
        1, str_cat("all_reduce/", static_cast<int>(requested), "/", static_cast<int>(algo)), [&] {
          std::string why = "requested";
          if (requested == Algo::kAuto) choose_allreduce(comm, bytes, &why);
          return str_cat("all_reduce ", human_bytes(bytes), ": ", algo_name(algo), " (", why, ")");
        });
  }
  return algo;
}

Algo select_gather_scatter(Communicator& comm, CollectiveKind kind, size_t bytes) {
  const char* name =
      kind == CollectiveKind::kAllGather ? "all_gather_into_tensor" : "reduce_scatter_tensor";
  const TreePlan& plan = comm.tree_plan();
  const bool even = !comm.address_order().empty() && plan.teams.size() > 1;
  const Options& o = comm.options();
  const double n = static_cast<double>(bytes), N = comm.size();
  const LinkModel& r =
      o.links[static_cast<size_t>(component_class(comm, comm.topology().levels()))];
  const double ring = steps(r, N - 1, n / N);
  double tree = n / o.reduce_bytes_per_s;  // the permutation
  double region = n;
  for (const Team& t : plan.teams) {
    const double s = static_cast<double>(t.ranks.size());
    tree +=
        steps(o.links[static_cast<size_t>(component_class(comm, t.component))], s - 1, region / s);
    region /= s;
  }
  Algo algo = Algo::kRing;
  std::string why;
  if (!even) {
    why = plan.teams.size() > 1 ? "the topology is uneven; the tree needs every group alike"
                                : "one group: the tree would be the ring itself";
  } else if (o.algo == Algo::kTree) {
    algo = Algo::kTree;
    why = "requested";
  } else if (o.algo != Algo::kAuto) {
    why = "requested";
  } else if (tree < 0.97 * ring) {
    algo = Algo::kTree;
    why = str_cat(plan.shape.back(), " groups; estimated ", tree * 1e6, " us against the ring's ",
                  ring * 1e6, " us");
  } else {
    why = str_cat("estimated ", ring * 1e6, " us against the tree's ", tree * 1e6, " us");
  }
  comm.count_call(algo);
  if (o.log_level >= 1) {
    comm.log_once(1, str_cat(name, "/", static_cast<int>(algo)), [&] {
      return str_cat(name, " ", human_bytes(bytes), ": ", algo_name(algo), " (", why, ")");
    });
  }
  return algo;
}

void check_on_host(const BufferView& in, const BufferView& out, const char* what) {
  PYRING_CHECK_ARG(in.device.is_cpu() && out.device.is_cpu(), what, " runs on host buffers (",
                   in.device.str(), ", ", out.device.str(),
                   " given): device buffers go through the device queue's staging");
}

void check_links_carry(const Communicator& comm, const BufferView& in, const BufferView& out,
                       const char* what) {
  if (!in.device.is_cpu() && in.device == out.device &&
      (comm.size() == 1 || comm.resident_on(in.device))) {
    return;  // links carry them, or one rank has none to cross
  }
  check_on_host(in, out, what);
}

void reduce_scatter(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
                    Deadline deadline) {
  check_on_host(in, out, "reduce_scatter");
  if (comm.size() == 1 || out.count == 0) return ring_reduce_scatter(comm, in, out, op, deadline);
  if (select_gather_scatter(comm, CollectiveKind::kReduceScatter, in.bytes()) == Algo::kTree) {
    return tree_reduce_scatter(comm, in, out, op, deadline);
  }
  ring_reduce_scatter(comm, in, out, op, deadline);
}

void allgather(Communicator& comm, const BufferView& in, const BufferView& out, Deadline deadline) {
  check_on_host(in, out, "allgather");
  if (comm.size() == 1 || in.count == 0) return ring_allgather(comm, in, out, deadline);
  if (select_gather_scatter(comm, CollectiveKind::kAllGather, out.bytes()) == Algo::kTree) {
    return tree_allgather(comm, in, out, deadline);
  }
  ring_allgather(comm, in, out, deadline);
}

std::vector<std::vector<int>> compressed_groups(const Communicator& comm, Algo requested) {
  const Topology& t = comm.topology();
  std::vector<std::vector<int>> groups;
  if (t.levels() > 0) groups = t.groups.back();
  size_t largest = 0;
  for (const auto& g : groups) largest = std::max(largest, g.size());
  const bool several = groups.size() > 1 && largest > 1;
  const bool tree = several && (requested == Algo::kAuto || requested == Algo::kTree);
  return tree ? groups : std::vector<std::vector<int>>{};
}

std::vector<std::vector<int>> select_compressed(Communicator& comm, const char* wire,
                                                size_t elements, Algo requested) {
  std::vector<std::vector<int>> groups = compressed_groups(comm, requested);
  const bool tree = !groups.empty();
  const size_t top = comm.topology().levels() > 0 ? comm.topology().groups.back().size() : 1;
  comm.count_call(tree ? Algo::kTree : Algo::kDirect);
  comm.log_once(1, str_cat("compressed/", wire, "/", tree), [&] {
    const std::string why =
        tree ? str_cat(groups.size(),
                       " top-level groups: each adds its ranks in full precision over its own "
                       "links, and only its leader's compressed chunks cross between groups")
        : top > 1 && comm.size() > static_cast<int>(top)
            ? str_cat("algo ", algo_name(requested), " keeps every rank in the schedule")
            : std::string(
                  "one level of groups: every rank sends its compressed chunks "
                  "straight to their owners");
    return str_cat("all_reduce on wire ", wire, ", ", human_bytes(elements * 4),
                   " of float32: ", tree ? "hierarchical" : "flat", " (", why, ")");
  });
  return groups;
}

void note_ring_collective(Communicator& comm, CollectiveKind kind, size_t bytes) {
  comm.count_call(Algo::kRing);
  if (comm.options().log_level < 1) return;
  const char* name = kind == CollectiveKind::kBroadcast ? "broadcast" : "barrier";
  const char* why =
      "the ring follows the topology, so each slower link carries the buffer once, the "
      "fewest bytes any schedule can move across it";
  comm.log_once(1, str_cat("ring/", name),
                [&] { return str_cat(name, " ", human_bytes(bytes), ": ring (", why, ")"); });
}

void barrier(Communicator& comm, Deadline deadline) {
  const bool flags = zero_copy_barrier_possible(comm);
  if (comm.options().log_level >= 1) {
    comm.log_once(1, str_cat("barrier/", flags), [&] {
      return flags ? std::string(
                         "barrier: zero-copy (one round of flags on the symmetric control pages)")
                   : std::string("barrier: ring (a token travels the ring twice)");
    });
  }
  if (flags) return zero_copy_barrier(comm, deadline);
  // Peers on a zero-copy path learn at once that this rank took another one.
  if (comm.symmetric()) comm.symmetric()->enter(comm.seq(), false);  // no-op before mapping
  ring_barrier(comm, deadline);
}

void allreduce(Communicator& comm, const BufferView& in, const BufferView& out, ReduceOp op,
               Algo algo, Deadline deadline) {
  check_on_host(in, out, "allreduce");
  switch (select_allreduce(comm, in.bytes(), algo)) {
    case Algo::kRing:
      return ring_allreduce(comm, in, out, op, deadline);
    case Algo::kDirect:
      return direct_allreduce(comm, in, out, op, deadline);
    case Algo::kTree:
      return tree_allreduce(comm, in, out, op, deadline);
    case Algo::kAuto:
      break;
  }
  PYRING_THROW(InvalidArgument, "the selector returned no algorithm for all_reduce");
}

}  // namespace pyring
