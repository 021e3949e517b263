"""0/1 Adam (Lu et al., 2022): 1-bit Adam that also updates its variance ever more rarely and,
once the model is stable, skips synchronisation rounds with local steps.

    opt = pyring.optim.ZeroOneAdam(model.parameters(), lr=1e-3, var_freeze_step=100)
    for x, y in data:                      # each rank its own shard; no DDP, no wrapper
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

Three kinds of step, on every rank together:

- **variance steps** (until ``var_freeze_step``, on a schedule whose gaps double after every
  ``var_update_scaler`` of them: with 4, steps 1-4 each, then every 2nd for 8 steps, every
  4th for 16...):
  the gradients are averaged on ``var_wire`` (one of ``STATELESS_WIRES``) and both moments
  update, as in Adam;
- **momentum steps** (the other steps until ``var_freeze_step``): the variance stays as it
  was, each rank folds its own gradient into the momentum, and the ranks average the momentum
  on the one-bit wire with error feedback, divided by Adam's denominator while it travels, as
  in :class:`pyring.optim.OneBitAdam`;
- **local steps** (after ``var_freeze_step``; the variance is frozen for good): each rank
  updates its momentum and parameters from its own gradient, with nothing exchanged, and
  accumulates its parameter change. Every ``H`` steps the ranks average the accumulated
  change on the one-bit wire (its own error feedback carries what compression dropped into
  the next round), set the parameters to the last synchronised ones minus that average, and
  rebuild the momentum from it, so that every rank again holds the same parameters and
  momentum. ``H`` starts at 1 and doubles after every ``local_step_scaler`` rounds, up to
  ``local_step_clipper``; it also grows as the learning rate falls below its value at the
  freeze (``H`` times that ratio, still clipped): a smaller step moves the model less between
  rounds.

The defaults held the float32 AdamW baseline's loss at 27x fewer bytes on the char-level LM
and, with ``local_step_scaler=16`` and a denominator floor of 0.1, on the digits MLP
(``var_freeze_step=20`` of 400 steps; bench/convergence.py, docs/compression.md). Bias
corrections and the denominator floor are :class:`OneBitAdam`'s, with the second
moment's correction counting its updates. ``state_dict()`` holds every counter, the moments,
the last synchronised parameters, the accumulated change and both one-bit states, so a job
resumed from a checkpoint continues bit for bit. Parameters are float32, on one device.
"""

from __future__ import annotations

from typing import Any

import torch

from .compression import OneBitState, all_reduce_wire
from .onebit_adam import _WARMUP_WIRES, OneBitAdam, check_state_tensor

_COUNTERS = ("steps", "v_updates", "var_interval", "var_run", "local_steps", "interval",
             "rounds")


class ZeroOneAdam(OneBitAdam):
    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, var_freeze_step: int = 100,
                 var_update_scaler: int = 4, local_step_scaler: int = 32,
                 local_step_clipper: int = 4, comm: Any = None,
                 decoupled_weight_decay: bool = False, var_wire: str = "bf16",
                 denominator_floor: float = 0.01) -> None:
        for name, value in (("var_update_scaler", var_update_scaler),
                            ("local_step_scaler", local_step_scaler),
                            ("local_step_clipper", local_step_clipper)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ZeroOneAdam: {name} must be an int >= 1, got {value!r}")
        if var_wire not in _WARMUP_WIRES:
            raise ValueError(f"ZeroOneAdam: var_wire must be one of {_WARMUP_WIRES}, got "
                             f"{var_wire!r}")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         freeze_step=var_freeze_step, comm=comm,
                         decoupled_weight_decay=decoupled_weight_decay, warmup_wire=var_wire,
                         denominator_floor=denominator_floor)
        self.var_update_scaler = var_update_scaler
        self.local_step_scaler = local_step_scaler
        self.local_step_clipper = local_step_clipper
        self.v_updates = 0  # the second moment's updates, for its bias correction
        self.var_interval = 1  # steps between variance updates
        self.var_run = 0  # variance updates at the current interval
        self.local_steps = 0  # local steps since the last round
        self.interval = 1  # local steps per round (H)
        self.rounds = 0
        self.freeze_lr: list[float] | None = None  # each group's lr at the freeze
        self.anchor: Any = None  # the parameters at the last round
        self.change = torch.zeros_like(self.m)  # this rank's parameter change since then
        self.sync = OneBitState()  # error feedback of the rounds

    def _next_interval(self) -> int:
        h = 2 ** (self.rounds // self.local_step_scaler)
        if self.freeze_lr:
            ratios = [lr0 / g["lr"] for lr0, g in zip(self.freeze_lr, self.param_groups)
                      if g["lr"] > 0]
            h = int(h * max(1.0, min(ratios, default=1.0)))
        return max(1, min(h, self.local_step_clipper))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss, flat_p, g = self._begin_step(closure)
        if self.steps > self.freeze_step:
            self._local_step(g, flat_p)
            return loss
        self._synchronous_step(g)
        self._apply(flat_p, self._denominator(self.v_updates, self.v_updates > 0 and
                                              self.steps > 1))
        return loss

    def _synchronous_step(self, g: Any) -> None:
        variance = (self.steps - 1) % self.var_interval == 0
        if variance:
            all_reduce_wire(self.comm, g, "avg", self.warmup_wire)
        for group, off, k in self._per_group():
            b1, b2 = group["betas"]
            self.m[off:off + k].mul_(b1).add_(g[off:off + k], alpha=1 - b1)
            if variance:
                self.v[off:off + k].mul_(b2).addcmul_(g[off:off + k], g[off:off + k],
                                                      value=1 - b2)
        if variance:
            self.v_updates += 1
            self.var_run += 1
            if self.var_run == self.var_update_scaler:
                self.var_interval *= 2
                self.var_run = 0
            return
        self._average_momentum(self._denominator(self.v_updates, True))

    def _local_step(self, g: Any, flat_p: Any) -> None:
        if self.anchor is None:  # the first step after the freeze
            self.anchor = flat_p.clone()
            self.freeze_lr = [group["lr"] for group in self.param_groups]
        for group, off, k in self._per_group():
            b1 = group["betas"][0]
            self.m[off:off + k].mul_(b1).add_(g[off:off + k], alpha=1 - b1)
        denom = self._denominator(self.v_updates, True)
        before = flat_p.clone()
        self._apply(flat_p, denom)
        self.change.add_(before - flat_p)
        self.local_steps += 1
        if self.local_steps < self.interval:
            return
        # A round: every rank's change since the last one, averaged on the one-bit wire.
        all_reduce_wire(self.comm, self.change, "avg", "onebit", self.sync)
        flat_p.copy_(self.anchor).sub_(self.change)
        self.anchor.copy_(flat_p)
        # The momentum that moves the parameters by the averaged change per step, the same on
        # every rank.
        for group, off, k in self._per_group():
            b1, lr = group["betas"][0], group["lr"]
            if lr > 0:
                self.m[off:off + k].copy_(self.change[off:off + k]).mul_(
                    denom[off:off + k]).mul_((1 - b1 ** self.steps) / (lr * self.local_steps))
        self.change.zero_()
        self.local_steps = 0
        self.rounds += 1
        self.interval = self._next_interval()
        self._write_back(flat_p)

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["zero_one_adam"] = {
            **{c: getattr(self, c) for c in _COUNTERS},
            "freeze_lr": self.freeze_lr,
            "anchor": None if self.anchor is None else self.anchor.clone(),
            "change": self.change.clone(), "sync": self.sync.state_dict(),
            "schedule": (self.var_update_scaler, self.local_step_scaler,
                         self.local_step_clipper)}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        sd = dict(state_dict)
        mine = sd.pop("zero_one_adam", None)
        if mine is None:
            raise ValueError("ZeroOneAdam.load_state_dict: no 'zero_one_adam' entry (not a "
                             "ZeroOneAdam checkpoint)")
        check_state_tensor("ZeroOneAdam", "change", mine["change"], self.m.numel())
        if mine["anchor"] is not None:
            check_state_tensor("ZeroOneAdam", "anchor", mine["anchor"], self.m.numel())
        super().load_state_dict(sd)
        for c in _COUNTERS:
            setattr(self, c, int(mine[c]))
        self.freeze_lr = mine["freeze_lr"]
        self.anchor = None if mine["anchor"] is None else mine["anchor"].clone()
        self.change.copy_(mine["change"])
        self.sync.load_state_dict(mine["sync"])
        self.var_update_scaler, self.local_step_scaler, self.local_step_clipper = \
            mine["schedule"]
