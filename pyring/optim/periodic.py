"""Periodic parameter averaging (SparkNet's tau local steps; torch's post-local SGD).

    opt = pyring.PeriodicAveraging(torch.optim.AdamW(model.parameters()), period=8,
                                   warmup_steps=100)
    for x, y in data:                  # each rank its own shard
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

The first ``warmup_steps`` steps average the gradients (float32) before the optimizer steps, as
synchronous data parallelism does. After them each rank steps on its own gradients, and every
``period`` steps the ranks average their parameters: what each moved since the last average travels
on ``wire`` (a wire without error feedback: ``STATELESS_WIRES``; the parameters themselves stay
float32; the first average, with no earlier one to measure from, is float32), so every rank leaves
the average with the same parameters. With ``average_state=True`` the optimizer's state tensors
shaped like their parameter (Adam's moments) are averaged too, in float32. Every rank must wrap the
same parameters and step together; ``state_dict()`` holds the optimizer's state and the wrapper's
step count.
"""

from __future__ import annotations

from typing import Any

from ..api import default
from .compression import STATELESS_WIRES, all_reduce_wire

_WIRES = STATELESS_WIRES  # parameters are averaged afresh: no error feedback to keep


class PeriodicAveraging:
    def __init__(self, optimizer: Any, period: int = 4, warmup_steps: int = 0,
                 average_state: bool = False, wire: str = "fp32", comm: Any = None) -> None:
        if not isinstance(period, int) or period < 1:
            raise ValueError(f"PeriodicAveraging: period must be an int >= 1, got {period!r}")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"PeriodicAveraging: warmup_steps must be an int >= 0, got "
                             f"{warmup_steps!r}")
        if wire not in _WIRES:
            raise ValueError(f"PeriodicAveraging: wire must be one of {_WIRES}, got {wire!r}")
        self.optimizer = optimizer
        self.period = period
        self.warmup_steps = warmup_steps
        self.average_state = bool(average_state)
        self.wire = wire
        self.comm = comm if comm is not None else default()
        self.steps = 0
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        for i, p in enumerate(self.params):
            if not p.is_floating_point():
                raise ValueError(f"PeriodicAveraging: parameter {i} is {p.dtype}")
        self._anchor: Any = None  # the parameters at the last average, flat, float32

    @property
    def param_groups(self) -> list:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def _flat(self) -> Any:
        import torch

        return torch.cat([p.detach().reshape(-1).float() for p in self.params])

    def _write(self, flat: Any) -> None:
        off = 0
        for p in self.params:
            k = p.numel()
            p.data.copy_(flat[off:off + k].view_as(p))
            off += k

    def _average_grads(self) -> None:
        import torch

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        self.comm.all_reduce(flat, op="avg")
        off = 0
        for p in self.params:
            k = p.numel()
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.copy_(flat[off:off + k].view_as(p))
            off += k

    def average(self) -> None:
        """Averages the parameters (and, with average_state, the state) across ranks now."""
        flat = self._flat()
        if self._anchor is None or self.wire == "fp32":
            self.comm.all_reduce(flat, op="avg")
        else:
            delta = flat - self._anchor
            all_reduce_wire(self.comm, delta, "avg", self.wire)
            flat = self._anchor + delta
        self._write(flat)
        self._anchor = flat
        if self.average_state:
            for p in self.params:
                for t in self.optimizer.state.get(p, {}).values():
                    if hasattr(t, "shape") and t.shape == p.shape and t.is_floating_point():
                        self.comm.all_reduce(t, op="avg")

    def step(self, closure: Any = None) -> Any:
        self.steps += 1
        if self.steps <= self.warmup_steps:
            self._average_grads()
            loss = self.optimizer.step(closure)
            if self.steps == self.warmup_steps:
                self._anchor = self._flat()  # every rank holds the same parameters here
            return loss
        loss = self.optimizer.step(closure)
        if (self.steps - self.warmup_steps) % self.period == 0:
            self.average()
        return loss

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "steps": self.steps,
                "anchor": None if self._anchor is None else self._anchor.clone()}

    def load_state_dict(self, sd: dict) -> None:
        self.optimizer.load_state_dict(sd["optimizer"])
        self.steps = int(sd["steps"])
        self._anchor = None if sd["anchor"] is None else sd["anchor"].clone()
