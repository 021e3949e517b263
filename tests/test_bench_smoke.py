"""Every benchmark script runs, at tiny sizes, from a copy of bench/ against the pyring that
the tests import (an installed build in CI): so that none breaks unseen, and so that the
documented commands work after the documented install (no PYTHONPATH into the source tree).

Covered elsewhere: training.py (tests/test_training_harness.py), soak.py (tests/test_soak.py)
and leaks.py (tests/test_leaks.py). The test extra carries the benchmarks' own needs
(scikit-learn for the digits task, matplotlib for the plots). Not run here: callpath.py,
which builds each git ref and runs a rank under callgrind (minutes, not seconds); the GPU
probe (probes/ipc_slots.py), which runs in the self-check's GPU lease and here only shows that
it refuses without a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyring.tools import emulate as _emulate

ROOT = Path(__file__).resolve().parent.parent
HOSTS_OK, HOSTS_WHY = _emulate.available(shaping=True)
needs_hosts = pytest.mark.skipif(not HOSTS_OK, reason=f"no emulated hosts: {HOSTS_WHY}")

CASES = {
    "allreduce": ["allreduce.py", "--sizes", "4K,64K", "--blocks", "2", "--iters", "5",
                  "--warmup", "1", "--libs", "pyring,gloo,memcpy,tcp", "--algos", "ring",
                  "--tag", "smoke"],
    "allreduce_out_of_place": ["allreduce.py", "--sizes", "4K", "--blocks", "1", "--iters", "3",
                               "--warmup", "1", "--libs", "pyring,gloo", "--out-of-place",
                               "--tag", "smoke"],
    "async": ["async.py", "--task", "digits", "--seeds", "1", "--steps", "4",
              "--out", "{out}/async.json"],
    "convergence": ["convergence.py", "--task", "digits", "--seeds", "1", "--steps", "4",
                    "--methods", "adamw_onebit,onebit_adam", "--out", "{out}/convergence.json"],
    "p2p": ["p2p.py", "--rounds", "1", "--pingpong-iters", "3", "--a2a-iters", "2",
            "--out", "{out}/p2p.json"],
    "costmodel": ["costmodel.py", "--fit", str(ROOT / "bench/results/allreduce_vm_w2_shm.json"),
                  "--scaling", "--hosts", "--tag", "smoke"],
    "staging": ["staging.py", "--bytes", "256K", "--rounds", "1", "--iters", "1", "--tag",
                "smoke"],
    "wire_speed": ["wire_speed.py", "--where", "shm", "--bytes", "256K", "--rounds", "1",
                   "--tag", "smoke"],
    "affinity": ["affinity.py", "--runs", "1", "--iters", "20", "--train-rounds", "0",
                 "--out", "{out}/affinity.json"],
    "busy": ["busy.py", "--load", "membw", "--seconds", "0.5"],
    "machine": ["machine.py"],
    "tcp_streams": ["tcp_streams.py", "--bytes", "1M", "--rounds", "2", "--tag", "smoke"],
}
HOST_CASES = {
    "allreduce_hosts": ["allreduce.py", "--hosts", "2x1", "--rate", "300mbit", "--sizes", "1M",
                        "--blocks", "1", "--iters", "5", "--warmup", "2", "--libs",
                        "pyring,gloo", "--algos", "tree", "--tag", "smoke"],
    "async_slowlink": ["async.py", "--setup", "slowlink", "--task", "digits", "--seeds", "1",
                       "--steps", "4", "--rate", "100mbit", "--methods", "sync,ps_onebit",
                       "--out", "{out}/async_slowlink.json"],
    "slowlink": ["slowlink.py", "--task", "digits", "--steps", "4", "--rate", "100mbit",
                 "--out", "{out}/slowlink.json"],
    "overlap": ["overlap.py", "--rounds", "1", "--dim", "32", "--layers", "1", "--seq", "16",
                "--batch", "2", "--hooks", "bf16", "--tag", "smoke", "--timeline"],
    "link_cpu": ["probes/link_cpu.py", "--rounds", "1", "--dim", "32", "--layers", "1", "--seq",
                 "16", "--tag", "smoke"],
}


@pytest.fixture(scope="module")
def bench_copy(tmp_path_factory) -> Path:
    """bench/'s scripts and C sources, with an empty results folder, outside the source tree."""
    dst = tmp_path_factory.mktemp("tree") / "bench"
    shutil.copytree(ROOT / "bench", dst, ignore=shutil.ignore_patterns(
        "results", "env", "__pycache__"))
    (dst / "results").mkdir()
    return dst


def _run(bench: Path, argv: list[str], out: Path, timeout: float) -> str:
    env = dict(os.environ)
    if _installed():  # as after the documented install; a source-tree run keeps its path
        env.pop("PYTHONPATH", None)
    cmd = [sys.executable, str(bench / argv[0]), *(a.format(out=out) for a in argv[1:])]
    proc = subprocess.run(cmd, cwd=bench.parent, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(argv)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _installed() -> bool:
    import pyring

    return not Path(pyring.__file__).resolve().is_relative_to(ROOT)


def _results(bench: Path, out: Path) -> list[Path]:
    """The JSON files a run may write: its own (bench/results/runs/, and --out under `out`) and
    the cited ones under bench/results/, which no run of CASES may change."""
    return sorted([*bench.joinpath("results").glob("*.json"),
                   *bench.joinpath("results", "runs").glob("*.json"), *out.glob("*.json")])


@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_runs(name, bench_copy, tmp_path):
    before = set(_results(bench_copy, tmp_path))
    _run(bench_copy, CASES[name], tmp_path, timeout=240)
    written = [p for p in _results(bench_copy, tmp_path) if p not in before]
    cited = [p for p in written if p.parent == bench_copy / "results"]
    assert not cited, f"{name} wrote over or beside the cited results: {cited}"
    if name not in ("busy", "machine"):
        assert written, f"{name} wrote no JSON"
        for p in written:
            doc = json.loads(p.read_text())
            assert doc, p
            p.unlink()


@needs_hosts
@pytest.mark.parametrize("name", sorted(HOST_CASES))
def test_benchmark_runs_on_emulated_hosts(name, bench_copy, tmp_path):
    before = set(_results(bench_copy, tmp_path))
    _run(bench_copy, HOST_CASES[name], tmp_path, timeout=300)
    written = [p for p in _results(bench_copy, tmp_path) if p not in before]
    assert written, f"{name} wrote no JSON"
    for p in written:
        if name == "allreduce_hosts":
            # Waiting on a slow link sleeps: polling it kept a whole core busy (0.97) before.
            busy = json.loads(p.read_text())["sizes"][0]["cores_busy"]["pyring"]
            assert busy < 0.5, f"pyring kept {busy} of a core busy on a 300 Mbit link"
        p.unlink()


def test_gpu_probe_says_it_needs_a_gpu(bench_copy, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the probe runs in the self-check's lease instead")
    proc = subprocess.run([sys.executable, str(bench_copy / "probes/ipc_slots.py"), "--out",
                           str(tmp_path / "slots.json")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "slots.json").exists()


def test_the_harness_says_what_it_skips(bench_copy, tmp_path):
    out = _run(bench_copy, ["allreduce.py", "--sizes", "4K", "--blocks", "1", "--iters", "3",
                            "--warmup", "1", "--libs", "pyring,gloo,oneccl", "--tag", "smoke"],
               tmp_path, timeout=120)
    assert "# oneccl skipped:" in out and "install.sh" in out
    for p in bench_copy.joinpath("results", "runs").glob("*.json"):
        p.unlink()


@pytest.mark.skipif(not shutil.which("mpirun") or importlib.util.find_spec("mpi4py") is None,
                    reason="needs Open MPI and mpi4py (bench/README.md)")
def test_back_to_back_probe_runs_under_mpirun(bench_copy, tmp_path):
    out = tmp_path / "back_to_back.json"
    env = dict(os.environ)
    if _installed():
        env.pop("PYTHONPATH", None)
    cmd = [shutil.which("mpirun"), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-np", "2", sys.executable, str(bench_copy / "probes/back_to_back.py"), "--calls", "5",
           "--rounds", "1", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=bench_copy.parent, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["wrong"] == 0 and len(doc["median_us"]) == 6, doc
