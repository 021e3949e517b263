"""1-bit Adam: Adam whose ranks exchange one bit per parameter per step once warmed up.

    opt = pyring.optim.OneBitAdam(model.parameters(), lr=1e-3, freeze_step=100)
    for x, y in data:                      # each rank its own shard; no DDP, no wrapper
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()                         # exchanges, then updates every parameter

Until ``freeze_step`` steps have run, each step averages the gradients across ranks on
``warmup_wire`` (one of ``STATELESS_WIRES``: fp32, fp16, bf16) and runs Adam. From then on the
second moment ``v`` stays frozen, each rank folds its own gradient into the momentum ``m``, and the
ranks average ``m`` on the one-bit wire with error feedback (pyring/optim/compression.py), divided
by Adam's frozen denominator while it travels (the same on every rank, so the average is unchanged,
and the one-bit scale then matches the update rather than the raw momentum): the update is ``lr *
m_hat / (sqrt(v_hat) + eps)`` with the bias corrections of Adam (``v_hat``'s frozen with ``v``).
Weight decay is Adam's L2 term, or AdamW's decoupled decay with ``decoupled_weight_decay=True``.
Once frozen, the denominator ``sqrt(v_hat)`` of each parameter group is floored at
``denominator_floor`` times its root mean square: an element whose variance froze small (a noisy
estimate from a short warm-up, or zero: no gradient arrived) would otherwise take outsized steps for
the rest of the run, up to ``lr * m / eps`` (DeepSpeed asks for a hand-made mask there). It is a
hyperparameter of the task: the shrunk char-level LM holds the baseline's loss at the default 0.01
and not at 0.1; the digits MLP (whose first layer sees pixels that are nearly always blank) at 0.1
and not at 0.01 (bench/convergence.py, README).

``state_dict()`` holds the step, ``m``, ``v`` and the one-bit residuals, so a job resumed from
a checkpoint continues bit for bit as if it had never stopped. Every rank must hold the same
parameters (shapes and order) and step together; parameters are float32.
"""

from __future__ import annotations

from typing import Any

import torch

from ..api import default
from ..runtime import devices as _devices
from ..runtime import symmetric as _symmetric
from .compression import STATELESS_WIRES, OneBitState, all_reduce_wire

_WARMUP_WIRES = STATELESS_WIRES  # the warm-up averages afresh: no error feedback to keep


def check_state_tensor(owner: str, name: str, t: Any, numel: int) -> None:
    """Refuses a checkpoint entry that is not a tensor of ``numel`` elements (``copy_`` would
    broadcast one element over the state, or fail later without naming the entry)."""
    if not isinstance(t, torch.Tensor) or t.numel() != numel:
        got = f"{t.numel()} elements" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{owner}.load_state_dict: '{name}' has {got}, these parameters "
                         f"need {numel}")


class OneBitAdam(torch.optim.Optimizer):
    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, freeze_step: int = 100,
                 comm: Any = None, decoupled_weight_decay: bool = False,
                 warmup_wire: str = "fp32", denominator_floor: float = 0.01) -> None:
        if not lr >= 0:
            raise ValueError(f"OneBitAdam: lr must be >= 0, got {lr!r}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"OneBitAdam: betas must lie in [0, 1), got {betas!r}")
        if not eps > 0 or not weight_decay >= 0:
            raise ValueError(f"OneBitAdam: eps must be > 0 and weight_decay >= 0, got "
                             f"{eps!r} and {weight_decay!r}")
        if not isinstance(freeze_step, int) or freeze_step < 1:
            raise ValueError(f"OneBitAdam: freeze_step must be an int >= 1 (Adam's variance "
                             f"needs warm-up steps), got {freeze_step!r}")
        if not denominator_floor >= 0:
            raise ValueError(f"OneBitAdam: denominator_floor must be >= 0, got "
                             f"{denominator_floor!r}")
        if warmup_wire not in _WARMUP_WIRES:
            raise ValueError(f"OneBitAdam: warmup_wire must be one of {_WARMUP_WIRES}, got "
                             f"{warmup_wire!r}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.freeze_step = freeze_step
        self.decoupled_weight_decay = bool(decoupled_weight_decay)
        self.warmup_wire = warmup_wire
        self.denominator_floor = float(denominator_floor)
        self.comm = comm if comm is not None else default()
        self._params = [p for g in self.param_groups for p in g["params"]]
        dev = self._params[0].device if self._params else torch.device("cpu")
        for i, p in enumerate(self._params):
            if p.dtype != torch.float32 or (p.device.type != "cpu"
                                                 and not _devices.is_torch_device(p)):
                raise ValueError(f"OneBitAdam: parameter {i} is {p.dtype} on {p.device}; it "
                                 f"takes float32 CPU or CUDA parameters")
            if p.device != dev:
                raise ValueError(f"OneBitAdam: parameter {i} is on {p.device} but parameter 0 "
                                 f"is on {dev}; all parameters must be on one device")
        n = sum(p.numel() for p in self._params)
        self.steps = 0
        # The optimizer's state lives on the parameters' device.
        self.m = torch.zeros(n, device=dev)
        self.v = torch.zeros(n, device=dev)
        self.onebit = OneBitState()
        # Its fp32 exchanges (warm-up, variance) run zero-copy where they can.
        self._grad = _symmetric.zeros(self.comm, n, torch.float32, dev)

    def _flat_grad(self) -> Any:
        off = 0
        for p in self._params:
            k = p.numel()
            if p.grad is None:
                self._grad[off:off + k].zero_()
            else:
                self._grad[off:off + k].copy_(p.grad.reshape(-1))
            off += k
        return self._grad

    def _per_group(self) -> list[tuple[dict, int, int]]:
        """(group, first element, element count) of every group's slice of the flat state."""
        out, off = [], 0
        for g in self.param_groups:
            k = sum(p.numel() for p in g["params"])
            out.append((g, off, k))
            off += k
        return out

    def _params_and_grad(self) -> tuple[Any, Any]:
        """The parameters and gradients, flat; Adam's L2 weight decay already in the latter."""
        g = self._flat_grad()
        flat_p = torch.cat([p.detach().reshape(-1) for p in self._params])
        for group, off, k in self._per_group():
            wd = group["weight_decay"]
            if wd and not self.decoupled_weight_decay:
                g[off:off + k].add_(flat_p[off:off + k], alpha=wd)
        return flat_p, g

    def _denominator(self, v_steps: int, floor: bool) -> Any:
        """sqrt(v_hat) + eps, v_hat corrected for ``v_steps`` updates of v; with ``floor``,
        each group's entries are floored at denominator_floor times their root mean square."""
        denom = torch.empty_like(self.v)
        for group, off, k in self._per_group():
            b2 = group["betas"][1]
            d = denom[off:off + k]
            torch.div(self.v[off:off + k], 1 - b2 ** max(v_steps, 1), out=d).sqrt_()
            if floor and k:
                # An element whose variance froze at (or near) zero would step by m / eps.
                d.clamp_(min=self.denominator_floor * float(d.square().mean().sqrt()))
            d.add_(group["eps"])
        return denom

    def _average_momentum(self, denom: Any) -> None:
        """Averages m on the one-bit wire. It travels divided by Adam's denominator, which is
        the same on every rank (so the average is unchanged): the one-bit scale then fits the
        update, and an element with a tiny variance cannot turn the chunk's scale into a huge
        step."""
        self.m.div_(denom)
        all_reduce_wire(self.comm, self.m, "avg", "onebit", self.onebit)
        self.m.mul_(denom)

    def _apply(self, flat_p: Any, denom: Any) -> None:
        """flat_p -= the Adam update (decoupled decay included), and the parameters take it."""
        for group, off, k in self._per_group():
            b1 = group["betas"][0]
            lr, wd = group["lr"], group["weight_decay"]
            update = self.m[off:off + k] / (1 - b1 ** self.steps) / denom[off:off + k]
            if wd and self.decoupled_weight_decay:
                flat_p[off:off + k].mul_(1 - lr * wd)
            flat_p[off:off + k].add_(update, alpha=-lr)
        self._write_back(flat_p)

    def _write_back(self, flat_p: Any) -> None:
        off = 0
        for p in self._params:
            k = p.numel()
            p.copy_(flat_p[off:off + k].view_as(p))
            off += k

    def _begin_step(self, closure: Any) -> tuple:
        """The closure's loss (None without one), and this step's flat parameters and
        gradient; counts the step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        flat_p, g = self._params_and_grad()
        self.steps += 1
        return loss, flat_p, g

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss, flat_p, g = self._begin_step(closure)
        frozen = self.steps > self.freeze_step
        if not frozen:
            all_reduce_wire(self.comm, g, "avg", self.warmup_wire)
        for group, off, k in self._per_group():
            b1, b2 = group["betas"]
            m = self.m[off:off + k]
            m.mul_(b1).add_(g[off:off + k], alpha=1 - b1)
            if not frozen:
                self.v[off:off + k].mul_(b2).addcmul_(g[off:off + k], g[off:off + k],
                                                      value=1 - b2)
        denom = self._denominator(min(self.steps, self.freeze_step), frozen)
        if frozen:
            # Only the momentum travels, compressed; every rank ends with the same m.
            self._average_momentum(denom)
        self._apply(flat_p, denom)
        return loss

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["onebit_adam"] = {"steps": self.steps, "m": self.m.clone(), "v": self.v.clone(),
                             "residuals": self.onebit.state_dict(),
                             "freeze_step": self.freeze_step}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        sd = dict(state_dict)
        mine = sd.pop("onebit_adam", None)
        if mine is None:
            raise ValueError("OneBitAdam.load_state_dict: no 'onebit_adam' entry (not a "
                             "OneBitAdam checkpoint)")
        if "zero_one_adam" in sd:
            raise ValueError("OneBitAdam.load_state_dict: this is a ZeroOneAdam checkpoint; load "
                             "it into ZeroOneAdam")
        for name in ("m", "v"):
            check_state_tensor("OneBitAdam", name, mine[name], self.m.numel())
        super().load_state_dict(sd)
        self.steps = int(mine["steps"])
        self.freeze_step = int(mine["freeze_step"])
        self.m.copy_(mine["m"])
        self.v.copy_(mine["v"])
        self.onebit.load_state_dict(mine["residuals"])
