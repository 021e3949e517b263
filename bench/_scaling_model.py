"""bench/training.py --mode scaling: the cost model's speedup at rank counts the machine lacks
(more GPUs than it has, or ranks on devices of their own).

For each method, from the runs that were measured:
  compute   the step of one rank alone (compute x1): every rank has a device of its own;
  comm(N)   one allreduce of the gradients' B bytes, modelled as the ring's
            2(N-1) * latency + 2(N-1)/N * B / bandwidth, with latency and bandwidth fitted by
            least squares to alone-LIB at every measured N > 1 (with one N, latency is the
            link's figure from the transport registry and bandwidth what that point leaves);
  overlap   the method's overlap at its largest measured N (0 where not measured).
  step(N) = compute + (1 - overlap) * comm(N);  speedup(N) = N * compute / step(N).
A measured N is predicted too, so that a reader sees how far the model is from the run.
"""

from __future__ import annotations

from typing import Any

from _train_step import LIB

from pyring import _C


def fit_ring(
    points: list[tuple[int, float]], nbytes: float, latency0: float
) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of the ring model through (N, seconds) points."""
    rows = [(2.0 * (n - 1), 2.0 * (n - 1) / n * nbytes, t) for n, t in points if n > 1 and t]
    if not rows:
        raise ValueError("no measured allreduce at more than one rank")
    if len({a for a, _, _ in rows}) >= 2:
        saa = sum(a * a for a, _, _ in rows)
        sbb = sum(b * b for _, b, _ in rows)
        sab = sum(a * b for a, b, _ in rows)
        sat = sum(a * t for a, _, t in rows)
        sbt = sum(b * t for _, b, t in rows)
        det = saa * sbb - sab * sab
        lat = (sat * sbb - sbt * sab) / det
        inv_bw = (saa * sbt - sab * sat) / det
        if lat >= 0 and inv_bw > 0:
            return lat, 1.0 / inv_bw
    # One N (or a fit that leaves the physical range): the link's latency, the rest bandwidth.
    a, b, t = max(rows, key=lambda r: r[0])
    return latency0, b / max(t - a * latency0, 1e-9)


def predict(rows: list[dict[str, Any]], cfg: dict[str, Any], targets: list[int]) -> list[dict]:
    """Predicted rows (as summarize's, with "predicted": True and the model's figures)."""
    base = next((r["step_s"] for r in rows if r["method"] == "compute" and r["ranks"] == 1), None)
    nbytes = cfg.get("params", 0) * 4.0
    if not base or not nbytes:
        return []
    transport = "cuda_ipc" if cfg.get("gpus") else "shm"
    latency0 = _C.TRANSPORT_COSTS[transport][0]
    out = []
    for m in sorted({r["method"] for r in rows} - {"compute"}):
        mine = [r for r in rows if r["method"] == m and r["step_s"]]
        points = [(r["ranks"], r["comm_s"]) for r in mine if r["ranks"] > 1 and r.get("comm_s")]
        if not points:
            continue
        lat, bw = fit_ring(points, nbytes, latency0)
        top = max(mine, key=lambda r: r["ranks"])
        overlap = top.get("overlap") or 0.0
        for n in targets:
            comm = 2 * (n - 1) * lat + 2 * (n - 1) / n * nbytes / bw if n > 1 else 0.0
            step = base + (1 - overlap) * comm
            out.append({
                "method": m, "ranks": n, "predicted": True, "step_s": step,
                "speedup": n * base / step, "efficiency": base / step,
                "model": {"compute_s": base, "comm_s": comm, "latency_s": lat,
                          "bandwidth_Bps": bw, "overlap": overlap, "lib": LIB[m],
                          "fitted_from": points},
            })
    return out


def print_predictions(pred: list[dict[str, Any]]) -> None:
    if not pred:
        return
    print("\nthe cost model's prediction (bench/_scaling_model.py):")
    print(f"{'method':11s} {'ranks':>5s} {'step ms':>9s} {'speedup':>7s} {'comm ms':>8s} "
          f"{'overlap':>7s}  fitted latency, bandwidth")
    for r in pred:
        md = r["model"]
        print(f"{r['method']:11s} {r['ranks']:5d} {r['step_s'] * 1e3:9.1f} {r['speedup']:7.2f} "
              f"{md['comm_s'] * 1e3:8.2f} {md['overlap']:7.0%}  {md['latency_s'] * 1e6:.1f} us,"
              f" {md['bandwidth_Bps'] / 1e9:.2f} GB/s")
