"""python -m pyring.tools.selfcheck --quick --no-build with the GPUs hidden (as on a machine without
one, and so that it stays short everywhere): one JSON with the machine, every step and the
targets; every GPU step is skipped with its reason, and the CPU steps still measure."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

import pyring

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("build", "kernels", "allreduce", "device_fault", "main_job", "gpu_tests", "sanitizer",
         "cpu_scaling", "cpu_async")


def _positive(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_quick_selfcheck(tmp_path):
    # The child imports the pyring this test imported (its parent folder first on the path), as
    # the tests themselves do: it runs outside the source tree, whose pyring/ may hold no
    # built core, and is told where the tree is.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    first = str(Path(pyring.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (first, env.get("PYTHONPATH")) if p)
    res = subprocess.run(
        [sys.executable, "-m", "pyring.tools.selfcheck", "--quick", "--no-build", "--out",
         str(tmp_path), "--tree", str(ROOT)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    assert (tmp_path / "selfcheck.json").exists(), res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "selfcheck.json").read_text())
    steps = doc["steps"]
    assert tuple(steps) == STEPS
    assert res.returncode == (1 if doc["failed_steps"] else 0), res.stdout[-3000:]
    assert doc["failed_steps"] == [], res.stdout[-3000:] + res.stderr[-3000:]

    m = doc["machine"]
    assert m["cores"] >= 1 and m["torch"] == torch.__version__ and m["pyring"]
    assert m["date"] and "cpu_model" in m and "git_sha" in m
    assert steps["build"] == {"skipped": "--no-build"}

    for name in ("gpu_tests", "kernels", "allreduce", "device_fault", "sanitizer"):
        assert steps[name] == {"skipped": "torch.cuda.is_available() is False"}, name
    assert steps["main_job"]["gpu"] == {"skipped": "torch.cuda.is_available() is False"}
    assert all(t["met"] is None and t["value"] is None for t in doc["targets"])
    assert res.stdout.count("skipped: torch.cuda.is_available() is False") == 5
    assert "# no usable GPU here (torch.cuda.is_available() is False): the GPU steps are " \
        "skipped, as expected" in res.stdout

    cpu = steps["main_job"]["cpu"]
    assert steps["main_job"]["status"] == "ok" and cpu["device"] == "cpu" and cpu["world"] == 2
    assert _positive(cpu["val_loss"]) and _positive(cpu["elapsed_s"])
    assert _positive(cpu["tokens_per_s"]) and cpu["steps"] > 0

    scaling = steps["cpu_scaling"]
    assert scaling["status"] == "ok" and scaling["config"]["gpus"] == 0
    rows = {(r["method"], r["ranks"]): r for r in scaling["summary"]}
    assert {("compute", 1), ("compute", 2), ("pyring", 2), ("ddp-gloo", 2)} <= set(rows)
    assert all(_positive(r["step_s"]) and _positive(r["speedup"]) for r in rows.values())

    assert steps["cpu_async"]["status"] == "ok"
    assert set(steps["cpu_async"]["tasks"]) == {"digits"}  # --quick: digits alone
    for task in steps["cpu_async"]["tasks"].values():
        assert set(task["methods"]) == {"sync", "ps_fp32", "ps_fp32_overlap"}, task
        assert all(_positive(r["final_loss_mean"]) for r in task["methods"].values())

    assert len(doc["targets"]) == 7 and all("target" in t for t in doc["targets"])
    png = tmp_path / "selfcheck.png"
    assert png.exists() if doc["plot"] == str(png) else doc["plot"].startswith("no PNG")


def test_outside_a_checkout_the_tree_steps_are_skipped_naming_tree(tmp_path):
    """Run from an installed package alone (no --tree, not in a clone): the steps that run the
    tree's scripts are skipped with a line naming --tree, and the exit code says that what ran
    passed."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    first = str(Path(pyring.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (first, env.get("PYTHONPATH")) if p)
    res = subprocess.run(
        [sys.executable, "-m", "pyring.tools.selfcheck", "--quick", "--no-build", "--out",
         str(tmp_path / "out")], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=150)
    doc = json.loads((tmp_path / "out" / "selfcheck.json").read_text())
    assert res.returncode == 0 and doc["failed_steps"] == [], res.stdout[-3000:]
    for name in ("main_job", "cpu_scaling", "cpu_async"):
        assert "--tree" in doc["steps"][name]["skipped"], doc["steps"][name]

