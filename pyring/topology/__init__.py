"""The topology tree: groups of ranks that share a GPU, a PCIe switch, a socket or a host.

A :class:`Topology` lists, for each level from the lowest up, the groups of that level; the root
(every rank) is implicit above the last level. Groups and the ranks inside them are listed in
tree order, so concatenating the groups of any level gives the ring order.

Topologies come from :func:`parse` (``PYRING_TOPOLOGY``, ``init(topology=...)``) or from
:func:`detect`, which every rank runs on the same exchanged inputs (host keys, GPU paths from
:func:`pyring.topology.pci.local_gpu_path`). Pure Python; nothing here reads the machine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Union

LEVEL_NAMES = ("gpu", "switch", "socket", "host")  # the names a level may have, lowest first
# Names parse() gives to d levels of nesting, lowest first.
_DEPTH_NAMES = {1: ("host",), 2: ("switch", "host"), 3: ("switch", "socket", "host"),
                4: LEVEL_NAMES}
_RANK = re.compile(r"-?\d+")

Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Topology:
    """Immutable and hashable. Lists are accepted and stored as tuples; the constructor raises
    ValueError unless there is at least one level, the names come from LEVEL_NAMES lowest first
    (only "switch" repeats), and every level partitions range(world) into non-empty groups
    listed in tree order, each the concatenation of consecutive groups of the level below."""

    world: int
    levels: tuple[str, ...]  # lowest first
    groups: tuple[Groups, ...]  # groups[l]: the groups of level l, each a tuple of ranks

    def __post_init__(self) -> None:
        levels = tuple(self.levels)
        groups = tuple(tuple(tuple(g) for g in level) for level in self.groups)
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "groups", groups)
        _check(self.world, levels, groups)

    def order(self) -> list[int]:
        """The ring order: the ranks of every group of the lowest level, concatenated."""
        return [r for g in self.groups[0] for r in g]

    def nested(self) -> list:
        """The groups as nested lists, top level first: one list nesting per level."""
        items: list = [list(g) for g in self.groups[0]]
        for lower, upper in zip(self.groups, self.groups[1:]):
            items = [items[a:b] for a, b in _child_spans(lower, upper)]
        return items

    def spec(self) -> str:
        """Canonical text that parse() reads back: "0,1;2,3" for one level, "0,1;2,3|4,5;6,7"
        for two levels with several top groups, else nested() as compact JSON. The text holds
        no level names: parse() names levels by their number, so parse(t.spec()) == t when
        t.levels are those names, and has t's groups in any case."""
        if len(self.levels) == 1:
            return _join_groups(self.groups[0])
        if len(self.levels) == 2 and len(self.groups[1]) > 1:
            lower = self.groups[0]
            return "|".join(_join_groups(lower[a:b]) for a, b in _child_spans(*self.groups))
        return json.dumps(self.nested(), separators=(",", ":"))

    def describe(self) -> str:
        """One line per top-level group, e.g. "host 0: switch 0 (ranks 0,1), rank 2"; a group
        with a single member group is shown as that member."""
        labels = _labels(self.levels)
        spans = [[]] + [_child_spans(*pair) for pair in zip(self.groups, self.groups[1:])]

        def render(level: int, index: int) -> str:
            group = self.groups[level][index]
            if len(group) == 1 or level == 0:
                text = _ranks_text(group)
                return text if len(group) == 1 else f"{labels[0]} {index} ({text})"
            a, b = spans[level][index]
            if b - a == 1:
                return render(level - 1, a)
            inner = ", ".join(render(level - 1, j) for j in range(a, b))
            return f"{labels[level]} {index} [{inner}]"

        top = len(self.levels) - 1
        lines = []
        for i, group in enumerate(self.groups[top]):
            body = _ranks_text(group) if top == 0 else ", ".join(
                render(top - 1, j) for j in range(*spans[top][i]))
            lines.append(f"{labels[top]} {i}: {body}")
        return "\n".join(lines)

    def is_flat(self) -> bool:
        """True when every group is a single rank or every rank: the tree adds nothing to a
        plain ring over order()."""
        return all(len(g) in (1, self.world) for level in self.groups for g in level)


def _check(world: Any, levels: tuple, groups: tuple) -> None:
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"Topology: world must be a positive int, got {world!r}")
    if not levels or len(levels) != len(groups):
        raise ValueError(f"Topology: need one name per level and at least one level, got "
                         f"{len(levels)} names for {len(groups)} levels")
    height = [LEVEL_NAMES.index(n) if n in LEVEL_NAMES else -1 for n in levels]
    for i, name in enumerate(levels):
        if height[i] < 0:
            raise ValueError(f"Topology: unknown level name {name!r} (valid: "
                             f"{', '.join(LEVEL_NAMES)})")
        if i and (height[i] < height[i - 1] or (height[i] == height[i - 1] and name != "switch")):
            raise ValueError(f"Topology: levels {levels} are not lowest first "
                             f"(only 'switch' may repeat)")
    for name, level in zip(levels, groups):

        def fail(why: str, name: str = name) -> NoReturn:
            raise ValueError(f"Topology: level {name!r}: {why}")

        if any(not g for g in level):
            fail("empty group")
        members = [r for g in level for r in g]
        if any(isinstance(r, bool) or not isinstance(r, int) for r in members):
            fail("a rank is not an int")
        _check_ranks(members, world, fail)
    for i in range(1, len(levels)):
        _child_spans(groups[i - 1], groups[i], f"Topology: level {levels[i]!r}")


def _child_spans(lower: Groups, upper: Groups, what: str = "") -> list[tuple[int, int]]:
    """For each upper group, the [start, end) run of lower groups it is made of; ValueError
    (prefixed by ``what``) when an upper group is not such a run."""
    spans, start = [], 0
    for g in upper:
        end, size = start, 0
        while size < len(g) and end < len(lower):
            size += len(lower[end])
            end += 1
        if tuple(r for h in lower[start:end] for r in h) != g:
            raise ValueError(f"{what}: group {g} is not made of consecutive groups of the "
                             f"level below, in the same order")
        spans.append((start, end))
        start = end
    return spans


def _labels(levels: tuple[str, ...]) -> list[str]:
    """Level names for describe(); a repeated name is numbered from the top: switch-1 above
    switch-2."""
    return [f"{n}-{levels[i:].count(n)}" if levels.count(n) > 1 else n
            for i, n in enumerate(levels)]


def _ranks_text(group: Sequence[int]) -> str:
    return f"rank {group[0]}" if len(group) == 1 else "ranks " + ",".join(map(str, group))


def _join_groups(groups: Sequence[Sequence[int]]) -> str:
    return ";".join(",".join(map(str, g)) for g in groups)


def flat(world: int) -> Topology:
    """One host group holding ranks 0..world-1 in rank order."""
    return Topology(world, ("host",), ((tuple(range(world)),),))


# A tree under construction: a rank, or a _Node whose slot is the level index it fills.
class _Node:
    __slots__ = ("kind", "slot", "items")

    def __init__(self, kind: str, items: list, slot: int = -1) -> None:
        self.kind, self.items, self.slot = kind, items, slot


_Item = Union[int, _Node]


def _ranks_of(item: _Item) -> list[int]:
    return [item] if isinstance(item, int) else [r for x in item.items for r in _ranks_of(x)]


def _groups_at(items: list[_Item], slot: int) -> Iterator[tuple[int, ...]]:
    """The groups of level ``slot`` under ``items`` (whose parent is above ``slot``). A rank's
    group is its highest ancestor node at or below ``slot``, else the rank alone."""
    for x in items:
        if isinstance(x, int):
            yield (x,)
        elif x.slot <= slot:
            yield tuple(_ranks_of(x))
        else:
            yield from _groups_at(x.items, slot)


def _build(world: int, names: list[str], top: list[_Item]) -> Topology:
    """The topology of the tree ``top`` (the root's items), one level per name, less the
    trivial levels: a level below the top is dropped when each of its groups is a single rank
    or the whole of its parent group. This drops a level whose groups equal those of the level
    above (the upper name stays) and a lowest level of singletons; the levels left keep the
    same tree, without its single-child nodes."""
    groups = [tuple(_groups_at(top, slot)) for slot in range(len(names))]
    keep = [i for i in range(len(names) - 1)
            if any(b - a > 1 and any(len(g) > 1 for g in groups[i][a:b])
                   for a, b in _child_spans(groups[i], groups[i + 1]))]
    keep.append(len(names) - 1)
    return Topology(world, tuple(names[i] for i in keep), tuple(groups[i] for i in keep))


def parse(spec: Any, world: int, *, source: str = "topology") -> Topology:
    """The topology written as ``spec``: "flat", text such as "0,1;2,3|4,5;6,7", that text's
    JSON nested-list form, nested lists or tuples of ints, or a Topology. The order as written
    is the ring order. Every problem is a ValueError that starts with ``source`` and the spec."""

    def fail(why: str) -> NoReturn:
        raise ValueError(f"{source} {spec!r}: {why}")

    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"{source}: world size must be a positive int, got {world!r}")
    if isinstance(spec, Topology):
        if spec.world != world:
            fail(f"a topology of world size {spec.world}, not {world}")
        return spec
    if isinstance(spec, str):
        text = spec.strip()
        if text.lower() == "flat":
            return flat(world)
        if text.startswith("["):
            try:
                tree = json.loads(text)
            except json.JSONDecodeError as e:
                fail(f"not valid JSON ({e.msg} at character {e.pos})")
        else:
            tree = _text_tree(text, fail)
    elif isinstance(spec, (list, tuple)):
        tree = spec
    else:
        fail(f"expected 'flat', a string such as '0,1;2,3' or nested lists of ints, "
             f"got {type(spec).__name__}")
    if not isinstance(tree, (list, tuple)) or not tree:
        fail("no groups")
    depth = _height(tree, 0, fail) - 1
    if depth == 0:
        tree, depth = [tree], 1
    top = [_to_node(x, depth - 1) for x in tree]
    _check_ranks([r for x in top for r in _ranks_of(x)], world, fail)
    return _build(world, list(_DEPTH_NAMES[depth]), top)


def _text_tree(text: str, fail: Callable[[str], NoReturn]) -> list:
    def ranks(group: str) -> list[int]:
        if not group.strip():
            fail("empty group")
        tokens = [t.strip() for t in group.split(",")]
        for t in tokens:
            if not _RANK.fullmatch(t):
                fail(f"{t!r} is not a rank")
        return [int(t) for t in tokens]

    if "|" in text:
        return [[ranks(g) for g in host.split(";")] for host in text.split("|")]
    if ";" in text:
        return [ranks(g) for g in text.split(";")]
    return [ranks(text)]


def _height(x: Any, depth: int, fail: Callable[[str], NoReturn]) -> int:
    """How many list levels ``x`` holds at its deepest, checking every leaf is an int."""
    if isinstance(x, int) and not isinstance(x, bool):
        return 0
    if not isinstance(x, (list, tuple)):
        fail(f"{x!r} is not a rank")
    if not x:
        fail("empty group")
    if depth > len(LEVEL_NAMES):
        fail(f"nested more than {len(LEVEL_NAMES)} levels deep")
    return 1 + max(_height(c, depth + 1, fail) for c in x)


def _to_node(x: Any, slot: int) -> _Item:
    if isinstance(x, int):
        return x
    return _Node("", [_to_node(c, slot - 1) for c in x], slot)


def _check_ranks(ranks: list[int], world: int, fail: Callable[[str], NoReturn]) -> None:
    for r in ranks:
        if not 0 <= r < world:
            fail(f"rank {r} is out of range for world size {world}")
    seen: set[int] = set()
    for r in ranks:
        if r in seen:
            fail(f"rank {r} appears twice")
        seen.add(r)
    missing = [r for r in range(world) if r not in seen]
    if missing:
        listed = ",".join(map(str, missing[:8])) + (",..." if len(missing) > 8 else "")
        fail(f"rank {listed} is missing (world size {world})" if len(missing) == 1
             else f"ranks {listed} are missing (world size {world})")


def detect(hosts: Sequence[str], gpu_paths: Sequence[Sequence[str] | None]) -> Topology:
    """The topology of ranks whose host keys are ``hosts`` and whose GPU paths (from
    pci_path(), None for a CPU rank) are ``gpu_paths``, both indexed by rank.

    Host groups come in the order of their lowest rank. On a host where every rank has a path,
    ranks with the same path share a GPU (level "gpu"), then group by the PCIe switches they
    share (nested switches give repeated "switch" levels, the outermost on top), then by NUMA
    node or root complex ("socket"); a tree node with a single child is no group of its own, and
    children come in the order of their lowest rank. Other hosts hold their ranks directly.
    A pure function of its arguments, so every rank gets the same result."""
    world = len(hosts)
    if world == 0 or len(gpu_paths) != world:
        raise ValueError(f"detect: need one host key and one GPU path per rank, got "
                         f"{world} host keys and {len(gpu_paths)} paths")
    by_host: dict[Any, list[int]] = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    top: list[_Item] = []
    for ranks in by_host.values():
        paths = [gpu_paths[r] for r in ranks]
        if all(p is not None for p in paths):
            items = _pcie_items(ranks, paths)  # type: ignore[arg-type]
        else:
            items = list(ranks)
        top.append(_Node("host", items))
    switches = max(_name_and_count_switches(x, False, 0) for x in top)
    for x in top:
        _assign_slots(x, switches, 0)
    return _build(world, ["gpu"] + ["switch"] * switches + ["socket", "host"], top)


# A trie node: (children by path component, ranks whose path ends here).
_Trie = tuple[dict[str, "_Trie"], list[int]]


def _pcie_items(ranks: list[int], paths: list[Sequence[str]]) -> list[_Item]:
    root: _Trie = ({}, [])
    for r, path in zip(ranks, paths):
        if isinstance(path, str) or not path or not all(isinstance(c, str) for c in path):
            raise ValueError(f"detect: rank {r} has GPU path {path!r}; expected a list of "
                             f"strings from pci_path()")
        node = root
        for c in path:
            node = node[0].setdefault(c, ({}, []))
        node[1].append(r)
    return sorted((_collapse(t, 0) for t in root[0].values()), key=_lowest)


def _collapse(trie: _Trie, index: int) -> _Item:
    """The tree below trie node ``trie`` (path component ``index``), where a node with a
    single child is replaced by that child. Components 0 and 1 (NUMA node, root complex) make
    "socket" nodes, bridges "switch" nodes, ranks ending at one path a "gpu" node."""
    children, ranks = trie
    items: list[_Item] = []
    if ranks:
        items.append(ranks[0] if len(ranks) == 1 else _Node("gpu", list(ranks)))
    items += [_collapse(t, index + 1) for t in children.values()]
    if len(items) == 1:
        return items[0]
    return _Node("socket" if index <= 1 else "switch", sorted(items, key=_lowest))


def _lowest(item: _Item) -> int:
    return item if isinstance(item, int) else _lowest(item.items[0])


def _name_and_count_switches(item: _Item, under_socket: bool, above: int) -> int:
    """Renames a socket node below another socket node (a root complex inside a NUMA node) to
    a switch; returns the most switch nodes on one path from ``item`` down, plus ``above``."""
    if isinstance(item, int):
        return above
    if item.kind == "socket" and under_socket:
        item.kind = "switch"
    above += item.kind == "switch"
    socket = under_socket or item.kind == "socket"
    return max(_name_and_count_switches(x, socket, above) for x in item.items)


def _assign_slots(item: _Item, switches: int, above: int) -> None:
    """Levels: 0 gpu, 1..switches the switches (the outermost highest), then socket, host."""
    if isinstance(item, int):
        return
    item.slot = {"gpu": 0, "switch": switches - above, "socket": switches + 1,
                 "host": switches + 2}[item.kind]
    above += item.kind == "switch"
    for x in item.items:
        _assign_slots(x, switches, above)
