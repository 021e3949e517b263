"""The tree allreduce in bench/costmodel.py's alpha-beta model, and the emulated inter-host link
classes fitted from bench/hosts.py results.

A tree topology "S_k x .. x S_0:C_0:..:C_k" lists team sizes outermost first (as HxG does) and
link classes innermost first (as INTRA:INTER does): S_0 ranks of a lowest group share class
C_0, S_1 such groups share C_1, and so on; N = S_0 ... S_k. Level l (team s_l, class c_l):

  tau_l  = 2(s_l - 1) (alpha_c + k_l n_l / s_l (f_l / beta_c + (1 - f_l) / beta_m))
           n_0 = n / K, n_{l+1} = n_l / s_l,  f_l = min(1, S / n_l),  k_l = s_0 ... s_{l-1}
  T_tree = sum_l tau_l + (K - 1) max_l tau_l,  K = min(16, n / 2 MiB) slices (1 for one team)

(f_l = min(1, B s_l / (k_l n_l)) for a token-bucket class: B bytes of each step at beta_c.)

pyring's schedule (csrc/collectives/tree_allreduce.cc): reduce-scatter up the levels, allreduce
at the top, allgather down; large buffers are cut into K slices so that slice k crosses the top
while slice k+1 climbs and slice k-1 descends the lower levels (a pipeline: fill, then one
bottleneck level time per further slice). The k_l members of a level-l group run
their flows across the group's one link at once, so each flow gets 1/k_l of it and the group
sends 2(s_l - 1)/s_l n over it. The flat ring (costmodel.ring_time) has one flow per link
direction and sends 2(N-1)/N n over every link, all levels at once.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable

import _alphabeta as ab

TREE_TOPOLOGIES = {  # name -> topology; classes are presets (typical, not measured here)
    "8 hosts x 8 GPUs, 25 GbE": "8x8:pcie:25gbe",
    "8-GPU PCIe server, 2 sockets x 2 switches x 2 GPUs": "2x2x2:pcie4:pcie:upi",
}
TREE_SIZES = [4**k * 4096 for k in range(10)]  # 4 KiB .. 1 GiB
Resolve = Callable[[str], dict[str, Any]]  # link class name -> ab parameters


def parse_levels(spec: str, resolve: Resolve) -> list[dict[str, Any]]:
    """'S_k x .. x S_0:C_0:..:C_k' -> levels, lowest first: team, class, params, flows (k_l)."""
    parts = spec.split(":")
    shape = [int(s) for s in reversed(parts[0].lower().split("x"))]
    if len(parts) != len(shape) + 1:
        raise SystemExit(f"tree topology {spec!r}: {len(shape)} team sizes need as many classes")
    levels, flows = [], 1
    for s, c in zip(shape, parts[1:]):
        levels.append({"team": s, "class": c, "params": resolve(c) if s > 1 else None,
                       "flows": flows})
        flows *= s
    return levels


def ring_time(levels: list[dict[str, Any]], n: float) -> float:
    """The flat ring in topology order: 2(N-1) steps, each as long as the slowest class."""
    world = math.prod(lv["team"] for lv in levels)
    steps = [ab.step(lv["params"], n, world) for lv in levels if lv["team"] > 1]
    return 2 * (world - 1) * max(steps) if steps else 0.0


SLICE_BYTES = 2 << 20  # csrc/collectives/collectives.h kTreeSliceBytes
MAX_SLICES = 16  # kTreeMaxSlices


def tree_slices(n: float, teams: int) -> int:
    """How many pipelined slices pyring's tree cuts n bytes into (tree_slices() in C++)."""
    return 1 if teams < 2 else max(1, min(MAX_SLICES, int(n // SLICE_BYTES)))


def tree_time(levels: list[dict[str, Any]], n: float, shared: bool = True) -> float:
    """pyring's tree: K slices pipeline the levels, so T = sum_l tau_l + (K - 1) max_l tau_l,
    tau_l being one slice's time at level l. shared=False gives every flow the whole link."""
    teams = [lv for lv in levels if lv["team"] > 1]
    k = tree_slices(n, len(teams))
    taus, region = [], float(n) / k
    for lv in levels:
        s = lv["team"]
        if s > 1:
            taus.append(2 * (s - 1) * ab.step(lv["params"], region, s,
                                              lv["flows"] if shared else 1))
        region /= s
    return sum(taus) + (k - 1) * max(taus) if taus else 0.0


def group_bytes(levels: list[dict[str, Any]], n: float) -> list[dict[str, Any]]:
    """Bytes one group at each level sends out over its link, per algorithm."""
    world = math.prod(lv["team"] for lv in levels)
    return [{"class": lv["class"], "group_ranks": lv["flows"],
             "ring": 2 * (world - 1) / world * n, "tree": 2 * (lv["team"] - 1) / lv["team"] * n}
            for lv in levels if lv["team"] > 1]


def slowest(levels: list[dict[str, Any]]) -> int:
    """Index into group_bytes of the level whose class has the lowest bandwidth (the highest
    such level on a tie)."""
    used = [lv for lv in levels if lv["team"] > 1]
    bw = [min(lv["params"]["beta_c"], lv["params"]["beta_m"]) for lv in used]
    return max(range(len(used)), key=lambda i: (-bw[i], i))


def level_json(lv: dict[str, Any]) -> dict[str, Any]:
    """A level with its link's parameters inline."""
    keep = ("alpha", "beta_c", "beta_m", "spill", "burst")
    link = {k: v for k, v in (lv["params"] or {}).items() if k in keep}
    return {**{k: v for k, v in lv.items() if k != "params"}, **link}


def finite(x: Any) -> Any:
    """x with every infinite or NaN float as None, for strict JSON."""
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def predict(spec: str, resolve: Resolve, sizes: list[int] = TREE_SIZES) -> dict[str, Any]:
    """Ring and tree seconds per size on one tree topology, with the bytes per group."""
    levels = parse_levels(spec, resolve)
    rows = []
    for n in sizes:
        r, t = ring_time(levels, n), tree_time(levels, n)
        rows.append({"size": n, "ring_s": r, "tree_s": t, "speedup": r / t,
                     "tree_unshared_s": tree_time(levels, n, shared=False),
                     "bytes_per_group": group_bytes(levels, n)})
    # Sizes (on a grid of 2^(1/8) steps, 4 KiB .. 1 GiB) where the faster algorithm changes.
    grid = [4096 * 2 ** (k / 8) for k in range(8 * 18 + 1)]
    sign = [tree_time(levels, n) < ring_time(levels, n) for n in grid]
    cross = [{"size": round(grid[i]), "tree_faster_above": sign[i]}
             for i in range(1, len(grid)) if sign[i] != sign[i - 1]]
    return {"topology": spec, "ranks": math.prod(lv["team"] for lv in levels),
            "levels": [level_json(lv) for lv in levels],
            "slowest_level": slowest(levels), "rows": rows, "crossovers": cross}


def human(n: float) -> str:
    """Bytes to three significant digits: 7.88 KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} B"


def print_prediction(name: str, pred: dict[str, Any]) -> None:
    lv = [x for x in pred["levels"] if x["team"] > 1]
    desc = ", ".join(f"{x['team']} x {x['class']} ({x['alpha'] * 1e6:.3g} us, "
                     f"{x['beta_m'] / 1e9:.3g} GB/s, {x['flows']} flow(s) per link)"
                     for x in lv)
    low = lv[pred["slowest_level"]]
    title = name if name == pred["topology"] else f"{name}, {pred['topology']}"
    print(f"\n# tree vs ring: {title} (N={pred['ranks']})\n#   teams, lowest first: {desc}")
    print(f"#   bytes: sent out of one {low['flows']}-rank group over its {low['class']} link "
          f"(the slowest); 'unshared': the tree if every flow had a whole link")
    print("#       size     ring us     tree us  speed-up  unshared  ring bytes  tree bytes")
    for r in pred["rows"]:
        b = r["bytes_per_group"][pred["slowest_level"]]
        print(f"   {human(r['size']):>8s} {r['ring_s'] * 1e6:11.1f} {r['tree_s'] * 1e6:11.1f} "
              f"{r['speedup']:8.2f}x {r['ring_s'] / r['tree_unshared_s']:8.2f}x "
              f"{human(b['ring']):>10s} {human(b['tree']):>10s}")
    for c in pred["crossovers"]:
        print(f"#   the {'tree' if c['tree_faster_above'] else 'ring'} is faster above "
              f"~{human(c['size'])}")


# ------------------------------------------------------------ emulated hosts
def host_class(rate: str | None) -> str:
    """tc rate -> class name: '1gbit' -> 'eth1g-emu', None (unshaped) -> 'veth-emu'."""
    m = re.fullmatch(r"([\d.]+)([kmg]?)bit", (rate or "").lower())
    return f"eth{m.group(1)}{m.group(2)}-emu" if m else "veth-emu"


def host_layout(run: dict[str, Any]) -> list[int]:
    """Ranks per host. The old hosts.py wrote one count per host; [hosts, ranks_per_host] is
    accepted where the run's world (or, without one, its link's host count) tells them
    apart."""
    lay, world = [int(x) for x in run["layout"]], run.get("world")
    hosts = (run.get("link") or {}).get("hosts")
    if len(lay) == 2 and (sum(lay) != world == lay[0] * lay[1] if world is not None
                          else hosts == lay[0] != 2):
        return [lay[1]] * lay[0]
    return lay


def load_hosts(paths: list[str]) -> list[dict[str, Any]]:
    """One point per (class, layout, algorithm, size): the median over the runs whose status is
    'ok' and whose row has no wrong element."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for path in paths:
        doc = json.loads(Path(path).read_text())
        if doc.get("benchmark") == "allreduce":  # bench/allreduce.py --hosts
            for key, point in _allreduce_host_points(doc, Path(path).name):
                groups.setdefault(key, []).append(point)
            continue
        for run in doc.get("runs", []):
            if run.get("status") != "ok":
                continue
            lay = host_layout(run)
            for row in run.get("rows", []):
                for algo in ("ring", "tree"):
                    m = (row.get("algos") or {}).get(algo)
                    if not m or m.get("wrong") or m.get("time_us", 0) <= 0:
                        continue
                    sent = m.get("sent_out_of_host_per_iter")
                    key = (host_class(run.get("rate")), tuple(lay), algo, row["size"])
                    groups.setdefault(key, []).append({
                        "t": m["time_us"] * 1e-6, "file": Path(path).name,
                        "sent": sum(sent.values()) / len(sent) if sent else None})
    out = []
    for (cls, lay, algo, size), g in sorted(groups.items()):
        ts = sorted(q["t"] for q in g)
        mid = len(ts) // 2
        sent = [q["sent"] for q in g if q["sent"] is not None]
        out.append({"cls": cls, "layout": list(lay), "world": sum(lay), "algo": algo,
                    "size": size, "runs": len(g), "files": sorted({q["file"] for q in g}),
                    "t": ts[mid] if len(ts) % 2 else (ts[mid - 1] + ts[mid]) / 2,
                    "sent_per_host": sum(sent) / len(sent) if sent else None})
    return out


def _allreduce_host_points(doc: dict[str, Any], name: str) -> list[tuple[Any, dict]]:
    """(group key, point) per pyring-ring / pyring-tree size of an emulated-hosts run of
    bench/allreduce.py; "sent" is the bytes one host sent out per call."""
    if not doc.get("hosts"):
        return []
    h, k = (int(x) for x in doc["hosts"].split("x"))
    out = []
    for e in doc["sizes"]:
        for algo in ("ring", "tree"):
            us = e["median_us"].get(f"pyring-{algo}")
            if not us or e["wrong"].get(f"pyring-{algo}"):
                continue
            sent = e.get("sent_across_per_call", {}).get(f"pyring-{algo}")
            out.append(((host_class(doc.get("rate")), tuple([k] * h), algo, e["bytes"]),
                        {"t": us * 1e-6, "file": name, "sent": sent / h if sent else None}))
    return out


def host_levels(lay: list[int], shm: dict[str, Any], inter: dict[str, Any]) -> list[dict]:
    """An even layout as tree levels: shm inside a host, every host's ranks sharing its link."""
    return [{"team": lay[0], "class": "shm", "params": shm, "flows": 1},
            {"team": len(lay), "class": "inter", "params": inter, "flows": lay[0]}]


def shm_step(p: dict[str, Any], shm: dict[str, Any]) -> float:
    """The ring step of a host point's shm links (none with one rank per host)."""
    return ab.step(shm, p["size"], p["world"]) if max(p["layout"]) > 1 else 0.0


def fit_hosts(points: list[dict[str, Any]], shm: dict[str, Any]) -> dict[str, Any]:
    """Per class: fit the inter-host link on the ring points (shm held fixed for the links
    inside a host), then predict every ring (in-sample) and tree (out-of-sample) point.
    A ring point whose step the shm class already explains says nothing about the inter-host
    link and is left out of the fit."""
    fits = {}
    for cls in sorted({p["cls"] for p in points}):
        mine = [p for p in points if p["cls"] == cls]
        train = [p for p in mine
                 if p["algo"] == "ring" and p["t"] / (2 * (p["world"] - 1)) > shm_step(p, shm)]
        if len({p["size"] for p in train}) < 3:
            continue
        inter = ab.fit(train, split="step")
        for p in mine:
            lv = host_levels(p["layout"], shm, inter)
            even = len(set(p["layout"])) == 1
            world, hosts = p["world"], len(p["layout"])
            if p["algo"] == "ring":
                pred = 2 * (world - 1) * max(ab.step(inter, p["size"], world), shm_step(p, shm))
                bytes_ = 2 * (world - 1) / world * p["size"]
            elif even:
                pred = tree_time(lv, p["size"])
                p["pred_unshared"] = tree_time(lv, p["size"], shared=False)
                p["err_unshared"] = p["pred_unshared"] / p["t"] - 1
                bytes_ = 2 * (hosts - 1) / hosts * p["size"]
            else:
                continue  # pyring folds uneven trees: not modelled here
            p["pred"], p["err"], p["fitted"] = pred, pred / p["t"] - 1, p in train
            if p["sent_per_host"]:
                p["bytes_pred"] = bytes_
                p["bytes_err"] = p["sent_per_host"] / bytes_ - 1
        done = [p for p in mine if "err" in p]
        fits[cls] = {"params": inter, "shm_params": shm, "points": done,
                     "fitted_points": len(train),
                     **{f"max_abs_err_{a}": max((abs(p["err"]) for p in done if p["algo"] == a),
                                                default=None) for a in ("ring", "tree")}}
    return fits


def print_hosts(fits: dict[str, Any], describe: Callable, pct: Callable) -> None:
    for cls, f in fits.items():
        print(f"\n# {cls} (emulated inter-host link, fitted on {f['fitted_points']} pyring ring "
              f"points; shm inside a host held at pyring-shm)")
        print("#   " + describe(f["params"]))
        print("#   layout      size  ring meas us    pred   error  tree meas us    pred   error"
              "  unshared  bytes ring/tree")
        by = {(tuple(p["layout"]), p["size"], p["algo"]): p for p in f["points"]}
        for lay, size in sorted({(k[0], k[1]) for k in by}):
            r, t = by.get((lay, size, "ring")), by.get((lay, size, "tree"))
            cells = [f"{q['t'] * 1e6:12.0f} {q['pred'] * 1e6:7.0f} {pct(q['err'])}" if q
                     else f"{'-':>12s} {'-':>7s} {'-':>7s}" for q in (r, t)]
            print(f"   {'+'.join(map(str, lay)):>6s} {human(size):>9s} {cells[0]} {cells[1]}"
                  f"  {pct(t['err_unshared']) if t else '      -'}  "
                  + "/".join(pct(q.get("bytes_err")).strip() if q else "-" for q in (r, t)))
        print(f"#   max |error|: ring {pct(f['max_abs_err_ring']).strip()} in-sample, tree "
              f"{pct(f['max_abs_err_tree']).strip()} out-of-sample; unshared tree "
              + pct(max((abs(p["err_unshared"]) for p in f["points"] if "err_unshared" in p),
                        default=None)).strip())
