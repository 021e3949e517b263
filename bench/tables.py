#!/usr/bin/env python
"""The results tables of README.md and docs/*.md, rendered from bench/results/*.json, so that a
table never disagrees with its file.

    python bench/tables.py            # rewrite every marked table in place
    python bench/tables.py --check    # change nothing; exit 1 naming each table that differs

A generated table sits between two markers, the whole table (header too) generated:

    <!-- table: bench/results/FILE.json [FILE.json ...] [VIEW] [KEY=VALUE ...] -->
    | ... |
    <!-- /table -->

Paths are relative to the repository root. The files' format (told from their keys, not their
names) picks the renderer, and VIEW one of its others (RENDERERS lists them); KEY=VALUE are its
options, such as sizes=4K,1M,64M. A marker whose file is missing, whose format no renderer
knows, or whose renderer fails on its file is an error, named like a table that differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _tables_comm as comm
import _tables_train as train
from _tables_fmt import lib_name, parse_sizes, rate_name, ratio, size, span, t, t_range, table

ROOT = Path(__file__).resolve().parents[1]
START = re.compile(r"^(?P<indent>[ \t]*)<!-- table: (?P<args>.*?) -->[ \t]*$")
END = re.compile(r"^[ \t]*<!-- /table -->[ \t]*$")

Docs = list[tuple[str, dict[str, Any]]]
Renderer = Callable[[Docs, dict[str, str]], list[str]]


def kind(doc: Any) -> str | None:
    """The format of a results file: which script (and which of its versions) wrote it."""
    if not isinstance(doc, dict):
        return None
    if "benchmarks" in doc and "machine_info" in doc:
        return "kernels"  # pytest-benchmark's --benchmark-json
    sizes = doc.get("sizes")
    if isinstance(sizes, list) and sizes and "median_ratio" in sizes[0]:
        return "interleaved"  # allreduce.py's turns (and interleaved.py's before it)
    bench = doc.get("benchmark") or doc.get("bench")
    if bench == "allreduce" and "results" in doc:
        return "allreduce"  # the libraries one after another
    if bench in ("hosts", "algos", "callpath", "costmodel", "training", "scaling", "staging"):
        return bench
    for key, name in (("baseline_spread", "convergence"), ("medians", "p2p"),
                      ("speedup_to_target_vs_ddp_gloo", "slowlink"), ("kill_trials", "soak")):
        if key in doc:
            return name
    return None


def summary(docs: Docs, opts: dict[str, str]) -> list[str]:
    """The README's table, one claim a row, each cell linking to its files. Of the files:
    interleaved ones with one run are sweeps (pyring, Open MPI, gloo and memcpy at size `big`);
    with several, the quiet runs (a row per size of `sizes`: the median over runs, and the
    runs where pyring is ahead of every other library); one under a `membw` load adds its
    median to each row; hosts: the tree against the ring at the rate `rate` from `from` up;
    convergence: OneBitAdam's fewest bytes within the baseline's spread; staging: the device
    all_reduce over its parts."""
    page = Path(opts["@page"]).parent

    def link(label: str, path: str) -> str:
        return f"[{label}]({os.path.relpath(ROOT / path, ROOT / page)})"

    def links(paths: list[str]) -> str:
        return ", ".join(link(str(i), p) for i, p in enumerate(paths, 1))

    of: dict[str, Docs] = {}
    for path, doc in docs:
        k = kind(doc)
        if k == "interleaved":
            k = ("loaded" if (doc.get("load") or {}).get("load") == "membw"
                 else "quiet" if len(doc.get("runs") or []) > 1 else "sweep")
        of.setdefault(k, []).append((path, doc))
    rows = []
    loaded = of.get("loaded", [(None, None)])[0]
    for path, doc in of.get("quiet", []):
        runs = len(doc["runs"])
        for n in parse_sizes(opts.get("sizes", "4K")):
            mine = comm.median_over_runs(doc, n, "median_us", "pyring")
            others = [x for x in doc["libs"] if not x.startswith("pyring")]  # peers only
            ahead = sum(all(e["median_ratio"][x] > 1 for x in others)
                        for run in doc["runs"] for e in run if e["bytes"] == n)
            vs = {x: comm.median_over_runs(doc, n, "median_ratio", x) for x in others}
            cell = f"{t(mine)}, the median of {runs} runs"
            ahead_of = [f"{lib_name(x)} ({ratio(r)}×)" for x, r in vs.items() if r > 1]
            if ahead_of:
                cell += f"; ahead of {_join(ahead_of)}"
            behind = [f"{lib_name(x)}'s {t(comm.median_over_runs(doc, n, 'median_us', x))}"
                      for x, r in vs.items() if r <= 1]
            if behind:
                cell += f"; behind {_join(behind)}"
            cell += f"; ahead of every other library in {ahead} of {runs} runs"
            files = [link("quiet", path)]
            if loaded[1] and comm.over_runs(loaded[1], n, "median_us", "pyring"):
                under = comm.median_over_runs(loaded[1], n, "median_us", "pyring")
                cell += f"; {t(under)} under a memory-bandwidth load"
                files.append(link("loaded", loaded[0]))
            rows.append([f"2-rank allreduce, {size(n)}, shm", f"{cell} ({', '.join(files)})"])
    if "sweep" in of:
        sweeps, n = of["sweep"], parse_sizes(opts.get("big", "64M"))[0]
        entries = [comm.over_runs(d, n, "median_us", "pyring") for _, d in sweeps]

        def every(lib: str) -> list[float]:
            return [v for _, d in sweeps for v in comm.over_runs(d, n, "median_ratio", lib)]
        rows.append([f"2-rank allreduce, {size(n)}, shm, {len(sweeps)} sweeps",
                     f"{t_range(v for e in entries for v in e)}; "
                     f"{span(every('mpi'), ratio)}× faster than Open MPI, "
                     f"{span(every('gloo'), ratio)}× gloo, {span(every('memcpy'), ratio)} of "
                     f"the speed of both ranks' memcpy ({links([p for p, _ in sweeps])})"])
    for path, doc in of.get("hosts", []):
        lo, rate = parse_sizes(opts.get("from", "32M"))[0], opts.get("rate", "1gbit")
        sp = [(r["size"], r["speedup"]["tree_vs_ring"]) for run in doc["runs"]
              if run["rate"] == rate for r in run["rows"] if r["size"] >= lo]
        hosts = len(doc["runs"][0]["layout"])
        rows.append([f"tree against ring, {hosts} hosts over {rate_name(rate)}, "
                     f"{size(min(n for n, _ in sp))}–{size(max(n for n, _ in sp))}",
                     f"{span((x for _, x in sp), lambda x: f'{x:.2f}')}× "
                     f"({link(Path(path).name, path)})"])
    if "convergence" in of:
        cells = []
        for path, doc in of["convergence"]:
            held = [v["bytes_ratio_vs_baseline"] for k, v in doc["summary"].items()
                    if k.startswith("onebit_adam") and v["loss_within_baseline_spread"]]
            cells.append(f"{max(held):.1f}× fewer bytes ({doc['task']}, "
                         f"{link(Path(path).name, path)})" if held else
                         f"none ({doc['task']}, {link(Path(path).name, path)})")
        rows.append(["OneBitAdam at the float32 baseline's loss", "; ".join(cells)])
    if "staging" in of:
        st = of["staging"]
        rows.append([f"device all_reduce on the sim device, {size(st[0][1]['bytes'])}",
                     "copies overlap the exchange: "
                     f"{span(d['median_device_over_sum'] for _, d in st)} of the parts one "
                     f"after another ({links([p for p, _ in st])})"])
    return table(["what", "result"], rows)


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# (format, VIEW or None for the default) -> renderer; the summary takes files of every format
RENDERERS: dict[tuple[str | None, str | None], Renderer] = {
    ("allreduce", None): comm.allreduce,
    ("interleaved", "sweeps"): comm.sweeps, ("interleaved", "ranges"): comm.ranges,
    ("interleaved", "algbw"): comm.algbw,
    ("hosts", None): comm.hosts, ("algos", None): comm.algos, ("callpath", None): comm.callpath,
    ("costmodel", None): comm.costmodel, ("costmodel", "predictions"): comm.predictions,
    ("costmodel", "tree"): comm.tree,
    ("training", None): train.step, ("training", "phases"): train.phases,
    ("scaling", None): train.scaling, ("p2p", None): train.p2p,
    ("convergence", None): train.convergence, ("slowlink", None): train.slowlink,
    ("kernels", None): train.kernels, ("soak", None): train.soak,
    (None, "summary"): summary,
}


def render(args: str, page: str) -> list[str]:
    """The table of a marker's arguments on page (its path from the root, which renderers see
    as the option '@page'); ValueError says why there is none."""
    files, view, opts = [], None, {"@page": page}
    for tok in shlex.split(args):
        if tok.endswith(".json"):
            files.append(tok)
        elif "=" in tok:
            key, _, value = tok.partition("=")
            opts[key] = value
        elif view is None:
            view = tok
        else:
            raise ValueError(f"two views, {view} and {tok}")
    if not files:
        raise ValueError("no results file")
    docs = []
    for f in files:
        if not (ROOT / f).is_file():
            raise ValueError(f"{f} is missing")
        docs.append((f, json.loads((ROOT / f).read_text())))
    kinds = {kind(d) for _, d in docs}
    fn = RENDERERS.get((None, view))
    if fn is None:
        if len(kinds) > 1:
            raise ValueError(f"files of different formats: {' '.join(files)}")
        k = kinds.pop()
        fn = RENDERERS.get((k, view))
        if fn is None:
            raise ValueError(f"no renderer knows the format of {' '.join(files)}" if k is None
                             else f"no {view or 'default'} view of {k} files: {' '.join(files)}")
    try:
        return fn(docs, opts)
    except (KeyError, IndexError, TypeError, ValueError, StopIteration) as e:
        raise ValueError(f"cannot render {' '.join(files)}: {type(e).__name__} {e}") from e


def process(page: Path) -> tuple[str, list[str], list[str]]:
    """The page with every marked table rendered; a line per table that differed, and a line
    per marker that could not be rendered (its table kept as it was)."""
    rel = page.relative_to(ROOT).as_posix()
    lines = page.read_text().split("\n")
    out, stale, errors, i = [], [], [], 0
    while i < len(lines):
        m = START.match(lines[i])
        out.append(lines[i])
        i += 1
        if not m:
            continue
        j = i
        while j < len(lines) and not END.match(lines[j]) and not START.match(lines[j]):
            j += 1
        if j == len(lines) or not END.match(lines[j]):
            errors.append(f"{rel}:{i}: table marker without <!-- /table -->")
            continue
        old = lines[i:j]
        try:
            new = [m["indent"] + row for row in render(m["args"], rel)]
        except ValueError as e:
            errors.append(f"{rel}:{i}: {e}")
            new = old
        if new != old:
            stale.append(f"{rel}:{i}: table differs from {m['args']}")
        out += new
        i = j
    return "\n".join(out), stale, errors


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 naming each table that differs from its file")
    args = ap.parse_args(argv)
    failed = False
    checked = tables = 0
    for page in pages():
        text, stale, errors = process(page)
        checked += 1
        tables += text.count("<!-- table:")
        for line in errors + (stale if args.check else []):
            print(line, file=sys.stderr)
        failed |= bool(errors) or (args.check and bool(stale))
        if not args.check and stale:
            page.write_text(text)
            print(f"rewrote {len(stale)} table(s) in {page.relative_to(ROOT)}")
    if args.check:
        print(f"checked {tables} generated table(s) in {checked} page(s): "
              f"{'some differ (above)' if failed else 'all match their JSON files'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
