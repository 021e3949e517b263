"""examples/train.py, the main job, on the sim device as the GPU self-check runs it on a GPU: 2
ranks sharing one device and bound to it at init, each sync method. Each run reaches the
validation loss of the same run on the CPU (the target on a GPU: within 2%; the sim device runs
the CPU's arithmetic, so here it is equal to rounding), and its device buffers moved device to
device. The sim device holds the host wherever CUDA synchronizes the device (allocations, a
kernel's first launch, copies to pageable memory), so a collective whose stream waits on work
pyring's thread has still to queue hangs here as it hung on a GPU (docs/gpus.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pyring.launch import run_ranks

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SIZE = ["--steps", "10", "--dim", "32", "--layers", "1", "--heads", "2", "--data-mb", "0.2",
        "--val-batches", "2", "--batch", "4", "--seq", "32", "--threads", "1", "--timeout", "30"]
RUNS = {"pyring": [], "ddp-pyring": ["--sync", "ddp-pyring"],
        "ps-onebit": ["--mode", "ps", "--servers", "1", "--wire", "onebit"]}


def train_body(rank, world, store, device, argv):
    """The main job's rank on `device`; returns how its device buffers moved (before the
    communicator is destroyed)."""
    import torch
    import torch.distributed as dist

    import pyring

    sys.path.insert(0, str(EXAMPLES))
    import train

    if device.startswith("sim"):
        from pyring.testing import sim_torch

        sim_torch.enable()
        train.rank_device = lambda *_: torch.device(device)  # what rank_device does for cuda
    how = {}

    def record(destroy, comm_of):
        def wrapped(*a, **k):
            comm = comm_of()
            if comm is not None:
                s = comm.stats()
                how.update(transport=comm._c.device_transport, zero_copy=s["zero_copy"]["calls"],
                           device_link_bytes=sum(v["bytes_sent"]
                                                 for v in s["device_links"].values()))
            return destroy(*a, **k)
        return wrapped

    pyring.destroy = record(pyring.destroy, pyring.default)
    dist.destroy_process_group = record(dist.destroy_process_group,
                                        train.pyring_comm_of_default_group)
    train.train(rank, world, store, train.parse(argv))
    return how


def _run(tmp_path, device, extra):
    out = tmp_path / f"{device.replace(':', '')}.json"
    env = {"PYRING_DEVICE": device, "PYRING_SIM_DELAY_US": "100"} if device != "cpu" else {}
    how = run_ranks(2, train_body, device,
                    ["--device", "cpu", *SIZE, *extra, "--json", str(out)], env=env, timeout=240)
    return json.loads(out.read_text()), how


@pytest.mark.parametrize("run", list(RUNS))
def test_the_main_job_on_a_shared_sim_device_reaches_the_cpu_loss(tmp_path, run):
    cpu, _ = _run(tmp_path, "cpu", RUNS[run])
    sim, how = _run(tmp_path, "sim:0", RUNS[run])
    assert sim["device"] == "sim:0" and sim["steps"] == cpu["steps"] == 10
    assert abs(sim["val_loss"] - cpu["val_loss"]) <= 1e-5 * cpu["val_loss"], (cpu, sim)
    assert abs(sim["train_loss_last"] - cpu["train_loss_last"]) <= 1e-5 * cpu["train_loss_last"]
    assert sim["train_loss_last"] < sim["train_loss_first"], sim
    for h in how:
        assert h["transport"] == "cuda_ipc", how
        if run == "pyring":  # DistributedOptimizer's buckets are symmetric tensors
            assert h["zero_copy"] > 0, how
        elif run == "ddp-pyring":  # DDP's buckets are not: the device ring
            assert h["device_link_bytes"] > 0, how
