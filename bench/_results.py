"""Where a benchmark writes its JSON. The files under bench/results/ are the ones the docs cite;
a run replaces one only when asked (--replace, or an explicit --out). Otherwise it writes
bench/results/runs/NAME-DATE-TIME.json, a name of its own in a folder git ignores, so that
running a documented command never changes a cited figure or dirties the tree."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = RESULTS / "runs"


def add_replace_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replace", action="store_true",
                        help="write bench/results/NAME.json, the file the docs cite, replacing "
                             "it (default: bench/results/runs/NAME-DATE-TIME.json, ignored by "
                             "git)")


def result_path(name: str, out: str | Path | None = None, replace: bool = False) -> Path:
    """`out` when given; bench/results/NAME.json with `replace`; else a new file under
    bench/results/runs/ (made if missing)."""
    if out:
        return Path(out)
    if replace:
        return RESULTS / f"{name}.json"
    RUNS.mkdir(parents=True, exist_ok=True)
    return RUNS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
