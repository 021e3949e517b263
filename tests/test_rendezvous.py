"""Rendezvous: torchrun's environment, an existing process group, host detection, agreement."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import pyring
from pyring.launch import run_ranks

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_torchrun_environment(tmp_path, transport):
    env = dict(os.environ, PYRING_TRANSPORT=transport, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
           "--standalone",
           os.path.join(HERE, "scripts", "torchrun_job.py"), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    for r, rep in enumerate(reports):
        assert rep["rank"] == r and rep["world"] == 3 and rep["local_world"] == 3
        assert rep["value"] == 6.0
        assert rep["transport"] == ("tcp" if transport == "tcp" else "shm")


def _with_process_group(rank, world, store):
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    comm = pyring.init()  # reuses the default group's store, rank and size
    t = torch.full((10,), float(rank))
    pyring.all_reduce(t, op=pyring.ReduceOp.MAX)
    g = torch.full((10,), float(rank))
    dist.all_reduce(g)
    info = (comm.rank, comm.world_size, comm.local_world_size, float(t[0]), float(g[0]))
    pyring.destroy()
    dist.destroy_process_group()
    return info


def test_reuses_default_process_group_store():
    res = run_ranks(3, _with_process_group, timeout=120)
    assert res == [(r, 3, 3, 2.0, 3.0) for r in range(3)]


def _transport_env(rank, world, store):
    comm = pyring.init(rank, world, store, set_default=False)
    kinds = {p: comm.transport(p) for p in range(world) if p != rank}
    t = torch.ones(5)
    comm.all_reduce(t)
    comm.close()
    return kinds, float(t[0])


def test_pyring_transport_env_forces_tcp():
    env = {"PYRING_TRANSPORT": "tcp", "PYRING_SOCKET_IFNAME": "lo"}
    res = run_ranks(3, _transport_env, env=env, timeout=120)
    for _rank, (kinds, value) in enumerate(res):
        assert value == 3.0
        assert set(kinds.values()) == {"tcp"}, kinds
    res = run_ranks(3, _transport_env, timeout=120)
    assert all(set(k.values()) == {"shm"} for k, _ in res)


def _disagree(rank, world, store):
    try:
        pyring.init(rank, world, store, set_default=False, timeout=10,
                    transport="tcp" if rank == 1 else "auto")
        return "no error"
    except ValueError as e:
        return str(e)


def test_ranks_disagreeing_on_transport_are_named():
    res = run_ranks(2, _disagree, timeout=60)
    assert "transport='auto' here but ranks [1] use ['tcp']" in res[0]
    assert "transport='tcp' here but ranks [0] use ['auto']" in res[1]


def test_single_rank_needs_no_store(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    with pyring.init(set_default=False) as comm:
        t = torch.arange(5.0)
        comm.all_reduce(t, op="avg")
        assert torch.equal(t, torch.arange(5.0))
        assert comm.world_size == 1 and comm.local_world_size == 1


def test_cuda_query_works_without_gpu():
    n = pyring.cuda_device_count()
    if not pyring._C.built_with_cuda() or not torch.cuda.is_available():
        assert n == 0
    else:
        assert n == torch.cuda.device_count()
        assert "sm_" in pyring._C.cuda_device_name(0)
    with pytest.raises(ValueError, match="out of range"):
        pyring._C.cuda_device_name(n)


def _bad_ifname(rank, world, store):
    try:
        pyring.init(rank, world, store, set_default=False, timeout=10)
        return "no error"
    except ValueError as e:
        return str(e)


def test_unknown_socket_interface_is_named():
    res = run_ranks(2, _bad_ifname, env={"PYRING_SOCKET_IFNAME": "nosuch0"}, timeout=60)
    assert all("PYRING_SOCKET_IFNAME='nosuch0' is not an interface here" in r and "lo" in r
               for r in res), res
