"""The training step of bench/training.py, the same in both of its modes.

Workload: CharGPT (pyring/tools/workload.py) of cfg's dim, layers, heads and seq, its weights from
seed 0 on every rank (no broadcast is needed for timing); AdamW (lr LR); cfg["batch"] windows
of seq + 1 bytes per rank and step, drawn at random from this rank's 1/world shard of
cfg["data_mb"] MiB of the corpus. Methods (what averages the gradients):
  compute         nothing: the bare model
  lockstep        nothing, but the ranks meet once per step: one 1-element pyring allreduce
                  after backward
  pyring          pyring.DistributedOptimizer (cfg["bucket_mb"] MiB buckets, gradients as
                  bucket views); synchronize() after backward waits for the buckets in flight
  ddp-LIB         DistributedDataParallel(gradient_as_bucket_view=True) on backend LIB
                  (pyring, gloo, nccl), DDP's own 25 MiB buckets
  ddp-LIB-copy    the same DDP with its defaults (gradients copied into the buckets and back)
A step, timed per phase: zero_grad and forward, backward (DDP waits for its buckets here),
sync (pyring's synchronize(), lockstep's allreduce; 0 elsewhere), the optimizer's step. The
batch is drawn before the clock starts. On a GPU every phase ends with a device synchronize.
"""

from __future__ import annotations

from time import perf_counter as _now
from typing import Any, Callable

import torch

import pyring
from pyring.tools.workload import CharGPT, get_batch, load_corpus

METHODS = ("pyring", "ddp-pyring", "ddp-gloo", "ddp-nccl", "ddp-pyring-copy", "ddp-gloo-copy",
           "pyring-private")
LIB = {m: m.split("-")[1] if m.startswith("ddp-") else "pyring" for m in METHODS}
LR = 1e-3
# What a step records, in seconds: the whole step, then its phases ("waits": the sync phase).
FIELDS = ("step", "forward", "backward", "waits", "optimizer")


def gradient_elements(cfg: dict[str, Any]) -> int:
    """The model's parameter count (= float32 gradient elements), without building it."""
    with torch.device("meta"):
        model = CharGPT(cfg["dim"], cfg["layers"], cfg["heads"], cfg["seq"])
    return sum(p.numel() for p in model.parameters())


class Batches:
    """Training windows for one rank of `world`, from its own shard of the corpus."""

    def __init__(self, cfg: dict[str, Any], rank: int, world: int, device: torch.device):
        self.data = load_corpus(int(cfg["data_mb"] * 2**20))
        shard = len(self.data) // world
        self.lo, self.hi = rank * shard, (rank + 1) * shard - cfg["seq"] - 1
        self.n, self.seq, self.device = cfg["batch"], cfg["seq"], device
        self.gen = torch.Generator().manual_seed(rank)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(self.lo, self.hi, (self.n,), generator=self.gen)
        return get_batch(self.data, starts, self.seq, self.device)


def _waiter(device: torch.device) -> Callable[[], None]:
    """Waits for the work queued on `device` (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


class Trainer:
    """One rank's model and optimizer for one method. `comm` is the pyring Communicator of
    pyring and lockstep, `group` DDP's process group (None: the default group)."""

    def __init__(
        self,
        method: str,
        cfg: dict[str, Any],
        device: torch.device,
        comm: Any = None,
        group: Any = None,
    ) -> None:
        torch.manual_seed(0)
        self.model = CharGPT(cfg["dim"], cfg["layers"], cfg["heads"], cfg["seq"]).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.net: torch.nn.Module = self.model
        self.sync: Callable[[], Any] | None = None
        if method in ("pyring", "pyring-private"):
            self.opt = pyring.DistributedOptimizer(
                self.opt,
                named_parameters=self.model.named_parameters(),
                comm=comm,
                bucket_bytes=int(cfg["bucket_mb"] * 2**20),
                # pyring: symmetric buckets where the exchange runs zero-copy; -private: never
                symmetric_buckets=None if method == "pyring" else False,
            )
            self.sync = self.opt.synchronize
        elif method == "lockstep":
            token = torch.zeros(1)
            self.sync = lambda: comm.all_reduce(token)
        elif method in METHODS:
            self.net = torch.nn.parallel.DistributedDataParallel(
                self.model,
                process_group=group,
                device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=not method.endswith("-copy"),
            )
        elif method != "compute":
            raise ValueError(f"unknown method {method!r}")
        self.params = sum(p.numel() for p in self.model.parameters())
        self.wait = _waiter(device)

    def step(self, batches: Batches) -> tuple[float, ...]:
        """One training step on the next batch; its times, as FIELDS."""
        x, y = batches.next()
        wait = self.wait
        wait()  # for the batch's copy to the device
        t0 = _now()
        self.opt.zero_grad(set_to_none=True)
        loss = self.net(x, y)
        wait()
        t1 = _now()
        loss.backward()
        wait()
        t2 = t3 = _now()
        if self.sync is not None:
            self.sync()
            t3 = _now()
        self.opt.step()
        wait()
        t4 = _now()
        return t4 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3


class Alone:
    """One allreduce of a flat float32 tensor of `n` elements (the gradients' size) with
    `lib` and nothing else: pyring's average on `comm`, or torch.distributed's sum on the
    default process group. The tensor is refilled untimed before each."""

    def __init__(self, lib: str, n: int, device: torch.device, comm: Any = None) -> None:
        self.flat = torch.empty(n, device=device)
        if lib == "pyring":
            self.run = lambda: comm.all_reduce(self.flat, op="avg")
        else:
            self.run = lambda: torch.distributed.all_reduce(self.flat)
        self.wait = _waiter(device)

    def step(self, batches: Batches | None = None) -> tuple[float, ...]:
        """One allreduce; its time, as FIELDS (every phase 0)."""
        self.flat.fill_(1.0)
        self.wait()
        t0 = _now()
        self.run()
        self.wait()
        return _now() - t0, 0.0, 0.0, 0.0, 0.0
