"""The self-check: on a GPU machine, one command builds pyring in place with CUDA, runs the GPU
tests and the GPU benchmarks, and writes one JSON and one PNG with the machine's description.

    python -m pyring.tools.selfcheck [--out DIR] [--quick] [--no-build]
    python pyring/tools/selfcheck.py ...        # the same, where no pyring._C is built yet

Steps, in order, each recorded under "steps" in DIR/selfcheck.json:
  build        pip install --no-build-isolation --no-deps --no-index -e <tree> (scikit-build-core)
               with CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=<the GPUs', e.g. 90> -DPYRING_CUDA=ON"
  kernels      cuda_reduce_accumulate and cuda_onebit_encode on 256 MiB of float32 beside
               torch's device-to-device dst.copy_(src), timed with CUDA events
  allreduce    64 MiB float32 CUDA tensors: pyring and gloo at 2 and 4 ranks on GPU 0, pyring
               and NCCL at 1 rank, and a pinned D2H + H2D of the same bytes
  main_job     examples/train.py on the GPU(s) and on the CPU, the same ranks, steps and seeds
  gpu_tests    pytest -m gpu, every outcome and the failures in DIR/gpu_tests.log
  sanitizer    compute-sanitizer memcheck and racecheck over 2-rank allreduces on GPU 0 (the
               device ring, host staging, the one-bit wire)
  cpu_scaling  bench/training.py --mode scaling on the CPU (GPUs hidden), pyring beside DDP+gloo
  cpu_async    bench/async.py's straggler on digits and the char-LM (GPUs hidden): a core per
               rank, which the 2-core development machine lacks
A step that needs a GPU records {"skipped": why} where none is usable; a step that fails
records its error and the next one runs. The exit status is 1 when a step that ran failed.
Targets (recorded under "targets" as met or not, never asserted) are in
pyring/tools/selfcheck_report.py's TARGETS, with the report's other pieces.
--quick shrinks the CPU parts (1 and 2 ranks, few steps, a small model) for CI.

Every step runs in fresh processes (the GPU benchmarks in the spawned ranks of
pyring/tools/selfcheck_ranks.py): the build replaces pyring._C, and this process keeps the module
it started with. This file imports no pyring at its top, so that it runs as a file in a tree
with no core built yet.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

if __name__ == "__main__" and not __package__:  # run as a file: import pyring from its tree
    sys.path[0] = str(Path(__file__).absolute().parents[2])

PKG_PARENT = Path(__file__).absolute().parents[2]  # what the children import pyring from


def _sibling(name: str) -> Any:
    """A module of this folder that imports no pyring, loaded by path: it works before
    pyring._C is built."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _sibling("selfcheck_report")


# ----------------------------------------------------------------------------- processes
_TREE: list[Path] = []  # --tree, when given


def tree() -> Path:
    """The source tree (examples/, bench/, tests/): --tree, else pyring's parent when it holds
    one, else the working dir."""
    if _TREE:
        return _TREE[0]
    return PKG_PARENT if (PKG_PARENT / "examples" / "train.py").exists() else Path.cwd()


def child_env(**extra: str) -> dict[str, str]:
    """The environment of every child: this one, importing the same pyring first."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PKG_PARENT), env.get("PYTHONPATH")) if p)
    return env


def run(cmd: list[str], limit: float, env: dict[str, str] | None = None,
        tail: int = 3000) -> dict[str, Any]:
    """Runs cmd in the tree: its exit status (None: killed at `limit` seconds), how it ended,
    its wall time and its output's last `tail` characters. Never raises."""
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=tree(), env=env or child_env(), capture_output=True,
                             text=True, timeout=max(1.0, limit))
        rc, text, ended = res.returncode, res.stdout + res.stderr, f"exited with {res.returncode}"
    except subprocess.TimeoutExpired as e:  # its output so far comes as bytes
        out = b"".join(x for x in (e.stdout, e.stderr) if isinstance(x, bytes))
        rc, text, ended = None, out.decode(errors="replace"), f"was killed after {limit:.0f} s"
    return {"command": cmd, "rc": rc, "ended": ended,
            "wall_s": round(time.perf_counter() - t0, 1), "tail": text[-tail:]}


RECORD = "selfcheck-record "  # the line of a fresh interpreter's output that holds its record


def fresh(args: list[str], limit: float) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """This file run by a fresh interpreter with `args`: the record it printed (None: none
    within `limit` seconds), and run's account of the call."""
    res = run([sys.executable, str(Path(__file__).absolute()), *args], limit)
    lines = [x for x in res["tail"].splitlines() if x.startswith(RECORD)]
    try:
        return (json.loads(lines[-1][len(RECORD):]) if lines else None), res
    except ValueError:
        return None, res


def probe(limit: float = 120.0) -> dict[str, Any]:
    """torch's and pyring's view of the devices, from a fresh interpreter."""
    rec, res = fresh(["--probe"], limit)
    return rec if rec is not None else {"probe_error": f"the probe {res['ended']}: "
                                        f"{res['tail'][-500:]}"}


def no_gpu_reason(p: dict[str, Any], need_pyring: bool = True) -> str | None:
    """Why the GPU steps cannot run (None: they can)."""
    if "probe_error" in p:
        return f"the device probe failed: {p['probe_error']}"
    if "torch_error" in p:
        return f"torch does not import: {p['torch_error']}"
    if not p.get("cuda_available"):
        return "torch.cuda.is_available() is False"
    if not need_pyring:
        return None
    if "pyring_error" in p:
        return f"pyring does not import: {p['pyring_error']}"
    if not p.get("pyring_gpus"):
        built = "" if p.get("built_with_cuda") else " (pyring._C.built_with_cuda() is False)"
        return f"pyring._C.cuda_device_count() == 0{built}"
    return None


# ----------------------------------------------------------------------------- steps
class Check:
    """What the steps share: the options, the output folder, the device probe, the clock."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out = args, Path(args.out)
        self.deadline = time.monotonic() + args.budget
        self.probe: dict[str, Any] = {}

    def left(self, cap: float) -> float:
        """Seconds a child may run: cap, or what the budget has left if less."""
        left = self.deadline - time.monotonic()
        if left < 10:
            raise TimeoutError(f"not run: the {self.args.budget:.0f} s budget is spent")
        return min(cap, left)


def step_build(c: Check) -> dict[str, Any]:
    if c.args.no_build:
        return {"skipped": "--no-build"}
    why = no_gpu_reason(c.probe, need_pyring=False)
    if why:
        return {"skipped": f"{why}: the build targets this machine's GPUs"}
    archs = sorted({"".join(map(str, g["capability"])) for g in c.probe["gpus"]})
    # CMAKE_ARGS, not SKBUILD_CMAKE_ARGS: scikit-build-core splits the latter at every ";".
    cmake = f"{os.environ.get('CMAKE_ARGS', '')} -DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)} "
    cmake += "-DPYRING_CUDA=ON"
    env = child_env(CMAKE_ARGS=cmake.strip(), CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count()))
    res = run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
               "--no-index", "-e", str(tree())], c.left(480), env)
    res["CMAKE_ARGS"] = env["CMAKE_ARGS"]
    c.probe = probe()  # the module a fresh interpreter now imports
    res["after"] = {k: c.probe.get(k) for k in ("pyring_C", "built_with_cuda", "pyring_error")}
    if res["rc"] != 0:
        res["error"] = f"pip {res['ended']}"
    elif not c.probe.get("built_with_cuda"):
        res["error"] = f"a fresh interpreter imports a pyring._C without CUDA: {res['after']}"
    return res


def step_gpu_tests(c: Check) -> dict[str, Any]:
    """pytest -m gpu, each test's outcome on its own line in DIR/gpu_tests.log (a run killed at
    its limit still names the test it was in), the failures' tracebacks and the slowest tests
    at its end; a test stuck for 90 s dumps every thread's stack there."""
    log = c.out / "gpu_tests.log"
    res = run([sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-rfE", "--tb=short",
               "--durations=12", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=90"],
              c.left(300), tail=1 << 24)
    log.write_text(res["tail"])
    res |= report.pytest_outcomes(res["tail"], killed=res["rc"] is None)
    res |= {"log": str(log), "tail": res["tail"][-3000:]}
    counts = res["counts"]
    if res["rc"] != 0 or not counts.get("passed"):
        res["error"] = (f"pytest {res['ended']}: {counts or 'no summary'}; failed: "
                        f"{', '.join(res['failed']) or 'none'}; in {res['unfinished']} at the end")
    return res


def in_child(c: Check, name: str, cap: float) -> dict[str, Any]:
    """Step `name`'s measurement run by a fresh interpreter (`--child name`): this process may
    hold no pyring._C, or one the build has replaced."""
    limit = c.left(cap)
    rec, res = fresh(["--child", name, "--budget", str(limit - 5), "--out", str(c.out)], limit)
    return rec if rec is not None else {**res, "error": f"the {name} child {res['ended']} "
                                        "without a record"}


def step_kernels(c: Check) -> dict[str, Any]:
    return in_child(c, "kernels", 200)


def step_allreduce(c: Check) -> dict[str, Any]:
    return in_child(c, "allreduce", 420)


def step_device_fault(c: Check) -> dict[str, Any]:
    return in_child(c, "device_fault", 120)


def child_measure(c: Check, name: str) -> dict[str, Any]:
    from pyring.tools.selfcheck_ranks import (
        measure_allreduce,
        measure_device_fault,
        measure_kernels,
    )

    if name == "kernels":
        return measure_kernels(c.left(200))
    if name == "device_fault":
        return measure_device_fault(c.left(120))
    return measure_allreduce(c.left)


SANITIZER_TOOLS = ("memcheck", "racecheck")


def sanitizer_path() -> str | None:
    """compute-sanitizer on PATH, else under CUDA_HOME or /usr/local/cuda; None: absent."""
    import shutil

    for cand in (shutil.which("compute-sanitizer"),
                 *(Path(d) / "bin" / "compute-sanitizer" for d in
                   (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda") if d)):
        if cand and Path(cand).exists():
            return str(cand)
    return None


def step_sanitizer(c: Check) -> dict[str, Any]:
    """Each tool of SANITIZER_TOOLS over pyring/tools/selfcheck_ranks.py's sanitize_jobs (2 ranks on
    GPU 0, every process followed): the errors each tool reports, summed over processes."""
    exe = sanitizer_path()
    if exe is None:
        return {"error": "compute-sanitizer is not on PATH, under CUDA_HOME or /usr/local/cuda"}
    job = ("import sys; from pyring.tools.selfcheck_ranks import sanitize_jobs; "
           "sys.exit(sanitize_jobs())")
    out: dict[str, Any] = {"tools": {}}
    for tool in SANITIZER_TOOLS:
        res = run([exe, "--tool", tool, "--target-processes", "all", "--error-exitcode", "97",
                   sys.executable, "-c", job], c.left(200), tail=1 << 24)
        (c.out / f"sanitizer_{tool}.log").write_text(res["tail"])
        res |= report.sanitizer_counts(res["tail"])
        res |= {"tail": res["tail"][-3000:], "log": str(c.out / f"sanitizer_{tool}.log")}
        out["tools"][tool] = res
    ran = all(t["jobs"] and all(v == "ok" for v in t["jobs"].values()) and t["summaries"]
              for t in out["tools"].values())
    # A figure only where every job ran to its end under every tool.
    out["values"] = {"sanitizer_errors": sum(t["errors"] for t in out["tools"].values())} if ran \
        else {}
    bad = [f"{k} ({v['ended']}, {v['errors']} errors, jobs {v['jobs']})"
           for k, v in out["tools"].items() if v["rc"] != 0 or v["errors"] or not v["jobs"]]
    if bad:
        out["error"] = "compute-sanitizer: " + "; ".join(bad)
    return out


def main_job_args(c: Check) -> list[str]:
    if c.args.quick:
        return "--steps 30 --dim 64 --layers 2 --data-mb 1 --val-batches 4".split()
    return ["--steps", "300"]


def _train(c: Check, name: str, device_args: list[str]) -> dict[str, Any]:
    path = c.out / f"main_job_{name}.json"
    path.unlink(missing_ok=True)
    # A collective here takes milliseconds: a 30 s timeout names a hang long before the limit.
    res = run([sys.executable, "examples/train.py", *main_job_args(c), "--ranks", "2",
               *device_args, "--json", str(path), "--timeout", "30", "--time-limit", "400"],
              c.left(420))
    if res["rc"] == 0 and path.exists():
        return {**json.loads(path.read_text()), "wall_s": res["wall_s"], "command": res["command"]}
    last = [line for line in res["tail"].splitlines() if line.strip()][-1:]
    return {**res, "error": f"train.py {res['ended']}" + (f": {last[0][-300:]}" if last else "")}


def step_main_job(c: Check) -> dict[str, Any]:
    out: dict[str, Any] = {"cpu": _train(c, "cpu", ["--device", "cpu"])}
    gpus = len(c.probe.get("gpus") or [])
    why = no_gpu_reason(c.probe)
    # On the GPU, 2 ranks as on the CPU: sharing the GPU where there is one.
    out["gpu"] = {"skipped": why} if why else _train(
        c, "gpu", ["--device", "cuda", "--ranks-per-gpu", "2" if gpus == 1 else "1"])
    losses = [out[k].get("val_loss") for k in ("cpu", "gpu")]
    out["values"] = {"loss_rel_diff": abs(losses[1] - losses[0]) / losses[0]} if all(losses) else {}
    failed = [k for k in ("cpu", "gpu") if "error" in out[k]]
    if failed:
        out["error"] = f"train.py failed on {' and '.join(failed)}"
    return out


def step_cpu_scaling(c: Check) -> dict[str, Any]:
    path = c.out / "scaling.json"
    path.unlink(missing_ok=True)
    size = ("--ranks 1,2 --dim 64 --layers 2 --batch 4 --seq 64 --data-mb 0.5 --steps 5 "
            "--warmup 1 --comm-iters 5" if c.args.quick else "--ranks 1,2,4,8 --steps 10 "
            "--warmup 2").split()
    res = run([sys.executable, "bench/training.py", "--mode", "scaling", *size, "--repeats",
               "1", "--methods", "pyring,ddp-gloo", "--run-limit", "120", "--tag", "selfcheck",
               "--out", str(path)], c.left(420), child_env(CUDA_VISIBLE_DEVICES=""))
    doc = json.loads(path.read_text()) if path.exists() else {}
    out = {"json": str(path), "command": res["command"], "config": doc.get("config"),
           "summary": doc.get("summary"), "predicted": doc.get("predicted")}
    if res["rc"] != 0:  # a failed run is in the JSON's "runs"; the others are summarized
        out |= {"error": f"bench/training.py {res['ended']}", "tail": res["tail"]}
    return out


# bench/async.py's runs: digits, where the parameter server gained on the 2-core machine, and
# the char-LM with the server at a quarter of the rate (one optimizer step per push, 4 workers:
# docs/asynchronous.md). --quick runs digits alone.
ASYNC_RUNS = (("digits", "--steps 400", ()), ("charlm", "--steps 200", ("--ps-lr", "0.00075")))


def step_cpu_async(c: Check) -> dict[str, Any]:
    size = ("--seeds 1 --methods sync,ps_fp32,ps_fp32_overlap" if c.args.quick else
            "--seeds 3 --methods sync,ssp1,ps_fp32,ps_fp32_overlap,ps_onebit").split()
    out: dict[str, Any] = {"tasks": {}, "values": {}}
    for task, full_steps, extra in ASYNC_RUNS[:1] if c.args.quick else ASYNC_RUNS:
        path = c.out / f"async_{task}.json"
        path.unlink(missing_ok=True)
        steps = ["--steps", "20"] if c.args.quick else full_steps.split()
        res = run([sys.executable, "bench/async.py", "--task", task, *size, *steps, *extra,
                   "--out", str(path)], c.left(360), child_env(CUDA_VISIBLE_DEVICES=""))
        doc = json.loads(path.read_text()) if path.exists() else {}
        methods = {m: {k: s.get(k) for k in ("wall_s", "speedup_of_mean_times",
                                             "final_loss_mean", "worker_wait_fraction")}
                   for m, s in doc.get("summary", {}).items()}
        out["tasks"][task] = {"json": str(path), "command": res["command"],
                              "targets_met": doc.get("targets_met"), "methods": methods}
        out["values"] |= {f"{task} {m} loss": r["final_loss_mean"] for m, r in methods.items()}
        if res["rc"] != 0:
            out |= {"error": f"bench/async.py --task {task} {res['ended']}", "tail": res["tail"]}
            break
    return out


# The measurements first, then the tests and the sanitizer, which may run long when they fail.
STEPS: dict[str, Callable[[Check], dict[str, Any]]] = {
    "build": step_build, "kernels": step_kernels, "allreduce": step_allreduce,
    "device_fault": step_device_fault, "main_job": step_main_job, "gpu_tests": step_gpu_tests,
    "sanitizer": step_sanitizer, "cpu_scaling": step_cpu_scaling, "cpu_async": step_cpu_async}
# Skipped whole where no GPU is usable.
GPU_STEPS = ("gpu_tests", "kernels", "allreduce", "device_fault", "sanitizer")
# Run scripts of the source tree (examples/train.py, bench/training.py), which the installed
# package does not hold: skipped outside a checkout unless --tree names one.
TREE_STEPS = ("main_job", "cpu_scaling", "gpu_tests", "cpu_async")


def no_tree_reason() -> str | None:
    if (tree() / "examples" / "train.py").exists():
        return None
    return ("needs a source tree (examples/, bench/, tests/): run from a clone, or pass "
            "--tree CLONE")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pyring.tools.selfcheck",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="selfcheck", help="folder of selfcheck.json and .png")
    p.add_argument("--quick", action="store_true", help="small CPU parts (about a minute)")
    p.add_argument("--no-build", action="store_true", help="use the pyring already importable")
    p.add_argument("--budget", type=float, default=540.0,
                   help="seconds for the whole run: a step past it fails as not run")
    p.add_argument("--tree", type=Path, help="the source tree with examples/ and bench/ "
                   "(default: pyring's parent when it holds one, else the working dir)")
    p.add_argument("--skip", default="", metavar="STEP,...",
                   help=f"steps not to run, recorded as skipped (of {', '.join(STEPS)})")
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child", choices=("kernels", "allreduce", "device_fault"),
                   help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.probe:
        print(RECORD + json.dumps(report.devices_here()))
        return 0
    if args.child:
        try:
            rec = child_measure(Check(args), args.child)
        except Exception as e:
            rec = {"error": f"{type(e).__name__}: {e}"[-3000:],
                   "traceback": traceback.format_exc()}
        print("\n" + RECORD + json.dumps(rec, default=str))
        return 0
    if args.tree is not None:
        if not (args.tree / "examples" / "train.py").exists():
            raise SystemExit(f"--tree {args.tree}: no examples/train.py there")
        _TREE.append(args.tree.resolve())
    skip = [s for s in args.skip.split(",") if s]
    if set(skip) - set(STEPS):
        raise SystemExit(f"--skip {args.skip}: no step {sorted(set(skip) - set(STEPS))}; "
                         f"the steps are {', '.join(STEPS)}")
    c = Check(args)
    c.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    c.probe = probe()
    me = ["-m", "pyring.tools.selfcheck"] if __package__ else sys.argv[:1]
    doc: dict[str, Any] = {"selfcheck": "pyring", "command": [sys.executable, *me, *sys.argv[1:]],
                           "quick": args.quick, "tree": str(tree()), "steps": {}}
    path = c.out / "selfcheck.json"
    no_gpu = no_gpu_reason(c.probe)
    if no_gpu:
        print(f"# no usable GPU here ({no_gpu}): the GPU steps are skipped, as expected; the "
              f"build, the main job on the CPU and the CPU scaling still run (--quick: a short "
              f"run; docs/gpus.md)", flush=True)
    for name, step in STEPS.items():
        print(f"[{name}] ", end="", flush=True)
        t = time.perf_counter()
        try:
            why = "--skip" if name in skip else (no_gpu_reason(c.probe) if name in GPU_STEPS
                                                  else None) or (no_tree_reason() if name in
                                                                 TREE_STEPS else None)
            rec = {"skipped": why} if why else step(c)
        except Exception as e:
            rec = {"error": f"{type(e).__name__}: {e}"[-3000:], "traceback": traceback.format_exc()}
        if "skipped" not in rec:
            rec["wall_s"] = round(time.perf_counter() - t, 1)
            rec["status"] = "failed" if "error" in rec else "ok"
        doc["steps"][name] = rec
        # After the build: the pyring the steps ran.
        doc["machine"] = report.machine(c.probe, tree())
        path.write_text(json.dumps(doc, indent=1, default=str))  # a killed run keeps its steps
        print(report.summary(rec), flush=True)
    doc["targets"] = report.targets(doc["steps"])
    doc["failed_steps"] = [n for n, r in doc["steps"].items() if r.get("status") == "failed"]
    doc["plot"] = report.plot(doc, c.out / "selfcheck.png")
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    path.write_text(json.dumps(doc, indent=1, default=str))
    for t in doc["targets"]:
        met = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
        value = "" if t["value"] is None else f" ({t['value']:.3g})"
        print(f"target {met}{value}: {t['target']}")
    print(f"{doc['plot']}\nwrote {path} in {doc['wall_s']:.0f} s; failed steps: "
          f"{', '.join(doc['failed_steps']) or 'none'}")
    return 1 if doc["failed_steps"] else 0


if __name__ == "__main__":
    sys.exit(main())
