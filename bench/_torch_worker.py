"""One rank of the pyring or torch-gloo allreduce benchmark (float32, sum).

Started by bench/allreduce.py as `python _torch_worker.py CONFIG.json`; the config
(see _common.py) also carries store_port (a TCPStore master on 127.0.0.1 held by the
parent) and, for pyring, segment_bytes (null: pyring's default). The parent sets
PYRING_TRANSPORT in the environment of pyring ranks.

Rank r's input is r+1 everywhere, so every output element must be W(W+1)/2 exactly.
Out-of-place #wrong counts wrong output elements plus input elements that changed.
torch gloo has no out-of-place allreduce: its out-of-place time is copy-into-out plus
in-place allreduce of out, both inside the timed region.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Any, Callable

import torch
from _common import Ops, load_config, run_worker


class _Buffers:
    """max-size float32 buffers allocated and touched once; each size uses prefixes."""

    def __init__(self, max_bytes: int, rank: int, world: int) -> None:
        n = max_bytes // 4
        self.mine = float(rank + 1)
        self.expected = float(world * (world + 1) // 2)
        self.src = torch.full((n,), self.mine, dtype=torch.float32)
        self.out = torch.full((n,), float("nan"), dtype=torch.float32)
        self.ip = torch.full((n,), self.mine, dtype=torch.float32)


class _TorchOps(Ops):
    def __init__(self, bufs: _Buffers, nbytes: int) -> None:
        n = nbytes // 4
        self.b = bufs
        self.src = bufs.src[:n]
        self.out = bufs.out[:n]
        self.ip = bufs.ip[:n]

    def refill_oop(self) -> None:
        self.out.fill_(float("nan"))

    def check_oop(self) -> int:
        bad_out = int((self.out != self.b.expected).sum())
        bad_in = int((self.src != self.b.mine).sum())
        return bad_out + bad_in

    def refill_ip(self) -> None:
        self.ip.fill_(self.b.mine)

    def check_ip(self) -> int:
        return int((self.ip != self.b.expected).sum())


def _wait(ret: Any) -> None:
    """Completes the call inside the timed region should all_reduce return a work handle."""
    wait = getattr(ret, "wait", None)
    if callable(wait):
        wait()


class _PyringOps(_TorchOps):
    def __init__(self, comm: Any, bufs: _Buffers, nbytes: int) -> None:
        super().__init__(bufs, nbytes)
        self.comm = comm

    def barrier(self) -> None:
        self.comm.barrier()

    def run_oop(self) -> None:
        _wait(self.comm.all_reduce(self.src, out=self.out))

    def run_ip(self) -> None:
        _wait(self.comm.all_reduce(self.ip))


class _GlooOps(_TorchOps):
    def __init__(self, dist: Any, bufs: _Buffers, nbytes: int) -> None:
        super().__init__(bufs, nbytes)
        self.dist = dist

    def barrier(self) -> None:
        self.dist.barrier()

    def run_oop(self) -> None:
        # No out-of-place allreduce in torch.distributed: the copy is part of the cost.
        self.out.copy_(self.src)
        self.dist.all_reduce(self.out)

    def run_ip(self) -> None:
        self.dist.all_reduce(self.ip)


def _store(cfg: dict[str, Any]) -> Any:
    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1",
        cfg["store_port"],
        cfg["world"],
        False,
        timeout=datetime.timedelta(seconds=cfg.get("store_timeout_s", 60)),
    )


def _setup_pyring(
    cfg: dict[str, Any], rank: int
) -> tuple[dict[str, Any], Callable[[int], Ops], Callable[[], None]]:
    import pyring  # ImportError here means "skip pyring"

    kwargs: dict[str, Any] = {}
    if cfg.get("segment_bytes") is not None:
        kwargs["segment_bytes"] = cfg["segment_bytes"]
    comm = pyring.init(rank=rank, world_size=cfg["world"], store=_store(cfg), **kwargs)
    bufs = _Buffers(max(cfg["sizes"]), rank, cfg["world"])
    info = {
        "pyring_version": getattr(pyring, "__version__", None),
        "pyring_file": getattr(pyring, "__file__", None),
        "PYRING_TRANSPORT": os.environ.get("PYRING_TRANSPORT"),
        "segment_bytes": cfg.get("segment_bytes"),
        "torch": torch.__version__,
    }
    return info, (lambda nbytes: _PyringOps(comm, bufs, nbytes)), comm.close


def _setup_gloo(
    cfg: dict[str, Any], rank: int
) -> tuple[dict[str, Any], Callable[[int], Ops], Callable[[], None]]:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        store=_store(cfg),
        rank=rank,
        world_size=cfg["world"],
        timeout=datetime.timedelta(seconds=cfg.get("op_timeout_s", 300)),
    )
    bufs = _Buffers(max(cfg["sizes"]), rank, cfg["world"])
    info = {
        "torch": torch.__version__,
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME"),
        "note": "out-of-place = out.copy_(in) + in-place all_reduce(out), both timed",
    }
    return info, (lambda nbytes: _GlooOps(dist, bufs, nbytes)), dist.destroy_process_group


def main() -> int:
    cfg = load_config()
    rank = int(cfg["rank"])
    torch.set_num_threads(1)
    setups = {"pyring": _setup_pyring, "gloo": _setup_gloo}
    setup = setups[cfg["lib"]]
    return run_worker(cfg, rank, lambda: setup(cfg, rank))


if __name__ == "__main__":
    sys.exit(main())
