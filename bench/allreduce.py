"""Allreduce (float32, sum) benchmark: pyring vs torch gloo vs Open MPI on local ranks.

    python bench/allreduce.py [--world 2] [--libs pyring,gloo,mpi] [--transport shm|tcp]
                              [--min-bytes 4K] [--max-bytes 256M] [--iters N] [--warmup N]
                              [--segment-bytes N] [--out PATH] [--tag NAME]

Every library runs in its own W processes, one torch/BLAS thread each: pyring and gloo
ranks are spawned here and meet through a TCPStore on 127.0.0.1 held by this process;
MPI ranks are launched by `mpirun -np W`. Ranks report through per-rank JSON-lines
files (see _common.py), so the tables print as sizes complete. A library that is not
installed is skipped, one that fails or hangs (--timeout, --stall-timeout) is killed
and reported, and the others still run. Times: see _report.TIME_NOTE. torch gloo has no
out-of-place allreduce: its out-of-place time includes copying the input into out.

Writes bench/results/allreduce_<tag>_w<W>_<transport>.json (or --out) after every
library, and a PNG of busbw against size with the same stem.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shlex
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _report
import machine
from _launch import ForeignLoad, Ranks, child_env

BENCH_DIR = Path(__file__).resolve().parent
LIBS = ("pyring", "gloo", "mpi")
SKIP_RC = 3  # _common.SKIP_RC; not imported so this file stays importable without it


def parse_bytes(text: str) -> int:
    """'4096', '4K', '4KiB', '256M', '1G' -> bytes (binary multiples)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1)
    digits = t[:-1] if scale > 1 else t
    try:
        return int(digits) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r}") from None


def default_iters(nbytes: int) -> int:
    """Timed iterations per size and mode: ~1 GiB moved, between 5 and 500."""
    return max(5, min(500, 2**30 // nbytes))


def default_warmup(nbytes: int) -> int:
    """Untimed iterations per size and mode: a tenth of the timed ones, 2 to 20."""
    return max(2, min(20, default_iters(nbytes) // 10))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--world", type=int, default=2, help="ranks per library (default 2)")
    p.add_argument("--min-bytes", type=parse_bytes, default=4 * 2**10, help="default 4K")
    p.add_argument("--max-bytes", type=parse_bytes, default=256 * 2**20, help="default 256M")
    p.add_argument(
        "--iters",
        type=int,
        help="timed iterations per size and mode "
        "(default: 1 GiB / size, between 5 and 500: 500 up to 2 MiB, 5 at 256 MiB)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        help="untimed iterations per size and mode (default: a tenth of the default iters, 2-20)",
    )
    p.add_argument("--libs", default=",".join(LIBS), help="comma list of pyring,gloo,mpi")
    p.add_argument(
        "--transport",
        choices=("shm", "tcp"),
        default="shm",
        help="PYRING_TRANSPORT for the pyring ranks (default shm)",
    )
    p.add_argument(
        "--segment-bytes",
        type=parse_bytes,
        help="segment_bytes for pyring.init (default: pyring's own)",
    )
    p.add_argument("--out", type=Path, help="JSON path (PNG next to it)")
    p.add_argument("--tag", default=socket.gethostname(), help="file-name tag (default hostname)")
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds one library may take in all (default 600)",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=120.0,
        help="seconds without any rank reporting before a library is killed",
    )
    p.add_argument(
        "--mpirun-args",
        default="--bind-to none",
        help="extra mpirun arguments (default '--bind-to none', like the other libraries' ranks)",
    )
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.libs = [x.strip() for x in args.libs.split(",") if x.strip()]
    for lib in args.libs:
        if lib not in LIBS:
            p.error(f"unknown library {lib!r}; choose from {','.join(LIBS)}")
    if args.world < 1:
        p.error("--world must be >= 1")
    for name in ("min_bytes", "max_bytes"):
        v = getattr(args, name)
        if v < 4 or v & (v - 1):
            p.error(f"--{name.replace('_', '-')} must be a power of two >= 4, got {v}")
    if args.min_bytes > args.max_bytes:
        p.error("--min-bytes is larger than --max-bytes")
    if (args.iters is not None and args.iters < 1) or (args.warmup is not None and args.warmup < 0):
        p.error("--iters must be >= 1 and --warmup >= 0")
    return args


def _start(run: Ranks, args: argparse.Namespace, cfg: dict[str, Any], tmp: Path) -> Any:
    """Launches the ranks of run.lib; returns an object to keep alive (the store) or
    sets run.skip when the library cannot be launched at all."""
    if run.lib == "mpi":
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            run.skip = "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
            return None
        if importlib.util.find_spec("mpi4py") is None:
            run.skip = "mpi4py not importable (pip install mpi4py)"
            return None
        cfg_path = tmp / "mpi.json"
        cfg_path.write_text(json.dumps(cfg))
        cmd = [
            mpirun,
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            str(args.world),
            *shlex.split(args.mpirun_args),
            sys.executable,
            str(BENCH_DIR / "_mpi_worker.py"),
            str(cfg_path),
        ]
        print("# launch: " + shlex.join(cmd), flush=True)
        run.spawn(cmd, child_env({}), tmp / "mpi.log", BENCH_DIR.parent)
        return None

    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, None, True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
    )
    extra = {"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    if run.lib == "pyring":
        extra["PYRING_TRANSPORT"] = args.transport
    for r in range(args.world):
        cfg_path = tmp / f"{run.lib}.rank{r}.json"
        cfg_path.write_text(json.dumps({**cfg, "rank": r, "store_port": store.port}))
        cmd = [sys.executable, str(BENCH_DIR / "_torch_worker.py"), str(cfg_path)]
        run.spawn(cmd, child_env(extra), tmp / f"{run.lib}.rank{r}.log", BENCH_DIR.parent)
    print(
        f"# launch: {args.world} x {shlex.join(cmd[:2])} (TCPStore 127.0.0.1:{store.port}"
        + (f", PYRING_TRANSPORT={args.transport}" if run.lib == "pyring" else "")
        + ")",
        flush=True,
    )
    return store


def run_library(lib: str, args: argparse.Namespace, sizes: list[int], tmp: Path) -> dict:
    """Runs one library to completion, failure or timeout; never raises for a rank's fault."""
    result_dir = tmp / lib
    result_dir.mkdir()
    cfg = {
        "lib": lib,
        "world": args.world,
        "sizes": sizes,
        "result_dir": str(result_dir),
        "iters": [args.iters or default_iters(s) for s in sizes],
        "warmup": [default_warmup(s) if args.warmup is None else args.warmup for s in sizes],
        "segment_bytes": args.segment_bytes,
    }
    title = f"W={args.world}" + (f", transport={args.transport}" if lib == "pyring" else "")
    if lib == "pyring" and args.segment_bytes:
        title += f", segment_bytes={args.segment_bytes}"
    print(f"\n# ===== {lib} ({title})", flush=True)
    run = Ranks(lib, args.world, result_dir)
    load_before, foreign = os.getloadavg(), ForeignLoad()
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    status, reason, last_progress, header_done = "ok", "", time.monotonic(), False

    def emit_rows() -> None:
        nonlocal header_done
        while all(len(r) > len(rows) for r in run.rows):
            if not header_done:
                print(_report.table_header(lib, title), flush=True)
                header_done = True
            row = _report.aggregate_row([r[len(rows)] for r in run.rows], args.world)
            rows.append(row)
            print(_report.table_row(row), flush=True)

    try:
        keep = _start(run, args, cfg, tmp)
        while run.procs:
            if run.read():
                last_progress = time.monotonic()
            emit_rows()
            run.sample_cpu()
            codes = [p.poll() for p in run.procs]
            now = time.monotonic()
            if run.skip is not None:
                status = "skipped"
            elif run.errors or any(c not in (None, 0) for c in codes):
                status = "error"
            elif all(c is not None for c in codes):
                break
            elif now - t0 > args.timeout:
                status, reason = "timeout", f"took more than --timeout {args.timeout:g} s"
            elif now - last_progress > args.stall_timeout:
                reason = f"no progress for --stall-timeout {args.stall_timeout:g} s"
                status = "timeout"
            if status != "ok":
                time.sleep(0.5)  # let the failing rank finish writing its record
                run.kill()
                break
            time.sleep(0.1)
        run.read()
        emit_rows()
        del keep
    except BaseException:  # our own failure or Ctrl-C: no rank may outlive this call
        run.kill()
        raise
    error = None
    if run.skip is not None:
        status = "skipped"
        hint = " (install it, or put an in-place build on PYTHONPATH)" if lib == "pyring" else ""
        print(f"# {lib}: SKIPPED: {run.skip}{hint}", flush=True)
    elif status == "ok" and len(rows) < len(sizes):
        status = "error"
    wrong = sum(r[m]["wrong"] for r in rows for m in ("oop", "ip"))
    if status == "ok" and wrong:
        status = "wrong"  # finished, but some results were not W(W+1)/2
    if status in ("error", "timeout"):
        codes = [p.returncode for p in run.procs]
        parts = [reason] if status == "timeout" else []
        parts += run.errors or [f"exit codes {codes}"]
        error = "\n".join(parts)
        print(
            f"# {lib}: FAILED ({status}) after {len(rows)}/{len(sizes)} sizes:\n{error}",
            file=sys.stderr,
            flush=True,
        )
        print(run.log_tail(), file=sys.stderr, flush=True)
    if rows:
        print(_report.table_footer(rows), flush=True)
    elapsed = time.monotonic() - t0
    load = foreign.stop(run)
    print(f"# {lib}: {status}, {elapsed:.1f} s", flush=True)
    if load["foreign_share"] > 0.05 and load["foreign_user_cpu_s"] > 0.5:
        print(
            f"# WARNING: other processes used {load['foreign_user_cpu_s']:.1f} CPU-s "
            f"({100 * load['foreign_share']:.0f}% of the machine) while {lib} ran: "
            "its timings are not trustworthy",
            flush=True,
        )
    return {
        "status": status,
        "error": error,
        "skip_reason": run.skip,
        "seconds": round(elapsed, 2),
        "wrong_total": wrong,
        "loadavg_before_after": [load_before, os.getloadavg()],
        "foreign_load": load,
        "info": run.info.get(0),
        "config": {k: cfg[k] for k in ("iters", "warmup")},
        "rows": rows,
    }


def default_out(args: argparse.Namespace) -> Path:
    tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in args.tag)
    return BENCH_DIR / "results" / f"allreduce_{tag}_w{args.world}_{args.transport}.json"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = []
    s = args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= 2
    out = args.out or default_out(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    desc = machine.describe()
    cpu, pk = desc["cpu"], desc["packages"]
    print(
        f"# allreduce float32 sum, W={args.world}, {len(sizes)} sizes "
        f"{_report.human_bytes(sizes[0])}..{_report.human_bytes(sizes[-1])}, libs "
        f"{','.join(args.libs)}"
    )
    print(
        f"# {cpu['model']}, {cpu['usable_cores']} cores, {desc['memory']['total_gib']} GiB; "
        f"python {desc['python']['version']}, torch {pk['torch']}, mpi4py {pk['mpi4py']}, "
        f"{desc['open_mpi']}",
        flush=True,
    )
    doc: dict[str, Any] = {
        "benchmark": "allreduce",
        "command": shlex.join([sys.executable, *sys.argv]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "started_at": started.isoformat(),
        "world": args.world,
        "transport": args.transport,
        "dtype": "float32",
        "op": "sum",
        "timing": _report.TIME_NOTE,
        "gloo_out_of_place": "copy into out + in-place all_reduce, both timed",
        "machine": desc,
        "results": {},
    }
    tmp = Path(tempfile.mkdtemp(prefix="pyring-bench-"))
    failed = False
    for lib in args.libs:
        try:
            res = run_library(lib, args, sizes, tmp)
        except Exception as e:  # launching itself failed: report, go on with the others
            res = {"status": "error", "error": f"{type(e).__name__}: {e}", "rows": []}
            print(f"# {lib}: FAILED to launch: {res['error']}", file=sys.stderr, flush=True)
        failed |= res["status"] in ("error", "timeout", "wrong")
        doc["results"][lib] = res
        doc["finished_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
        out.write_text(json.dumps(doc, indent=1) + "\n")
    print("\n" + _report.summary(doc["results"]))
    print(f"# json: {out}")
    if not args.no_plot and any(r["rows"] for r in doc["results"].values()):
        png = out.with_suffix(".png")
        pyring_note = f", pyring transport={args.transport}" if "pyring" in args.libs else ""
        title = (
            f"allreduce float32 sum, W={args.world}{pyring_note}"
            f" - {cpu['model']}, {cpu['usable_cores']} cores"
        )
        err = _report.plot(doc["results"], str(png), title)
        print(f"# {err}" if err else f"# png: {png}")
    if failed:
        bad = [f"{lib}: {r['status']}" for lib, r in doc["results"].items() if r["status"] != "ok"]
        print(f"# NOT OK: {', '.join(bad)}; rank logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
