"""bench/tables.py's renderers of the collective benchmarks: allreduce (libraries one after
another, and taking turns), emulated hosts, algorithm choice, instructions per call, the cost
model. Each takes [(path, document)] and the marker's options, and returns the table's lines."""

from __future__ import annotations

import statistics
from typing import Any

import _measured
from _tables_fmt import (
    DASH,
    SHORT,
    gbps,
    lib_name,
    parse_sizes,
    rate_name,
    ratio,
    size,
    span,
    t,
    t_pair,
    t_range,
    table,
)

Docs = list[tuple[str, dict[str, Any]]]
Opts = dict[str, str]


def allreduce(docs: Docs, opts: Opts) -> list[str]:
    """Libraries one after another: per size, each library's in-place time, pyring's algbw and
    each other library's time over pyring's."""
    (path, doc), = docs
    times: dict[str, dict[int, float]] = {}
    for p in _measured.load_points([path], "ip"):
        times.setdefault(p["cls"].split("-")[0], {})[p["size"]] = p["t"] * 1e6
    libs = [lib for lib in doc["results"] if lib in times]
    sizes = parse_sizes(opts["sizes"]) if "sizes" in opts else sorted(times["pyring"])
    head = ["size", f"pyring {doc.get('transport', 'shm')}", *(lib_name(x) for x in libs[1:]),
            "pyring algbw", *(f"vs {SHORT.get(x, x)}" for x in libs[1:])]
    rows = []
    for n in sizes:
        mine = times["pyring"].get(n)
        rows.append([size(n), *(t(times[x][n]) if n in times[x] else DASH for x in libs),
                     gbps(n / mine / 1e3) if mine else DASH,
                     *(f"{ratio(times[x][n] / mine)}×" if mine and n in times[x] else DASH
                       for x in libs[1:])])
    return table(head, rows)


def _runs(doc: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return doc.get("runs") or [doc["sizes"]]


def _entry(doc: dict[str, Any], n: int) -> dict[str, Any] | None:
    """The size's summary in the file's `sizes` (its last run, where it holds several)."""
    return next((e for e in doc["sizes"] if e["bytes"] == n), None)


def over_runs(doc: dict[str, Any], n: int, figure: str, lib: str) -> list[float]:
    """A figure ('median_us', 'median_ratio', ...) of one library at one size, per run."""
    return [e[figure][lib] for run in _runs(doc) for e in run
            if e["bytes"] == n and lib in e[figure]]


def sweeps(docs: Docs, opts: Opts) -> list[str]:
    """Taking turns, one column per file (its last run): pyring's time, VS/pyring and the
    largest fraction of a rank's bytes streamed into shm slots; then the file numbered
    `detail` gives pyring's algbw and every other library's X/pyring."""
    vs, label = opts.get("vs", "mpi"), opts.get("label", "run")
    k = int(opts.get("detail", "1"))
    ref = docs[k - 1][1]
    others = [x for x in ref["libs"] if x not in ("pyring", vs)]
    head = ["size", *(f"{label} {i}" for i in range(1, len(docs) + 1)),
            f"{label} {k} algbw", *(f"{SHORT.get(x, x)}/pyring" for x in others)]
    rows = []
    for n in parse_sizes(opts["sizes"]):
        cells = []
        for _, doc in docs:
            e = _entry(doc, n)
            cells.append(f"{t(e['median_us']['pyring'])}, {e['median_ratio'][vs]:.2f}, "
                         f"{max(e['pyring_streamed_fraction']):.2f}" if e else DASH)
        e = _entry(ref, n)
        rows.append([size(n), *cells, gbps(e["algbw_GBps"]["pyring"]),
                     *(ratio(e["median_ratio"][x]) for x in others)])
    return table(head, rows)


def ranges(docs: Docs, opts: Opts) -> list[str]:
    """Taking turns, the least and greatest over the files (and their runs) of each library's
    time, pyring's algbw and each X/pyring."""
    libs = [x for x in docs[0][1]["libs"] if x != "memcpy"]
    ratios = [x for x in docs[0][1]["libs"] if x != "pyring"]
    head = ["size", *(lib_name(x) for x in libs), "pyring algbw",
            *(f"{SHORT.get(x, x)}/pyring" for x in ratios)]
    rows = []
    for n in parse_sizes(opts["sizes"]):
        def every(figure: str, lib: str, n: int = n) -> list[float]:
            return [v for _, d in docs for v in over_runs(d, n, figure, lib)]
        bw = every("algbw_GBps", "pyring")
        rows.append([size(n), *(t_range(every("median_us", x)) for x in libs),
                     f"{span(bw, lambda x: f'{x:.1f}')} GB/s",
                     *(span(every("median_ratio", x)) for x in ratios)])
    return table(head, rows)


def algbw(docs: Docs, opts: Opts) -> list[str]:
    """Taking turns, one file: every library's algbw per size."""
    (_, doc), = docs
    head = ["size", *(lib_name(x) for x in doc["libs"])]
    rows = [[size(e["bytes"]), *(gbps(e["algbw_GBps"][x]) for x in doc["libs"])]
            for e in doc["sizes"]]
    return table(head, rows)


def hosts(docs: Docs, opts: Opts) -> list[str]:
    """Emulated hosts, a row per layout and rate: the tree's speed-up over the ring at the
    sizes `ring`, and over the ring and gloo at the sizes `gloo`."""
    (_, doc), = docs
    ring, gloo = parse_sizes(opts.get("ring", "")), parse_sizes(opts.get("gloo", ""))
    head = ["link, ranks", *(f"{size(n)} vs ring" for n in ring),
            *(f"{size(n)} vs ring / gloo" for n in gloo)]
    rows = []
    for run in doc["runs"]:
        sp = {r["size"]: r["speedup"] for r in run["rows"]}
        lay = run["layout"]
        rows.append([f"{rate_name(run['rate'])}, {len(lay)} × {lay[0]}",
                     *(f"{sp[n]['tree_vs_ring']:.2f}×" for n in ring),
                     *(f"{sp[n]['tree_vs_ring']:.2f}× / {sp[n]['tree_vs_gloo']:.2f}×"
                       for n in gloo)])
    return table(head, rows, "l" + "r" * (len(ring) + len(gloo)))


def algos(docs: Docs, opts: Opts) -> list[str]:
    """A column per file: auto's time against the best forced algorithm's, and their ratio."""
    head, by_size = ["size"], {}
    for i, (_, doc) in enumerate(docs):
        cores = doc["machine"]["cpu"]["usable_cores"]
        on = f" on {cores} cores" if doc["args"]["world"] > cores else ""
        head.append(f"{doc['args']['world']} ranks{on}, {doc['args']['seconds']:g} s per size: "
                    "auto / best forced")
        for r in doc["rows"]:
            best = min(v for k, v in r["time_us"].items() if k != "auto")
            by_size.setdefault(r["size"], {})[i] = (
                f"{t_pair(r['time_us']['auto'], best)} ({r['auto_over_best']:.3f})")
    sizes = parse_sizes(opts["sizes"]) if "sizes" in opts else sorted(by_size)
    rows = [[size(n), *(by_size.get(n, {}).get(i, DASH) for i in range(len(docs)))]
            for n in sizes]
    return table(head, rows, "l" + "r" * len(docs))


def callpath(docs: Docs, opts: Opts) -> list[str]:
    """A row per build: instructions per call on rank 0's calling thread, by layer."""
    rows = []
    for _, doc in docs:
        for b in doc["builds"].values():
            lay = {k: f"{round(v):,}" for k, v in b["layers"].items()}
            rows.append([f"`{b['sha']}`", lay["python"], lay["binding"], lay["core"],
                         f"{lay['exchange']} ({lay['kernels']}, {lay['polling']})",
                         lay["total"]])
    return table(["build", "python", "binding", "core", "exchange (kernels, polling)",
                  "total"], rows, "lrrrrr")


def costmodel(docs: Docs, opts: Opts) -> list[str]:
    """The fitted parameters of each link class and how far the fit misses."""
    (_, doc), = docs
    rows = []
    for cls, f in doc["fits"].items():
        p = f["params"]
        worst = max(f["points"], key=lambda q: abs(q["err"]))
        direct = (f"{p['alpha_d'] * 1e6:.1f} µs, {p['beta_d'] / 1e9:.2f} GB/s"
                  if p.get("beta_d") else DASH)
        rows.append([cls, f"{p['alpha'] * 1e6:.1f} µs",
                     f"{p['beta_c'] / 1e9:.2f} / {p['beta_m'] / 1e9:.2f} GB/s",
                     size(int(p["spill"])), direct,
                     f"{f['max_abs_err'] * 100:.1f}% ({size(worst['size'])})",
                     f"{f['max_abs_loo_err'] * 100:.0f}%",
                     f"{f['run_to_run_max_spread'] * 100:.0f}%"])
    return table(["class", "α (ring)", "β in cache / beyond S", "S", "direct α, β",
                  "max error in-sample", "leave-one-out", "runs differ by up to"],
                 rows, "lrrrrrrr")


def predictions(docs: Docs, opts: Opts) -> list[str]:
    """A row per topology: predicted training speedup (ring allreduce time) at `ranks`."""
    (_, doc), = docs
    ranks = [int(r) for r in opts["ranks"].split(",")]
    rows = []
    for topo, preds in doc["predictions"].items():
        at = {p["ranks"]: p for p in preds}
        rows.append([f"`{topo}`", *(f"{at[n]['speedup']:.1f} ({at[n]['allreduce_s'] * 1e3:.0f}"
                                    " ms)" for n in ranks)])
    return table(["topology", *(f"{n} ranks" for n in ranks)], rows, "l" + "r" * len(ranks))


def tree(docs: Docs, opts: Opts) -> list[str]:
    """A pair of columns per preset topology: predicted ring and tree times and the tree's
    speed-up, at `sizes`."""
    (_, doc), = docs
    preds = doc["tree"]["predictions"]
    head = ["size"]
    for name in preds:
        head += [f"{name.replace(' x ', ' × ')}: ring / tree", "speed-up"]
    rows = []
    for n in parse_sizes(opts["sizes"]):
        row = [size(n)]
        for p in preds.values():
            r = next(r for r in p["rows"] if r["size"] == n)
            row += [t_pair(r["ring_s"] * 1e6, r["tree_s"] * 1e6), f"{r['speedup']:.2f}×"]
        rows.append(row)
    return table(head, rows, "l" + "r" * (2 * len(preds)))


def median_over_runs(doc: dict[str, Any], n: int, figure: str, lib: str) -> float:
    return statistics.median(over_runs(doc, n, figure, lib))

