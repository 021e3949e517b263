"""The processes of examples/train.py: how its ranks join the job (under torchrun, or through
the store of pyring.launch's ranks), pick their device, time pyring's allreduces and show
progress. Nothing here knows the model."""

from __future__ import annotations

import datetime
import functools
import os
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

import pyring


def watch_parent() -> None:
    """Exits this process as soon as the process that started it is gone."""
    parent = os.getppid()

    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=loop, daemon=True, name="watch-parent").start()


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def rank_device(device: str, local_rank: int, ranks_per_gpu: int) -> torch.device:
    """The device of the rank with this local rank: for "cuda", GPU local_rank // ranks_per_gpu
    (made current); "cpu" otherwise. Raises ValueError when that GPU does not exist."""
    if device != "cuda":
        return torch.device("cpu")
    index, gpus = local_rank // ranks_per_gpu, gpu_count()
    if index >= gpus:
        raise ValueError(f"local rank {local_rank} with --ranks-per-gpu {ranks_per_gpu} needs GPU "
                         f"{index}, but {gpus} are visible ({gpus * ranks_per_gpu} ranks fit)")
    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    return dev


def describe_device(dev: torch.device, ranks_per_gpu: int, threads: int) -> str:
    if dev.type == "cuda":
        return (f"{dev} ({torch.cuda.get_device_name(dev)}), up to {ranks_per_gpu} rank(s) per "
                f"GPU, {threads} torch thread(s)")
    return f"cpu, {threads} torch thread(s)"


def connect(sync: str, rank: int, world: int, store: Any, timeout: float,
            device: torch.device | None = None) -> Any:
    """Joins the job; returns the pyring Communicator for --sync pyring, bound to ``device``
    when it is a GPU (so that ranks of one host exchange device to device over cuda_ipc),
    else None (the default process group is then set up)."""
    td = datetime.timedelta(seconds=timeout)
    if sync == "pyring":
        bound = device if device is not None and device.type == "cuda" else None
        return (pyring.init(timeout=timeout, device=bound) if store is None
                else pyring.init(rank, world, store, timeout=timeout, device=bound))
    kw = {} if store is None else {"store": store, "rank": rank, "world_size": world}
    dist.init_process_group("pyring" if sync == "ddp-pyring" else "gloo", timeout=td, **kw)
    return None


def pyring_comm_of_default_group() -> Any:
    """The Communicator under the default process group when its backend is pyring."""
    group = dist.group.WORLD
    if getattr(group, "comm", None) is not None:  # Python backends are the group itself
        return group.comm
    try:
        return group._get_backend(torch.device("cpu")).comm
    except (AttributeError, RuntimeError):
        return None


class BusyTimer:
    """Times the asynchronous allreduces submitted on a pyring Communicator (by wrapping its
    all_reduce). The progress thread runs them in order, so work k occupies it at most from
    max(submitted_k, done_{k-1}) to done_k; `busy` sums those spans (including time spent
    waiting for the peers to submit the same bucket). Timestamps come from Python callbacks."""

    def __init__(self, comm: Any) -> None:
        self.busy, self.count, self.nbytes, self.last_done = 0.0, 0, 0, 0.0
        self.on = False
        self._lock = threading.Lock()
        original = comm.all_reduce

        def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            work = original(tensor, *args, **kwargs)
            if work is not None and self.on:
                self.count += 1
                self.nbytes += tensor.numel() * tensor.element_size()
                work.get_future().add_done_callback(functools.partial(self._done, t0))
            return work

        comm.all_reduce = all_reduce

    def _done(self, t0: float, _fut: Any) -> None:
        t1 = time.perf_counter()
        with self._lock:
            self.busy += t1 - max(t0, self.last_done)
            self.last_done = t1


class Progress:
    """tqdm when installed, else one line rewritten with \\r (one line per 10% when not a tty)."""

    def __init__(self, total: int) -> None:
        self.total, self.t0, self.last = total, time.perf_counter(), -1
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True)
        except ImportError:
            self.bar = None
        self.tty = sys.stderr.isatty()

    def update(self, n: int, loss: float) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            return
        tenth = 10 * n // self.total
        if not self.tty and tenth == self.last:
            return
        self.last = tenth
        dt = time.perf_counter() - self.t0
        eta = dt / n * (self.total - n)
        line = f"step {n}/{self.total}  loss {loss:.3f}  {dt:.0f}s elapsed, eta {eta:.0f}s"
        sys.stderr.write(("\r" + line) if self.tty else line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.tty:
            sys.stderr.write("\n")
