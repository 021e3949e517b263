#include "core/topology.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "core/errors.h"

namespace pyring {

Topology Topology::flat(int size) {
  Topology t;
  t.level_names = {"host"};
  std::vector<int> all(static_cast<size_t>(size));
  std::iota(all.begin(), all.end(), 0);
  t.groups = {{all}};
  return t;
}

std::vector<int> Topology::ring_order() const {
  std::vector<int> order;
  for (const auto& g : groups.front()) order.insert(order.end(), g.begin(), g.end());
  return order;
}

std::string Topology::str() const {
  auto ranks = [](const std::vector<int>& g) {
    std::string s;
    for (size_t i = 0; i < g.size(); ++i) s += str_cat(i ? "," : "", g[i]);
    return s;
  };
  if (groups.size() > 2) {
    std::string s;
    for (size_t l = 0; l < groups.size(); ++l) {
      s += str_cat(l ? " " : "", level_names[l], "s:");
      for (const auto& g : groups[l]) s += str_cat(" [", ranks(g), "]");
    }
    return s;
  }
  // One level: groups joined by ';'. Two: level-0 groups by ';' inside, level-1 groups by '|'.
  std::string s;
  size_t g0 = 0;
  const auto& top = groups.back();
  for (size_t t = 0; t < top.size(); ++t) {
    if (groups.size() == 1) {
      s += str_cat(t ? ";" : "", ranks(top[t]));
      continue;
    }
    s += t ? "|" : "";
    size_t seen = 0;
    for (bool first = true; seen < top[t].size(); first = false) {
      const auto& g = groups[0][g0++];
      s += str_cat(first ? "" : ";", ranks(g));
      seen += g.size();
    }
  }
  return s;
}

void Topology::validate(int size) const {
  PYRING_CHECK_ARG(!groups.empty(), "topology has no levels");
  PYRING_CHECK_ARG(level_names.size() == groups.size(), "topology has ", groups.size(),
                   " levels but ", level_names.size(), " level names");
  std::vector<int> order;
  for (size_t l = 0; l < groups.size(); ++l) {
    std::vector<int> seen(static_cast<size_t>(size), 0);
    std::vector<int> concat;
    for (const auto& g : groups[l]) {
      PYRING_CHECK_ARG(!g.empty(), "topology level '", level_names[l], "' has an empty group");
      for (int r : g) {
        PYRING_CHECK_ARG(r >= 0 && r < size, "topology names rank ", r,
                         ", out of range for world size ", size);
        PYRING_CHECK_ARG(!seen[static_cast<size_t>(r)]++, "topology level '", level_names[l],
                         "' names rank ", r, " twice");
        concat.push_back(r);
      }
    }
    for (int r = 0; r < size; ++r) {
      PYRING_CHECK_ARG(seen[static_cast<size_t>(r)], "topology level '", level_names[l],
                       "' misses rank ", r, " (world size ", size, ")");
    }
    if (l == 0) order = concat;
    PYRING_CHECK_ARG(concat == order, "topology level '", level_names[l],
                     "' lists the ranks in another order than the level below");
  }
  // Each level-l group must be a run of whole level-(l-1) groups.
  for (size_t l = 1; l < groups.size(); ++l) {
    size_t child = 0;
    for (const auto& g : groups[l]) {
      size_t covered = 0;
      while (covered < g.size()) {
        PYRING_CHECK_ARG(
            child < groups[l - 1].size() && covered + groups[l - 1][child].size() <= g.size(),
            "a '", level_names[l - 1], "' group straddles two '", level_names[l], "' groups");
        covered += groups[l - 1][child++].size();
      }
    }
  }
}

namespace {

struct Addresses {
  std::vector<std::vector<int>> of;  // of[rank][component]
  std::vector<int> shape;
  std::map<std::vector<int>, int> rank_at;
};

Addresses addresses(const Topology& topo) {
  const size_t D = topo.groups.size();
  const auto order = topo.ring_order();
  const size_t n = order.size();
  Addresses a;
  a.of.assign(n, std::vector<int>(D + 1, 0));
  a.shape.assign(D + 1, 0);
  // group_of[l][rank]
  std::vector<std::vector<int>> group_of(D, std::vector<int>(n, 0));
  for (size_t l = 0; l < D; ++l) {
    for (size_t g = 0; g < topo.groups[l].size(); ++g) {
      for (int r : topo.groups[l][g]) group_of[l][static_cast<size_t>(r)] = static_cast<int>(g);
    }
  }
  int s0 = static_cast<int>(n);
  for (const auto& g : topo.groups[0]) {
    s0 = std::min(s0, static_cast<int>(g.size()));
    for (size_t i = 0; i < g.size(); ++i) a.of[static_cast<size_t>(g[i])][0] = static_cast<int>(i);
  }
  a.shape[0] = s0;
  for (size_t l = 1; l < D; ++l) {
    // child index of each level-(l-1) group inside its level-l parent
    std::vector<int> children(topo.groups[l].size(), 0);
    std::vector<int> child_index(topo.groups[l - 1].size(), 0);
    for (size_t g = 0; g < topo.groups[l - 1].size(); ++g) {
      int parent = group_of[l][static_cast<size_t>(topo.groups[l - 1][g].front())];
      child_index[g] = children[static_cast<size_t>(parent)]++;
    }
    a.shape[l] = *std::min_element(children.begin(), children.end());
    for (size_t r = 0; r < n; ++r)
      a.of[r][l] = child_index[static_cast<size_t>(group_of[l - 1][r])];
  }
  a.shape[D] = static_cast<int>(topo.groups[D - 1].size());
  for (size_t r = 0; r < n; ++r) {
    a.of[r][D] = group_of[D - 1][r];
    a.rank_at[a.of[r]] = static_cast<int>(r);
  }
  return a;
}

}  // namespace

TreePlan tree_plan(const Topology& topo, int rank) {
  const Addresses a = addresses(topo);
  const auto& mine = a.of[static_cast<size_t>(rank)];
  const size_t comps = mine.size();
  TreePlan plan;
  plan.shape = a.shape;
  auto target_of = [&](const std::vector<int>& addr) {
    std::vector<int> t = addr;
    for (size_t c = 0; c < comps; ++c) t[c] %= a.shape[c];
    return a.rank_at.at(t);
  };
  int target = target_of(mine);
  if (target != rank) {
    plan.active = false;
    plan.fold_target = target;
    return plan;
  }
  for (size_t r = 0; r < a.of.size(); ++r) {
    if (static_cast<int>(r) != rank && target_of(a.of[r]) == rank) {
      plan.folded.push_back(static_cast<int>(r));
    }
  }
  for (size_t c = 0; c < comps; ++c) {
    if (a.shape[c] < 2) continue;
    Team team;
    team.component = static_cast<int>(c);
    team.pos = mine[c];
    std::vector<int> addr = mine;
    for (int q = 0; q < a.shape[c]; ++q) {
      addr[c] = q;
      team.ranks.push_back(a.rank_at.at(addr));
    }
    plan.teams.push_back(std::move(team));
  }
  return plan;
}

std::vector<int> address_order(const Topology& topo) {
  const Addresses a = addresses(topo);
  size_t active = 1;
  for (int s : a.shape) active *= static_cast<size_t>(s);
  if (active != a.of.size()) return {};
  std::vector<int> order(a.of.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int x, int y) {
    return a.of[static_cast<size_t>(x)] < a.of[static_cast<size_t>(y)];
  });
  return order;
}

std::vector<int> needed_peers(const Topology& topo, int rank) {
  std::vector<int> peers;
  const auto order = topo.ring_order();
  const int n = static_cast<int>(order.size());
  const int pos = static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
  peers.push_back(order[static_cast<size_t>((pos + 1) % n)]);
  peers.push_back(order[static_cast<size_t>((pos + n - 1) % n)]);
  const TreePlan plan = tree_plan(topo, rank);
  if (!plan.active) peers.push_back(plan.fold_target);
  peers.insert(peers.end(), plan.folded.begin(), plan.folded.end());
  for (const auto& t : plan.teams) {
    const int k = static_cast<int>(t.ranks.size());
    peers.push_back(t.ranks[static_cast<size_t>((t.pos + 1) % k)]);
    peers.push_back(t.ranks[static_cast<size_t>((t.pos + k - 1) % k)]);
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  peers.erase(std::remove(peers.begin(), peers.end(), rank), peers.end());
  return peers;
}

}  // namespace pyring
