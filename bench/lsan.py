#!/usr/bin/env python
"""LeakSanitizer over pyring's native code: 2 ranks of the soak's verified mix of every
collective (bench/_soak_mix.py) on an AddressSanitizer build, communicators created and
destroyed as an elastic job does, and the native parsers' fuzzer.

    python bench/lsan.py                          # HEAD, 2000 calls per rank
    python bench/lsan.py --calls 200 --fuzz-runs 10000

The build: --ref exported and built with -fsanitize=address into build/lsan/ (bench/_build.py).
The job runs under LD_PRELOAD of the compiler's libasan (and libstdc++) with detect_leaks=1,
each process writing its report to a file of its own. Python and torch leave allocations of
their own at exit, so a leak counts as pyring's when a frame of its allocation stack is in
pyring's extension (its _C module); the others are counted apart. The fuzzer (libFuzzer with
AddressSanitizer, pyring/testing/native_fuzz.py) checks leaks itself. Target: 0 leaks of
pyring's in both. Writes bench/results/lsan_<tag>.json with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _build import build, check_needs
from _results import add_replace_flag, result_path  # noqa: E402
from machine import describe

from pyring.testing.native_fuzz import Unavailable, seeds
from pyring.testing.native_fuzz import build as build_fuzzer

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
ASAN_OPTIONS = ("detect_leaks=1:verify_asan_link_order=0:detect_odr_violation=0:"
                "new_delete_type_mismatch=0:alloc_dealloc_mismatch=0:halt_on_error=0:"
                "fast_unwind_on_malloc=0:malloc_context_size=30")
JOB = """
import sys
from pyring.launch import run_ranks
from _lsan_rank import rank
print(run_ranks(2, rank, int(sys.argv[1]), int(sys.argv[2]), timeout=3600))
"""


def leaks(report_dir: str) -> tuple[list[str], int, int]:
    """(pyring's leak reports, their bytes, the bytes of every other leak) in report_dir."""
    ours, our_bytes, other_bytes = [], 0, 0
    for name in sorted(os.listdir(report_dir)):
        text = Path(report_dir, name).read_text(errors="replace")
        for block in re.split(r"\n(?=(?:Direct|Indirect) leak of )", text):
            m = re.match(r"(?:Direct|Indirect) leak of (\d+) byte", block)
            if not m:
                continue
            stack = block.split("\n\n")[0]
            if "_C.cpython" in stack or "pyring::" in stack:
                ours.append(stack[:3000])
                our_bytes += int(m.group(1))
            else:
                other_bytes += int(m.group(1))
    return ours, our_bytes, other_bytes


def run_job(pkg: Path, calls: int, cycles: int) -> dict:
    # libstdc++ beside the runtime: with libasan alone, ASan's __cxa_throw interceptor finds no
    # real one and aborts the process at the first C++ exception (a CommError, torch's checks).
    preload = " ".join(subprocess.check_output(["g++", f"-print-file-name={lib}"], text=True)
                       .strip() for lib in ("libasan.so", "libstdc++.so.6"))
    with tempfile.TemporaryDirectory(prefix="pyring-lsan-") as tmp:
        env = dict(os.environ, LD_PRELOAD=preload, PYTHONPATH=f"{pkg}{os.pathsep}{BENCH}",
                   ASAN_OPTIONS=f"{ASAN_OPTIONS}:log_path={tmp}/report",
                   PYTHONMALLOC="malloc")
        proc = subprocess.run([sys.executable, "-c", JOB, str(calls), str(cycles)], env=env,
                              capture_output=True, text=True, timeout=3600, cwd=tmp)
        ours, our_bytes, other_bytes = leaks(tmp)
        reports = len(os.listdir(tmp))
    return {"exit_code": proc.returncode, "ranks": proc.stdout.strip()[-2000:],
            "stderr_tail": proc.stderr[-3000:], "report_files": reports,
            "pyring_leaks": len(ours), "pyring_leak_bytes": our_bytes,
            "other_leak_bytes": other_bytes, "pyring_leak_reports": ours[:20]}


def run_fuzzer(runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="pyring-lsan-fuzz-") as tmp:
        try:
            exe = build_fuzzer(tmp, str(ROOT))
        except Unavailable as e:
            return {"skipped": str(e)}
        corpus = Path(tmp, "corpus")
        corpus.mkdir()
        for name, data in seeds().items():
            (corpus / name).write_bytes(data)
        proc = subprocess.run([exe, f"-runs={runs}", "-detect_leaks=1", "-seed=1", str(corpus)],
                              capture_output=True, text=True, timeout=3600, cwd=tmp,
                              env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1"))
    done = re.search(r"Done (\d+) runs", proc.stderr)
    return {"runs": int(done.group(1)) if done else 0, "exit_code": proc.returncode,
            "leak_reports": proc.stderr.count("LeakSanitizer"), "stderr_tail": proc.stderr[-1500:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="HEAD")
    ap.add_argument("--calls", type=int, default=2000, help="collectives per rank")
    ap.add_argument("--cycles", type=int, default=20,
                    help="communicators created and destroyed per rank before the mix")
    ap.add_argument("--fuzz-runs", type=int, default=100_000)
    ap.add_argument("--tag", default="vm")
    ap.add_argument("--out", default=None)
    add_replace_flag(ap)
    args = ap.parse_args()
    check_needs("bench/lsan.py")
    pkg = build(args.ref, ROOT / "build" / "lsan", build_type="Debug",
                flags=("-fsanitize=address", "-fno-omit-frame-pointer", "-O1", "-g"),
                tag="-asan")
    job = run_job(pkg, args.calls, args.cycles)
    print(f"job: exit {job['exit_code']}, {job['report_files']} report files, "
          f"{job['pyring_leaks']} leaks of pyring's ({job['pyring_leak_bytes']} bytes), "
          f"{job['other_leak_bytes']} bytes left by Python and torch", flush=True)
    fuzz = run_fuzzer(args.fuzz_runs) if args.fuzz_runs > 0 else {"skipped": "--fuzz-runs 0"}
    print(f"fuzzer: {fuzz}"[:300], flush=True)
    passed = job["exit_code"] == 0 and job["pyring_leaks"] == 0 and \
        ("skipped" in fuzz or (fuzz["exit_code"] == 0 and fuzz["leak_reports"] == 0))
    out = result_path(f"lsan_{args.tag}", args.out, args.replace)
    out.write_text(json.dumps({"benchmark": "lsan", "machine": describe(),
                               "command": ["python", "bench/lsan.py", *sys.argv[1:]],
                               "asan_options": ASAN_OPTIONS, "calls": args.calls,
                               "cycles": args.cycles, "job": job, "fuzzer": fuzz,
                               "passed": passed}, indent=1) + "\n")
    print(f"# json: {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
