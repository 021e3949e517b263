#!/usr/bin/env python
"""A reproducible busy machine: background load that the allreduce harness runs under, the
same for every library in one run, and the memcpy rate that shows what it does.

    python bench/busy.py --load membw --seconds 10     # run a load and print memcpy rates
    python bench/busy.py --load none                    # the quiet rate, for comparison

Loads (one process per core, each at nice 19, so that a collective's threads win the core
whenever they want it, as on a shared cloud machine where a neighbour trains):
  cpu     a tight arithmetic loop: the cores stay busy, the memory system quiet;
  membw   copies between two 64 MiB buffers (larger than the last-level cache): the memory
          bus and the shared cache stay saturated;
  mixed   half the processes of each.
Use as a context manager from Python: ``with Load("membw"): ...``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import time
from typing import Any

LOADS = ("none", "cpu", "membw", "mixed")
HOG_BYTES = 64 << 20


def _hog(kind: str, stop: Any) -> None:
    os.nice(19)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if kind == "cpu":
        x = 1
        while not stop.is_set():
            for _ in range(100_000):
                x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        return
    import numpy as np

    a = np.ones(HOG_BYTES // 8)
    b = np.empty_like(a)
    while not stop.is_set():
        np.copyto(b, a)
        np.copyto(a, b)


class Load:
    """The background load `kind` while the block runs: one process per core (or `procs`)."""

    def __init__(self, kind: str, procs: int | None = None) -> None:
        if kind not in LOADS:
            raise ValueError(f"load {kind!r}: valid are {', '.join(LOADS)}")
        self.kind = kind
        self.procs = procs or len(os.sched_getaffinity(0))
        self._stop: Any = None
        self._ps: list = []

    def __enter__(self) -> Load:
        if self.kind == "none":
            return self
        ctx = mp.get_context("fork")
        self._stop = ctx.Event()
        kinds = [self.kind] * self.procs
        if self.kind == "mixed":
            kinds = ["cpu" if i % 2 else "membw" for i in range(self.procs)]
        self._ps = [ctx.Process(target=_hog, args=(k, self._stop), daemon=True) for k in kinds]
        for p in self._ps:
            p.start()
        time.sleep(0.5)  # the hogs reach their pace
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stop is not None:
            self._stop.set()
        for p in self._ps:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        self._ps = []

    def describe(self) -> dict[str, Any]:
        return {"load": self.kind, "processes": 0 if self.kind == "none" else self.procs,
                "nice": 19, "hog_bytes": HOG_BYTES if self.kind in ("membw", "mixed") else 0}


def memcpy_gbps(nbytes: int = 64 << 20, reps: int = 5) -> float:
    """The best of `reps` copies of `nbytes` in this process, in GB/s."""
    import numpy as np

    a = np.ones(nbytes // 8)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--load", choices=LOADS, default="membw")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--procs", type=int, default=None)
    args = p.parse_args()
    quiet = memcpy_gbps()
    with Load(args.load, args.procs):
        rates = []
        end = time.perf_counter() + args.seconds
        while time.perf_counter() < end:
            rates.append(memcpy_gbps())
    rates.sort()
    print(f"memcpy 64 MiB: quiet {quiet:.1f} GB/s; under {args.load}: median "
          f"{rates[len(rates) // 2]:.1f} GB/s (min {rates[0]:.1f}, max {rates[-1]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
