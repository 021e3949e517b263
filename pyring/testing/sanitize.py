"""Runs a command with pyring's native code built under sanitizers, and counts their reports.

    python -m pyring.testing.sanitize address,undefined -- python -P -m pytest tests/test_p2p.py
    python -m pyring.testing.sanitize thread -- python -P -m pytest tests/test_p2p.py

KIND is CMake's PYRING_SANITIZE: ``address,undefined`` (ASan and UBSan), ``undefined`` or
``thread`` (TSan). The source tree (``--source``, default: the working directory, a checkout)
is built with it into ``--build`` (default ``~/.cache/pyring-sanitize/KIND-HASH``, HASH naming
the source tree's path; kept, and rebuilt incrementally; a build folder configured from another
source tree is emptied first, as CMake refuses to reuse it), beside a package of the tree's
``pyring/`` with that build's core. The command then runs with:

- ``PYTHONPATH``: that package first (``python -P`` keeps the working directory's source tree,
  which has no built core, off ``sys.path``);
- ``LD_PRELOAD``: the compiler's runtime for KIND (CPython and torch are not built with it, so
  it must be loaded first) and libstdc++ (ASan's exception interceptor needs the real one
  loaded beside it);
- ``ASAN_OPTIONS``, ``UBSAN_OPTIONS``, ``TSAN_OPTIONS``: reports written under a report
  folder, one file per process, and the suppressions of ``sanitize_asan.supp``,
  ``sanitize_tsan.supp`` and ``sanitize_ubsan.supp`` (code outside pyring only, each saying
  why).

Every process the command starts (rank processes, their children) inherits all of this. A
report with a frame in pyring's code (``pyring::``, or the module ``_C.cpython``) is pyring's;
the others (CPython's, torch's) are counted apart. Exit status: the command's, else 3 when
pyring has a report; the reports are printed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

KINDS = ("address,undefined", "undefined", "thread")
# The suites CI runs under each kind (.ci/run reads them here): on ASan+UBSan the multi-rank
# set; on TSan, about 3 times as slow, the part that drives every thread and lifetime (the p2p
# thread, callbacks and futures into Python, aborts racing the progress thread, a dead store,
# collectives in flight across steps). bench/sanitize_suites.py runs the rest under TSan.
SUITES = {
    "address,undefined": (
        "tests/test_collectives.py", "tests/test_p2p.py", "tests/test_backend.py",
        "tests/test_hooks.py", "tests/test_optim.py", "tests/test_staleness.py",
        "tests/test_parameter_server.py", "tests/test_sim_streams.py", "tests/test_errors.py",
        "tests/test_hang.py", "tests/test_torch_errors.py", "tests/test_wire_async.py",
        "tests/test_symmetric.py", "tests/test_store_death.py", "tests/test_partition.py"),
    "thread": (
        "tests/test_p2p.py", "tests/test_hooks.py", "tests/test_wire_async.py",
        "tests/test_errors.py", "tests/test_hang.py", "tests/test_store_death.py",
        "tests/test_staleness.py"),
}
ASAN_SUPPRESSIONS = Path(__file__).with_name("sanitize_asan.supp")
TSAN_SUPPRESSIONS = Path(__file__).with_name("sanitize_tsan.supp")
UBSAN_SUPPRESSIONS = Path(__file__).with_name("sanitize_ubsan.supp")
# Leaks are bench/lsan.py's (CPython leaves its own at exit); ODR and allocator checks trip on
# the extension modules' private copies of libstdc++ symbols, not on pyring.
ASAN = ("detect_leaks=0:verify_asan_link_order=0:detect_odr_violation=0:"
        "new_delete_type_mismatch=0:alloc_dealloc_mismatch=0:halt_on_error=1:abort_on_error=1:"
        "handle_segv=1:allow_user_segv_handler=1")
UBSAN = "print_stacktrace=1:halt_on_error=1:report_error_type=1"
# io_sync=0: pyring's ranks talk through sockets and shared memory, which TSan does not see
# as synchronization; report_signal_unsafe=0: CPython's signal handlers.
TSAN = ("halt_on_error=0:second_deadlock_stack=1:report_signal_unsafe=0:io_sync=0:"
        "history_size=4")
# Where each report starts (UBSan's with its "runtime error:" line; its SUMMARY ends it).
REPORT = re.compile(r"^(?:==\d+==ERROR: AddressSanitizer|WARNING: ThreadSanitizer|"
                    r".*runtime error:)", re.M)
OURS = re.compile(r"pyring::|_C\.cpython|/csrc/")


def slowdown() -> float:
    """How many times longer this process's native code runs than on a normal build: the
    factor for deadlines that a test sizes to the work (PYRING_SANITIZED names the kind)."""
    kind = os.environ.get("PYRING_SANITIZED", "")
    return 5.0 if kind == "thread" else 2.0 if "address" in kind else 1.0


def runtime_libraries(kind: str, cxx: str = "g++") -> list[str]:
    """The libraries to preload for `kind`, as the compiler names them."""
    libs = ["libtsan.so"] if kind == "thread" else \
        ["libasan.so"] if "address" in kind else ["libubsan.so"]
    paths = []
    for lib in libs + ["libstdc++.so.6"]:
        path = subprocess.check_output([cxx, f"-print-file-name={lib}"], text=True).strip()
        if not os.path.isabs(path):
            raise RuntimeError(f"{cxx} has no {lib} (the {kind} runtime): install its "
                               f"sanitizer libraries (e.g. libasan8, libtsan2)")
        paths.append(os.path.realpath(path))
    return paths


def default_build(kind: str, source: Path) -> Path:
    """The build folder of `kind` for the source tree at `source`: one per tree and kind."""
    tag = hashlib.sha256(str(source).encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "pyring-sanitize" / f"{kind.replace(',', '-')}-{tag}"


def configured_from(build_dir: Path) -> Path | None:
    """The source tree `build_dir`'s CMake cache was configured from; None without a cache."""
    cache = build_dir / "CMakeCache.txt"
    if not cache.is_file():
        return None
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            return Path(line.split("=", 1)[1].strip())
    return None


def build(kind: str, source: Path, out: Path) -> Path:
    """`source` built with PYRING_SANITIZE=kind into out/build; returns out/pkg, which holds
    source's pyring package with that build's core."""
    import pybind11

    if not (source / "CMakeLists.txt").is_file() or not (source / "pyring").is_dir():
        raise SystemExit(f"sanitize: {source} is not a pyring source tree (--source)")
    home = configured_from(out / "build")
    if home is not None and home.resolve() != source:
        shutil.rmtree(out / "build")
    subprocess.run(["cmake", "-S", str(source), "-B", str(out / "build"),
                    "-DCMAKE_BUILD_TYPE=RelWithDebInfo", f"-DPYRING_SANITIZE={kind}",
                    f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                    f"-DPython_EXECUTABLE={sys.executable}"], check=True,
                   stdout=subprocess.DEVNULL)
    made = subprocess.run(["cmake", "--build", str(out / "build"), "--target", "_C",
                           f"-j{os.cpu_count() or 1}"], capture_output=True, text=True)
    if made.returncode:
        raise SystemExit(f"sanitize: the {kind} build failed:\n{made.stdout[-4000:]}"
                         f"{made.stderr[-4000:]}")
    pkg = out / "pkg"
    shutil.rmtree(pkg, ignore_errors=True)
    for package in ("pyring", "_pyring_autoload"):
        if (source / package).is_dir():
            shutil.copytree(source / package, pkg / package,
                            ignore=shutil.ignore_patterns("__pycache__", "_C*.so"))
    for so in (out / "build").glob("_C*.so"):
        shutil.copy(so, pkg / "pyring")
    return pkg


def environment(kind: str, pkg: Path, reports: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pkg)] + [p for p in (env.get("PYTHONPATH"),) if p])
    env["LD_PRELOAD"] = " ".join(runtime_libraries(kind))
    env["ASAN_OPTIONS"] = f"{ASAN}:log_path={reports}/asan:suppressions={ASAN_SUPPRESSIONS}"
    env["UBSAN_OPTIONS"] = f"{UBSAN}:log_path={reports}/ubsan:suppressions={UBSAN_SUPPRESSIONS}"
    env["TSAN_OPTIONS"] = f"{TSAN}:log_path={reports}/tsan:suppressions={TSAN_SUPPRESSIONS}"
    env["PYRING_SANITIZED"] = kind
    return env


def run_teed(command: list[str], env: dict[str, str], log: Path) -> int:
    """Runs `command`, its output passed through and kept in `log`: a report a process printed
    instead of writing it to its file (UBSan's, inside the ASan runtime) is counted too."""
    with open(log, "wb") as keep:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            keep.write(line)
        return proc.wait()


def split_reports(reports: Path) -> tuple[list[str], list[str]]:
    """(pyring's reports, every other report) found in the report folder."""
    ours, others = [], []
    for path in sorted(reports.iterdir()):
        text = path.read_text(errors="replace")
        starts = [m.start() for m in REPORT.finditer(text)]
        for a, b in zip(starts, starts[1:] + [len(text)]):
            block = text[a:b]
            (ours if OURS.search(block) else others).append(f"{path.name}:\n{block[:4000]}")
    return ours, others


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--suites"]:  # the suites CI runs under a kind, for .ci/run
        print(" ".join(SUITES[argv[1]]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--source", type=Path, default=Path.cwd())
    ap.add_argument("--build", type=Path, default=None)
    ap.add_argument("--reports", type=Path, default=None,
                    help="the report folder (default: a temporary one, removed)")
    ap.add_argument("--verbose", action="store_true", help="print the others' reports too")
    if "--" not in argv:
        ap.error("no command: give it after --")
    cut = argv.index("--")
    args, command = ap.parse_args(argv[:cut]), argv[cut + 1:]
    if not command:
        ap.error("no command: give it after --")
    out = args.build or default_build(args.kind, args.source.resolve())
    pkg = build(args.kind, args.source.resolve(), out)
    with tempfile.TemporaryDirectory(prefix="pyring-sanitize-") as tmp:
        reports = args.reports or Path(tmp)
        reports.mkdir(parents=True, exist_ok=True)
        rc = run_teed(command, environment(args.kind, pkg, reports), reports / "console")
        ours, others = split_reports(reports)
    for r in ours + (others if args.verbose else []):
        print(r, file=sys.stderr)
    print(f"sanitize {args.kind}: exit {rc}; {len(ours)} report(s) in pyring's code, "
          f"{len(others)} elsewhere", file=sys.stderr)
    return rc if rc else (3 if ours else 0)


if __name__ == "__main__":
    sys.exit(main())
