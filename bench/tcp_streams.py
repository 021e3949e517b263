#!/usr/bin/env python
"""The same bare exchange of S bytes each way between two processes over loopback TCP, in the
variants of bench/tcp_streams.c: 1, 2 and 4 connections with a thread each, and vmsplice +
splice sends, rounds taken in turn. It answers what a faster tcp path could gain on this
machine; the allreduce itself beside this ceiling is `python bench/allreduce.py --transport tcp
--libs pyring,gloo,tcp`.

    python bench/tcp_streams.py --bytes 64M --rounds 15

Needs a C compiler. Writes bench/results/tcp_streams_<tag>.json with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import add_replace_flag, result_path  # noqa: E402
from machine import describe

from pyring.config import parse_bytes

BENCH = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", default="64M", help="whole MiB")
    ap.add_argument("--rounds", type=int, default=15, help="at most 64")
    ap.add_argument("--tag", default="vm")
    add_replace_flag(ap)
    args = ap.parse_args()
    nbytes = parse_bytes(args.bytes, "--bytes")
    with tempfile.TemporaryDirectory() as tmp:
        exe = str(Path(tmp) / "tcp_streams")
        subprocess.run(["cc", "-O2", "-pthread", str(BENCH / "tcp_streams.c"), "-o", exe],
                       check=True)
        out = subprocess.run([exe, str(max(1, nbytes >> 20)), str(min(args.rounds, 64))],
                             check=True, capture_output=True, text=True, timeout=600).stdout
    variants = [json.loads(line) for line in out.splitlines() if line.strip()]
    for v in variants:
        print(f"{v['variant']:>9} x{v['streams']}  {v['mean_ms']:8.2f} ms mean, "
              f"{v['best_ms']:.2f} best ({variants[0]['mean_ms'] / v['mean_ms']:.2f}x the rate "
              f"of one stream's send/recv)")
    path = result_path(f"tcp_streams_{args.tag}", None, args.replace)
    path.write_text(json.dumps({"benchmark": "tcp_streams", "machine": describe(),
                                "command": ["python", "bench/tcp_streams.py", *sys.argv[1:]],
                                "bytes": nbytes, "rounds": args.rounds,
                                "variants": variants}, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
