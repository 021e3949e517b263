// The topology tree over the ranks, and each rank's part in the tree schedule.
//
// Words: a level's groups partition the ranks; a group of level l+1 is a union of groups of
// level l; the root (every rank) sits above the last level. A rank's address is its index in
// its level-0 group (component 0) and, for l >= 1, the index of its level-(l-1) group among
// the children of its level-l group (component l); component D (D = number of levels) is the
// index of its top group. The shape s_l is the smallest child count of any node at component l,
// so every node has a child at every index below s_l.
#pragma once

#include <string>
#include <vector>

namespace pyring {

struct Topology {
  std::vector<std::string> level_names;  // lowest first
  // groups[l][g]: the ranks of group g of level l. Groups and their ranks are listed in tree
  // order, so the concatenation of groups[l] is the same ring order at every level.
  std::vector<std::vector<std::vector<int>>> groups;

  static Topology flat(int size);
  // Throws InvalidArgument naming the first broken invariant.
  void validate(int size) const;
  std::vector<int> ring_order() const;
  int levels() const { return static_cast<int>(groups.size()); }
  // "0,1;2,3|4,5;6,7"-style text for messages (nested brackets beyond two levels).
  std::string str() const;
};

// A team: the ranks whose addresses equal this rank's except at one component, listed by that
// component. Its ring phases cross the links of that component's level.
struct Team {
  int component = 0;  // 0: inside a level-0 group; D: across the top groups
  std::vector<int> ranks;
  int pos = 0;  // this rank's index in `ranks`
};

// This rank's part in the tree allreduce. Ranks whose address has a component at or past the
// shape fold: they hand their input to `fold_target` (the rank at their address reduced modulo
// the shape, inside the same top group when one exists) and get the result back from it.
struct TreePlan {
  std::vector<int> shape;  // s_0 .. s_D
  bool active = true;
  int fold_target = -1;     // inactive ranks: the active rank that stands in for this one
  std::vector<int> folded;  // active ranks: the ranks folded into this one, ascending
  std::vector<Team> teams;  // active ranks: teams of more than one rank, lowest component first
};

TreePlan tree_plan(const Topology& topo, int rank);

// The ranks sorted by address with component 0 most significant, so that every team's ranks
// own adjacent runs of it at every level; empty when the tree is uneven (some rank folds).
std::vector<int> address_order(const Topology& topo);

// Every peer an algorithm of this rank may use: ring neighbours, team ring neighbours and fold
// partners. Ascending, without `rank`.
std::vector<int> needed_peers(const Topology& topo, int rank);

}  // namespace pyring
