"""What users of torch meet: pyring's errors are torch.distributed.DistBackendError (so a DDP
job that loses a peer can catch what it catches for NCCL and gloo), and the backend is known
to torch without `import pyring` (torch's entry point for out-of-tree backends)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import pyring
from pyring.launch import run_ranks


def test_errors_are_torch_backend_errors():
    for cls in (pyring.Error, pyring.CommError, pyring.CommTimeout, pyring.CudaError,
                pyring.DesyncError):
        assert issubclass(cls, dist.DistBackendError), cls
    assert issubclass(pyring.CommTimeout, TimeoutError)


def _ddp_loses_a_peer(rank, world, store):
    os.environ["PYRING_TIMEOUT"] = "20"
    dist.init_process_group("pyring", store=store, rank=rank, world_size=world)
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(3):
        if rank == 1 and step == 1:
            os._exit(3)  # the peer dies between two steps
        try:
            net(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        except dist.DistBackendError as e:  # what a DDP user catches for NCCL and gloo
            return type(e).__name__, str(e)
    return None


def test_ddp_job_that_loses_a_peer_catches_dist_backend_error():
    got = run_ranks(2, _ddp_loses_a_peer, timeout=120, allow_failures=True)
    caught = got[0]
    assert caught is not None, "rank 0 finished without an error"
    name, message = caught
    assert "rank 1" in message, message


def test_backend_known_without_importing_pyring(tmp_path):
    eps = importlib.metadata.entry_points(group="torch.backends")
    if not any(ep.value.startswith("_pyring_autoload") for ep in eps):
        pytest.skip("pyring is not installed (no entry point): run from an installed package")
    script = textwrap.dedent("""
        import sys
        import torch
        import torch.distributed as dist
        assert "pyring" not in sys.modules, "torch's import loaded all of pyring"
        dist.init_process_group("pyring", store=dist.HashStore(), rank=0, world_size=1)
        x = torch.ones(3)
        dist.all_reduce(x)
        print(dist.get_backend(), x.tolist())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["pyring", "[1.0,", "1.0,", "1.0]"], out.stdout
