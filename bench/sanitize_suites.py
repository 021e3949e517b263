"""The multi-rank suites CI does not run under a sanitizer, run under it here, one suite at a
time, with each suite's outcome and reports written to JSON.

    python bench/sanitize_suites.py                      # TSan over the suites CI leaves out
    python bench/sanitize_suites.py --kind address,undefined --suites tests/test_p2p.py

CI (.ci/run) runs pyring/testing/sanitize.py's SUITES: the whole multi-rank set under
ASan+UBSan, and under TSan the part that drives every thread and lifetime. By default this
runs the rest of the set under TSan (``--kind thread``): the suites of SUITES["address,
undefined"] that SUITES["thread"] leaves out. Each suite runs through ``python -m
pyring.testing.sanitize`` with a report folder of its own; per suite it records the exit
status, pytest's summary line, the reports with a pyring frame (in full) and the count of the
others, and the time. Run from a checkout's root, as root for the partition suite's emulated
hosts, in a private /dev/shm if other pyring jobs run beside it. Exits non-zero when a suite
fails or a report is pyring's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import add_replace_flag, result_path
from machine import describe

from pyring.testing.sanitize import KINDS, SUITES, split_reports


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=KINDS, default="thread")
    ap.add_argument("--suites", nargs="*", default=None,
                    help="test files (default: the multi-rank set less CI's suites of --kind)")
    ap.add_argument("--timeout", type=float, default=3600, help="per suite, seconds")
    ap.add_argument("--out", default=None, help="JSON path (default: see --replace)")
    add_replace_flag(ap)
    args = ap.parse_args()
    suites = args.suites if args.suites is not None else \
        [s for s in SUITES["address,undefined"] if s not in SUITES.get(args.kind, ())]
    missing = [s for s in suites if not Path(s).is_file()]
    if missing:
        ap.error(f"--suites: no such file {missing} (run from a checkout's root)")
    tag = args.kind.replace(",", "_")
    out = str(result_path(f"sanitize_{tag}_suites_vm", args.out, args.replace))
    rows = []
    for suite in suites:
        with tempfile.TemporaryDirectory(prefix="pyring-sanitize-suite-") as reports:
            cmd = [sys.executable, "-m", "pyring.testing.sanitize", args.kind, "--reports",
                   reports, "--", sys.executable, "-P", "-m", "pytest", "-q",
                   "-p", "no:cacheprovider", suite]
            t0 = time.monotonic()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=args.timeout)
                rc, text = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as e:
                rc, text = None, f"{e.stdout or ''}{e.stderr or ''}"
            seconds = time.monotonic() - t0
            ours, others = split_reports(Path(reports))
        lines = [ln for ln in str(text).splitlines() if " passed" in ln or " failed" in ln
                 or " error" in ln]
        row = {"suite": suite, "exit": rc, "summary": lines[-1].strip("= ") if lines else "",
               "pyring_reports": ours, "other_reports": len(others),
               "seconds": round(seconds, 1), "tail": "" if rc == 0 else str(text)[-3000:]}
        rows.append(row)
        print(f"{suite}: exit {rc}, {row['summary']}, {len(ours)} pyring report(s), "
              f"{len(others)} elsewhere, {seconds:.0f} s", flush=True)
    ok = all(r["exit"] == 0 and not r["pyring_reports"] for r in rows)
    doc = {"machine": describe(), "command": " ".join(sys.argv), "kind": args.kind,
           "suites": rows, "ok": ok,
           "pyring_reports": sum(len(r["pyring_reports"]) for r in rows),
           "other_reports": sum(r["other_reports"] for r in rows)}
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {out}: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
