"""The link model behind bench/costmodel.py, one parameter set per link class (n bytes, N ranks):

  ring    T = 2(N-1) alpha + 2(N-1)/N n (f / beta_c + (1 - f) / beta_m),   f = min(1, S / n)
  direct  T = (N-1) (alpha_d + n / beta_d)       (pyring's small-message algorithm, <= 16 KiB)

beta_c is the bandwidth while a buffer stays in cache, beta_m once it streams from memory: of a
buffer larger than S, the share S/n still moves at cache speed. A link without such an effect
fits with beta_c = beta_m. A token-bucket link (tc tbf) instead sends the first B bytes of each
step at beta_c, f = min(1, B N / n): its parameters carry "burst" = B (fit with split="step").
Both betas are *effective*: they fold in the local reduction. Fitted by least squares on
relative error with every coefficient >= 0, S (or B) by search over powers of two.
"""

from __future__ import annotations

import math
from typing import Any

COLS = ("alpha", "inv_beta_c", "inv_beta_m", "alpha_d", "inv_beta_d")


def features(algo: str, world: int, size: float, spill: float) -> list[float]:
    """T = features . coefficients (in COLS order)."""
    if algo == "direct":
        return [0.0, 0.0, 0.0, world - 1.0, (world - 1.0) * size]
    f = min(1.0, spill / size) if size > 0 else 1.0
    b = 2.0 * (world - 1) / world * size
    return [2.0 * (world - 1), b * f, b * (1 - f), 0.0, 0.0]


def _solve(a: list[list[float]], y: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(y)
    m = [row[:] + [y[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                k = m[r][c] / m[c][c]
                m[r] = [x - k * z for x, z in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def _nnls(rows: list[tuple[list[float], float]]) -> list[float]:
    """Coefficients >= 0 minimising sum((features . x / t - 1)^2): least squares on the columns
    still active, dropping the most negative one until none is negative."""
    active = [j for j in range(len(COLS)) if any(f[j] for f, _ in rows)]
    while active:
        scale = [max(abs(f[j]) / t for f, t in rows) for j in active]
        xs = [[f[j] / t / s for j, s in zip(active, scale)] for f, t in rows]
        ata = [[sum(r[i] * r[k] for r in xs) for k in range(len(active))]
               for i in range(len(active))]
        aty = [sum(r[i] for r in xs) for i in range(len(active))]
        sol = _solve(ata, aty)
        if sol is None:
            active.pop()
            continue
        worst = min(range(len(active)), key=lambda i: sol[i])
        if sol[worst] >= 0:
            x = [0.0] * len(COLS)
            for j, v, s in zip(active, sol, scale):
                x[j] = v / s
            return x
        active.pop(worst)
    return [0.0] * len(COLS)


def predict(params: dict[str, Any], algo: str, world: int, size: float) -> float:
    """Allreduce seconds; a class fitted without direct points answers direct with the ring."""
    if world <= 1:
        return 0.0
    if algo == "direct" and params.get("beta_d"):
        return (world - 1) * (params["alpha_d"] + size / params["beta_d"])
    return 2 * (world - 1) * step(params, size, world)


def step(params: dict[str, Any], size: float, world: int, flows: int = 1) -> float:
    """One of the 2(N-1) steps of a ring over a buffer (or a tree's region) of `size` bytes on
    `world` ranks: alpha plus size/world bytes for each of `flows` flows sharing the link."""
    b = flows * size / world  # bytes over the link in this step
    if params.get("burst"):
        f = min(1.0, params["burst"] / b) if b > 0 else 1.0
    else:
        f = min(1.0, params["spill"] / size) if size > 0 else 1.0
    return params["alpha"] + b * (f / params["beta_c"] + (1 - f) / params["beta_m"])


def fit(points: list[dict[str, Any]], split: str | None = "buffer") -> dict[str, Any]:
    """Points carry algo, world, size and t (s); returns the parameters with the smallest worst
    relative error over the spill sizes S: 4 KiB .. 1 GiB of the buffer (split 'buffer'), or
    the burst B: 1 KiB .. 64 MiB of each step (split 'step'); None fits one beta."""
    best: tuple[float, dict[str, Any]] | None = None
    ks = {"buffer": range(12, 31), "step": range(10, 27)}.get(split or "", [])
    for spill in [float(2**k) for k in ks] or [math.inf]:
        per = split == "step"  # f = B / (n/N) is features' S / n with S = B N
        rows = [(features(p["algo"], p["world"], p["size"], spill * (p["world"] if per else 1)),
                 p["t"]) for p in points]
        x = _nnls(rows)
        worst = max(abs(sum(a * b for a, b in zip(f, x)) / t - 1) for f, t in rows)
        if best is None or worst < best[0] - 1e-12:
            params = params_of(x, math.inf if per else spill)
            best = (worst, {**params, "burst": spill} if per else params)
    assert best is not None
    return best[1]


def params_of(x: list[float], spill: float) -> dict[str, Any]:
    inv = dict(zip(COLS, x))
    bc = 1 / inv["inv_beta_c"] if inv["inv_beta_c"] > 0 else math.inf
    bm = 1 / inv["inv_beta_m"] if inv["inv_beta_m"] > 0 else bc
    return {"alpha": inv["alpha"], "beta_c": bc, "beta_m": bm, "spill": spill,
            "alpha_d": inv["alpha_d"],
            "beta_d": 1 / inv["inv_beta_d"] if inv["inv_beta_d"] > 0 else None}


def preset(alpha: float, beta: float) -> dict[str, Any]:
    """A link given as one latency and one bandwidth."""
    return {"alpha": alpha, "beta_c": beta, "beta_m": beta, "spill": math.inf, "alpha_d": 0.0,
            "beta_d": None}
