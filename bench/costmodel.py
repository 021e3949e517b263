#!/usr/bin/env python
"""Alpha-beta cost model of allreduce, fitted to bench/allreduce.py results: predicts ring
allreduce time and data-parallel training speedup at 8..4096 ranks for a given topology.

    python bench/costmodel.py        # every bench/results/allreduce_*.json, median per size
    python bench/costmodel.py --fit bench/results/allreduce_*.json --topology 8x8:pcie:25gbe
    python bench/costmodel.py --topology 4x8:pcie:eth=30/2.5 --grad-mb 98 --compute-ms 180
    python bench/costmodel.py --tree-topology 2x2x2:pcie4:pcie:upi --hosts  # skip hosts_*.json

Model (bench/_alphabeta.py; n bytes, N ranks), one parameter set per link class:
  ring    T = 2(N-1) alpha + 2(N-1)/N n (f / beta_c + (1 - f) / beta_m),  f = min(1, S / n)
  direct  T = (N-1) (alpha_d + n / beta_d)         (pyring's small-message algorithm, <= 16 KiB)
beta_c: bandwidth while the buffer stays in cache; beta_m: once it streams from memory, beyond
the spill size S (a link without such an effect fits beta_c = beta_m). Both are *effective*
bandwidths that fold in the local reduction. Fitted by least squares on relative error with
coefficients >= 0, S by search. Each measured point is the median over every run given of one
class, world size and message size. Fitted classes are LIB-LINK: pyring-shm, pyring-tcp
(loopback here), gloo-tcp (gloo always uses TCP), mpi-shm (for reference: Open MPI picks its
algorithm per size, so a ring model describes it only roughly); runs with more ranks than cores
are only predicted (time-sharing cores is not alpha-beta). PRESETS (typical, not measured here) and
inline classes (NAME=ALPHA_US/GBPS) describe links this machine lacks.
Topology "HxG:INTRA:INTER": G ranks per host joined by INTRA, hosts by INTER (curves vary the
host count). The ring visits each host's ranks in turn, so each of its 2(N-1) steps moves n/N
bytes over every link at once and lasts as long as the slowest class it crosses:
  T_ring = 2(N-1) max_c (alpha_c + n / (N beta_c)).
Tree (bench/_tree_model.py): topology "S_k x .. x S_0:C_0:..:C_k" (teams outermost first,
classes innermost first); level l has s_l ranks per team over class c_l, k_l = s_0 .. s_{l-1}
flows sharing each of its links, and the region n_l left by the levels below:
  T_tree = sum_l 2(s_l - 1) (alpha_c + k_l n_l / s_l (f_l / beta_c + (1 - f_l) / beta_m)),
  n_0 = n, n_{l+1} = n_l / s_l, f_l = min(1, S / n_l) (a token bucket: min(1, B s_l / (k_l n_l))).
A level-l group sends 2(s_l - 1)/s_l n over its link, the ring 2(N-1)/N n over every link.
Inter-host classes eth<rate>-emu (veth-emu unshaped) from bench/hosts.py runs (status ok):
fitted on the pyring ring rows (T_ring above, pyring-shm held fixed inside a host) with a token
bucket's split (the first B bytes of each step at beta_c, bench/_alphabeta.py), then checked
on the tree rows (out of sample).
Training (weak scaling, per-rank compute t_c(N), backward t_b, overlap o in [0, 1]):
  speedup(N) = N t_c(1) / (t_c(N) + max(0, T_ring(gradient bytes, N) - o t_b)).
Validation: in-sample and leave-one-point-out error of every allreduce row; other world sizes
(fit the rest, predict them); training.py --mode scaling's speedups (o = 0, its measured
compute times).
Writes bench/results/costmodel_<tag>.json (tree predictions under "tree", inter-host fits under
"inter_host") and a PNG of predicted time and speedup vs ranks.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import sys
from pathlib import Path
from typing import Any

import _alphabeta as ab
import _tree_model as tm
from _measured import aggregate, load_points
from _results import add_replace_flag, result_path  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results"
PRESETS = {  # alpha (s), beta (B/s): typical, stated assumptions, not measured here
    "pcie": (8e-6, 10e9),  # PCIe 3.0 x16 GPU to GPU through the host bridge
    "pcie4": (8e-6, 20e9),
    "10gbe": (30e-6, 1.15e9),  # TCP goodput ~ 92% of line rate
    "25gbe": (25e-6, 2.9e9),
    "100gbe": (15e-6, 11.5e9),
    "upi": (8e-6, 20e9),  # GPU peer traffic between sockets through both CPUs (UPI/xGMI):
    # a typical effective figure for a dual-socket PCIe server, not measured
}
DEFAULT_TOPOLOGIES = ("8x8:pcie:25gbe", "8x8:pcie:100gbe", "1x1:-:25gbe", "8x2:pyring-shm:10gbe")
REFERENCE = "mpi-"  # fitted and reported, but no prediction here rests on these classes
SPEEDUP_OF = {"pyring": "pyring-shm", "ddp-pyring": "pyring-shm", "ddp-gloo": "gloo-tcp"}


def err(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def validate(pts: list[dict[str, Any]], params: dict[str, Any]) -> None:
    """Adds pred/err (in-sample) and loo_err (the class refitted without the point)."""
    for p in pts:
        p["pred"] = ab.predict(params, p["algo"], p["world"], p["size"])
        p["err"] = err(p["pred"], p["t"])
        rest = [q for q in pts if q is not p]
        if len({q["size"] for q in rest}) >= 3:
            loo = ab.fit(rest)
            p["loo_err"] = err(ab.predict(loo, p["algo"], p["world"], p["size"]), p["t"])


def link(name: str, fits: dict[str, Any]) -> dict[str, Any]:
    """A link class's parameters: fitted, preset, or inline 'name=ALPHA_US/GBPS'."""
    if "=" in name:
        a, b = name.split("=", 1)[1].split("/")
        return ab.preset(float(a) * 1e-6, float(b) * 1e9)
    if name in fits:
        return fits[name]["params"]
    if name in PRESETS:
        return ab.preset(*PRESETS[name])
    valid = sorted(fits) + sorted(PRESETS) + ["NAME=ALPHA_US/GBPS"]
    raise SystemExit(f"unknown link class {name!r}; valid: {', '.join(valid)}")


def parse_topology(spec: str) -> tuple[int, int, str, str | None]:
    """'HxG:INTRA[:INTER]' or 'G:INTRA[:INTER]' -> (hosts or 0, G, intra, inter)."""
    parts = spec.split(":")
    shape = parts[0].lower().split("x")
    hosts, per = (int(shape[0]), int(shape[1])) if len(shape) == 2 else (0, int(shape[0]))
    return hosts, per, parts[1], parts[2] if len(parts) > 2 else None


def ring_time(topo: str, fits: dict[str, Any], n: float, world: int) -> float:
    """Ring allreduce of n bytes on `world` ranks laid out as the topology says."""
    _, per, intra, inter = parse_topology(topo)
    classes = ([intra] if min(world, per) > 1 else []) + ([inter] if world > per else [])
    if world > per and inter is None:
        raise SystemExit(f"topology {topo}: {world} ranks need an inter-host link class")
    if world == 1:
        return 0.0
    return 2 * (world - 1) * max(ab.step(link(c, fits), n, world) for c in classes)


def speedup(t1: float, tn: float, comm: float, backward: float, overlap: float, n: int) -> float:
    return n * t1 / (tn + max(0.0, comm - overlap * backward))


def validate_scaling(paths: list[str], fits: dict[str, Any]) -> list[dict[str, Any]]:
    """training.py --mode scaling's speedups against the model: t_c(1), t_c(N) and the gradient
    size from the same JSON, the ring time from the method's fitted class on one host, o = 0."""
    out = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        runs, nbytes = doc.get("runs", {}), 4 * doc.get("config", {}).get("params", 0)
        c1 = runs.get("compute x1", {}).get("step_s")
        for row in doc.get("summary", []):
            cls, n = SPEEDUP_OF.get(row["method"]), row["ranks"]
            cn = runs.get(f"compute x{n}", {}).get("step_s")
            if n < 2 or cls not in fits or not (c1 and cn and row.get("speedup")):
                continue
            comm = ring_time(f"{n}:{cls}", fits, nbytes, n)
            pred = speedup(c1, cn, comm, 0.0, 0.0, n)
            out.append({"file": Path(path).name, "method": row["method"], "ranks": n,
                        "class": cls, "grad_bytes": nbytes, "comm_pred_s": comm,
                        "comm_meas_s": row.get("comm_s"), "speedup": row["speedup"],
                        "pred": pred, "err": err(pred, row["speedup"])})
    return out


def cross_world(pts: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per class with several world sizes: fit on the others, predict each world's points."""
    out = []
    for cls in sorted({p["cls"] for p in pts}):
        mine = [p for p in pts if p["cls"] == cls]
        for w in sorted({p["world"] for p in mine}):
            train = [p for p in mine if p["world"] != w and not p["oversub"]]
            if len({p["size"] for p in train}) < 3:
                continue
            params = ab.fit(train)
            errs = {p["size"]: err(ab.predict(params, p["algo"], w, p["size"]), p["t"])
                    for p in mine if p["world"] == w}
            out.append({"class": cls, "world": w, "fitted_on": sorted({p["world"] for p in train}),
                        "max_abs_err": max(map(abs, errs.values())), "errs": errs})
    return out


def human(n: float) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


def plot(pred: dict[str, Any], workload: dict[str, Any], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no PNG: {e}"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    for topo, curve in pred.items():
        ns = [c["ranks"] for c in curve]
        ax1.plot(ns, [c["allreduce_s"] * 1e3 for c in curve], "o-", ms=3, label=topo)
        ax2.plot(ns, [c["speedup"] for c in curve], "o-", ms=3, label=topo)
    ns = sorted({c["ranks"] for curve in pred.values() for c in curve})
    ax2.plot(ns, ns, "k--", lw=1, label="ideal")
    ax1.set(yscale="log", xlabel="ranks", ylabel="ring allreduce (ms)",
            title=f"allreduce of {human(workload['grad_bytes'])}B (predicted)")
    ax2.set(yscale="log", xlabel="ranks", ylabel="speedup over 1 rank",
            title=f"speedup: {workload['compute_s'] * 1e3:.0f} ms/step, overlap "
                  f"{workload['overlap']:.0%} of {workload['backward_s'] * 1e3:.0f} ms bwd")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fit", nargs="+", default=None, metavar="JSON",
                   help="allreduce results (default: bench/results/allreduce_*.json)")
    p.add_argument("--scaling", nargs="*", default=None, metavar="JSON",
                   help="training.py --mode scaling results to validate "
                   "(default: bench/results/scaling_*.json)")
    p.add_argument("--mode", choices=("ip", "oop"), default="ip", help="in-place or not")
    p.add_argument("--target", type=float, default=0.25, help="worst in-sample error wanted")
    p.add_argument("--topology", action="append", default=None,
                   help=f"HxG:INTRA:INTER, repeatable (default: {' '.join(DEFAULT_TOPOLOGIES)})")
    p.add_argument("--grad-mb", type=float, default=97.5, help="gradient MiB per step "
                   "(default: ResNet-50's 25.6 M float32 parameters)")
    p.add_argument("--compute-ms", type=float, default=180.0, help="compute time per step")
    p.add_argument("--backward-frac", type=float, default=2 / 3, help="backward share of it")
    p.add_argument("--overlap", type=float, default=0.0,
                   help="share of backward that hides communication (0: none, 1: all)")
    p.add_argument("--max-ranks", type=int, default=4096)
    p.add_argument("--hosts", nargs="*", default=None, metavar="JSON", help="bench/hosts.py "
                   "results to fit inter-host classes on (default: bench/results/hosts_*.json)")
    p.add_argument("--tree-topology", action="append", default=None, metavar="Sx..xS:C:..:C",
                   help="tree vs ring, repeatable (default: "
                   + " ".join(tm.TREE_TOPOLOGIES.values()) + ")")
    p.add_argument("--tag", default="model")
    add_replace_flag(p)
    return p.parse_args(argv)


def describe(params: dict[str, Any]) -> str:
    where = (f"for the first {human(params['burst'])}B of each step" if params.get("burst")
             else "in cache")
    text = (f"ring: alpha {params['alpha'] * 1e6:.2f} us, beta {params['beta_c'] / 1e9:.2f} GB/s "
            f"{where}, {params['beta_m'] / 1e9:.2f} GB/s beyond "
            f"{human(params.get('burst') or params['spill'])}B")
    if params.get("beta_d"):
        text += (f"; direct: alpha {params['alpha_d'] * 1e6:.2f} us, beta "
                 f"{params['beta_d'] / 1e9:.2f} GB/s")
    return text + " (effective)"


def pct(v: float | None) -> str:
    return "      -" if v is None else f"{100 * v:+6.1f}%"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    fit_paths = args.fit or sorted(glob.glob(str(RESULTS / "allreduce_*.json")))
    scaling_paths = (args.scaling if args.scaling is not None
                     else sorted(glob.glob(str(RESULTS / "scaling_*.json"))))
    raw = load_points(fit_paths, args.mode)
    pts = aggregate(raw)  # one point per class, world and size: the median over the runs
    if not pts:
        sys.exit("no allreduce rows to fit: run bench/allreduce.py first (or pass --fit)")
    fits: dict[str, Any] = {}  # oversubscribed runs (more ranks than cores) are only predicted
    for cls in sorted({p["cls"] for p in pts if not p["oversub"]}):
        mine = sorted((p for p in pts if p["cls"] == cls and not p["oversub"]),
                      key=lambda p: (p["world"], p["size"]))
        params = ab.fit(mine)
        validate(mine, params)
        loo = [abs(p["loo_err"]) for p in mine if "loo_err" in p]
        fits[cls] = {"params": params, "max_abs_err": max(abs(p["err"]) for p in mine),
                     "max_abs_loo_err": max(loo) if loo else None, "points": mine}
        f = fits[cls]
        # The same size measured in several runs: the noise a single run would carry.
        spread = [max(t for t, _ in p["runs"]) / min(t for t, _ in p["runs"]) - 1
                  for p in mine if len(p["runs"]) > 1]
        f["run_to_run_max_spread"] = max(spread) if spread else None
        f["runs_per_point"] = sorted({len(p["runs"]) for p in mine})
        files = {q for p in mine for _, q in p["runs"]}
        print(f"\n# {cls}: {len(mine)} points, each the median of "
              f"{'/'.join(map(str, f['runs_per_point']))} run(s) from {len(files)} file(s); "
              f"max |error| {100 * f['max_abs_err']:.1f}% in-sample, leave-one-out "
              f"{pct(f['max_abs_loo_err']).strip()}" + (f"; runs differ by up to "
              f"{100 * max(spread):.0f}% at one size" if spread else ""))
        print("#   " + describe(params))
        print("#  world       size  measured us  predicted us   error  loo err  algo")
        for p in mine:
            print(f"   {p['world']:5d} {human(p['size']):>10s} {p['t'] * 1e6:12.1f} "
                  f"{p['pred'] * 1e6:13.1f} {pct(p['err'])} {pct(p.get('loo_err'))}  {p['algo']}")
    cw = cross_world(pts, args)
    for c in cw:
        print(f"# across world sizes: {c['class']} fitted on W={c['fitted_on']}, predicting W="
              f"{c['world']}: max |error| {100 * c['max_abs_err']:.0f}%")
    sc = validate_scaling(scaling_paths, fits)
    if sc:
        print("\n# training speedup, measured (training.py --mode scaling) vs predicted (o = 0)")
        for v in sc:
            print(f"   {v['file']:28s} {v['method']:11s} x{v['ranks']}  measured "
                  f"{v['speedup']:5.2f}  predicted {v['pred']:5.2f}  {pct(v['err'])}  (comm "
                  f"{v['comm_pred_s'] * 1e3:.2f} ms predicted, "
                  f"{(v['comm_meas_s'] or 0) * 1e3:.2f} ms measured alone)")
    host_paths = (args.hosts if args.hosts is not None
                  else sorted(glob.glob(str(RESULTS / "hosts_*.json"))
                              + glob.glob(str(RESULTS / "allreduce_*.json"))))
    shm = fits.get("pyring-shm", {}).get("params")
    host_fits = tm.fit_hosts(tm.load_hosts(host_paths), shm) if shm and host_paths else {}
    if host_paths and not shm:
        print("# no pyring-shm class to hold fixed: inter-host classes not fitted")
    tm.print_hosts(host_fits, describe, pct)
    classes = {**fits, **host_fits}  # what topologies may name, besides presets
    known = set(classes) | set(PRESETS) | {"-"}
    topos = args.topology or [t for t in DEFAULT_TOPOLOGIES
                              if set(parse_topology(t)[2:]) <= known]
    n, tc = args.grad_mb * 2**20, args.compute_ms * 1e-3
    workload = {"grad_bytes": n, "compute_s": tc, "backward_s": tc * args.backward_frac,
                "overlap": args.overlap}
    pred: dict[str, Any] = {}
    print(f"\n# predicted ring allreduce of {human(n)}B and speedup ({args.compute_ms:g} ms "
          f"compute, overlap {args.overlap:.0%} of {args.backward_frac:.0%} backward)")
    for topo in topos:
        hosts, per, _, inter = parse_topology(topo)
        ranks = [r for r in sorted({2**k for k in range(3, int(math.log2(args.max_ranks)) + 1)}
                                   | ({hosts * per} if hosts * per > 1 else set()))
                 if inter or r <= per]  # one host only without an inter-host class
        pred[topo] = [{"ranks": r, "allreduce_s": t, "speedup": speedup(
            tc, tc, t, workload["backward_s"], args.overlap, r)}
            for r in ranks for t in [ring_time(topo, classes, n, r)]]
        for c in pred[topo]:
            if c["ranks"] in (8, 64, 512, 4096) or c["ranks"] == hosts * per:
                print(f"   {topo:24s} {c['ranks']:5d} ranks  allreduce "
                      f"{c['allreduce_s'] * 1e3:9.1f} ms  speedup {c['speedup']:8.1f} "
                      f"({c['speedup'] / c['ranks']:.0%})")
    for ref in (False, True):  # the classes the predictions use, then the reference ones
        errs = [(abs(p["err"]), f"{c} {human(p['size'])}B") for c, f in fits.items()
                if c.startswith(REFERENCE) == ref for p in f["points"]]
        errs += [] if ref else [(abs(v["err"]), f"{v['method']} x{v['ranks']}") for v in sc]
        if errs:
            worst = max(errs)
            print(f"# worst |error| over the {'reference' if ref else 'modelled'} points: "
                  f"{100 * worst[0]:.1f}% ({worst[1]}; target {100 * args.target:.0f}%)")
    tree: dict[str, Any] = {}
    for name, spec in ({t: t for t in args.tree_topology} if args.tree_topology
                       else tm.TREE_TOPOLOGIES).items():
        tree[name] = tm.predict(spec, lambda c: link(c, classes))
        tm.print_prediction(name, tree[name])
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = result_path(f"costmodel_{args.tag}", None, args.replace)
    doc = {"benchmark": "costmodel", "command": sys.argv, "fit_files": fit_paths,
           "scaling_files": scaling_paths, "mode": args.mode, "presets": PRESETS,
           "fits": fits, "cross_world": cw, "scaling_validation": sc, "workload": workload,
           "predictions": pred, "model": __doc__,
           "inter_host": tm.finite({"files": host_paths, "fits": host_fits}),
           "tree": tm.finite({"model": tm.__doc__, "predictions": tree})}
    out.write_text(json.dumps(doc, indent=1, default=str))
    msg = plot(pred, workload, out.with_suffix(".png"))
    print(f"# wrote {out}" + (f" ({msg})" if msg else f" and {out.with_suffix('.png').name}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
