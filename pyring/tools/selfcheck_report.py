"""The self-check's report (pyring/tools/selfcheck.py): the machine's and the devices' description,
what the tools' output says (pytest, compute-sanitizer), the targets met or not, the PNG and the
one-line summaries. Imports no pyring at its top, so that it loads before the core is built."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

# (step, the key of the step's "values", comparison, goal, what it says)
TARGETS = (
    ("kernels", "reduce_vs_copy", ">=", 0.9,
     "cuda_reduce_accumulate GB/s >= 90% of dst.copy_(src) GB/s (256 MiB float32)"),
    ("kernels", "onebit_vs_copy", ">=", 0.8, "cuda_onebit_encode GB/s >= 80% of the copy's"),
    ("allreduce", "gloo_over_pyring_w2", ">=", 10.0,
     "2 ranks on one GPU, 64 MiB: gloo's time / pyring's >= 10"),
    ("allreduce", "pyring_over_copies_w2", "<=", 1.5,
     "2 ranks on one GPU, 64 MiB: pyring's time / (pinned D2H + H2D of 64 MiB) <= 1.5"),
    ("sanitizer", "sanitizer_errors", "<=", 0,
     "compute-sanitizer memcheck and racecheck: 0 errors over 2-rank allreduces on one GPU"),
    ("device_fault", "device_fault_s", "<=", 2.0,
     "a planted illegal address on rank 0's stream: CommError naming it on both ranks <= 2 s"),
    ("main_job", "loss_rel_diff", "<=", 0.02,
     "|GPU - CPU| / CPU final validation loss of examples/train.py <= 2%"),
)


def machine(p: dict[str, Any], tree: Path) -> dict[str, Any]:
    """The machine, the versions and the source revision; None where unknown."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = (re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.M) or [None])[0]

    def git(*a: str) -> str | None:
        try:
            res = subprocess.run(["git", *a], cwd=tree, capture_output=True, text=True,
                                 timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"cpu_model": model or platform.processor() or None, "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else None, "hostname": platform.node(), "python": platform.python_version(),
            "gpus": p.get("gpus"), "torch": p.get("torch"), "torch_cuda": p.get("torch_cuda"),
            "pyring": p.get("pyring"), "pyring_C": p.get("pyring_C"),
            "pyring_built_with_cuda": p.get("built_with_cuda"), "git_sha": git("rev-parse", "HEAD"),
            "git_modified": bool(status) if status is not None else None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def devices_here() -> dict[str, Any]:
    """torch's and pyring's view of this process's devices (the self-check's probe, run by a
    fresh interpreter); an import that fails is recorded, not raised."""
    out: dict[str, Any] = {}
    try:
        import torch

        out |= {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                "cuda_available": torch.cuda.is_available()}
        gpus = torch.cuda.device_count() if out["cuda_available"] else 0
        out["gpus"] = [{"name": torch.cuda.get_device_name(i),
                        "capability": list(torch.cuda.get_device_capability(i)),
                        "memory_gib": round(torch.cuda.get_device_properties(i).total_memory
                                            / 2**30, 1)} for i in range(gpus)]
    except Exception as e:
        out["torch_error"] = f"{type(e).__name__}: {e}"
    try:
        import pyring
        from pyring import _C

        out |= {"pyring": pyring.__version__, "pyring_C": _C.__file__,
                "built_with_cuda": _C.built_with_cuda(), "pyring_gpus": _C.cuda_device_count()}
    except Exception as e:
        out["pyring_error"] = f"{type(e).__name__}: {e}"
    return out


def targets(steps: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its value and whether it is met (None: not measured)."""
    out = []
    for step, key, cmp, goal, text in TARGETS:
        value = (steps.get(step, {}).get("values") or {}).get(key)
        met = None if value is None else (value >= goal if cmp == ">=" else value <= goal)
        out.append({"step": step, "target": text, "key": key, "goal": f"{cmp} {goal:g}",
                    "value": value, "met": met})
    return out


def pytest_outcomes(text: str, killed: bool) -> dict[str, Any]:
    """From `pytest -v -rfE` output: its summary counts, the tests that failed or erred, and
    (killed: the run did not end) the last test it started."""
    outcomes = re.findall(r"^(tests/\S+) (PASSED|FAILED|ERROR|SKIPPED)", text, re.M)
    started = re.findall(r"^(tests/\S+) ", text, re.M)
    counts = {k: int(v) for v, k in re.findall(
        r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)", text[-800:])}
    return {"counts": counts, "failed": [t for t, o in outcomes if o in ("FAILED", "ERROR")],
            "unfinished": started[-1] if killed and started else None}


def sanitizer_counts(text: str) -> dict[str, Any]:
    """From compute-sanitizer output over sanitize_jobs: the errors summed over the processes
    it followed (one summary each; racecheck's names errors and warnings apart), the number of
    summaries, and sanitize_jobs' own record (None: it printed none)."""
    found = re.findall(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error", text) or \
        re.findall(r"ERROR SUMMARY: (\d+) error", text)
    jobs = re.findall(r"sanitize_jobs (\{.*\})", text)
    return {"errors": sum(map(int, found)), "summaries": len(found),
            "jobs": json.loads(jobs[-1]) if jobs else None}


def plot(doc: dict[str, Any], path: Path) -> str:
    """One panel per benchmark step; returns the PNG's path or why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no PNG: matplotlib is not importable ({e})"
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, name in zip(axes.flat, ("kernels", "allreduce", "main_job", "cpu_scaling")):
        rec = doc["steps"].get(name, {})
        title, bars = _panel(name, rec)
        ax.set_title(title, fontsize=9)
        if bars:
            ax.bar(list(bars), list(bars.values()), log=name == "allreduce")
            ax.tick_params(axis="x", labelsize=7, rotation=20)
        elif rec.get("summary"):
            for method in dict.fromkeys(r["method"] for r in rec["summary"]):
                pts = sorted((r["ranks"], r["speedup"]) for r in rec["summary"] if r.get(
                    "speedup") and (r["method"] == method or r["ranks"] == 1))  # from 1 rank
                ax.plot(*zip(*pts), "o-", label=method)
            worlds = sorted({r["ranks"] for r in rec["summary"]})
            ax.set_xscale("log", base=2)
            ax.set_xticks(worlds, [str(w) for w in worlds])
            ax.set_xlabel("ranks")
            ax.legend(fontsize=7)
        else:
            why = f"skipped: {rec['skipped']}" if "skipped" in rec else rec.get("error", "")
            ax.text(0.5, 0.5, why[:200] or "no figures", ha="center", va="center", wrap=True,
                    fontsize=8, transform=ax.transAxes)
            ax.set_axis_off()
        ax.grid(alpha=0.3)
    gpus = ", ".join(g["name"] for g in doc["machine"].get("gpus") or []) or "no GPU"
    fig.suptitle(f"pyring self-check: {doc['machine']['cpu_model']}; {gpus}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _panel(name: str, rec: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """A panel's title and its bars (label: height; none for the scaling curves)."""
    if name == "kernels":
        return "256 MiB float32: GB/s, bytes read + written", {
            k: rec[k]["GBps"] for k in ("copy", "reduce_accumulate", "onebit_encode") if k in rec}
    if name == "allreduce":
        return "64 MiB float32 on GPU 0: ms per call (slowest rank)", {
            k: v["time_s"] * 1e3 for k, v in rec.get("runs", {}).items() if "time_s" in v}
    if name == "main_job":
        return "examples/train.py: final validation loss", {
            k: rec[k]["val_loss"] for k in ("cpu", "gpu") if "val_loss" in (rec.get(k) or {})}
    return "CPU scaling: speedup in samples/s over 1 rank", {}


def summary(rec: dict[str, Any]) -> str:
    """A step's console line: its outcome and its headline figures."""
    if "skipped" in rec:
        return f"skipped: {rec['skipped']}"
    figures = dict(rec.get("counts") or {})
    figures |= {f"{k} GB/s": rec[k]["GBps"] for k in ("copy", "reduce_accumulate",
                                                       "onebit_encode") if k in rec}
    figures |= {f"{k} ms": v["time_s"] * 1e3 for k, v in (rec.get("runs") or {}).items()
                if "time_s" in v}
    figures |= {f"{k} val loss": rec[k]["val_loss"] for k in ("cpu", "gpu")
                if isinstance(rec.get(k), dict) and "val_loss" in rec[k]}
    figures |= {f"{r['method']} x{r['ranks']} speedup": r["speedup"]
                for r in rec.get("summary") or [] if r["ranks"] > 1}
    figures |= rec.get("values") or {}
    text = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in figures.items())
    head = f"FAILED: {rec['error'][:500]}" if "error" in rec else "ok"
    return f"{head} ({rec['wall_s']:.0f} s){'; ' + text if text else ''}"
