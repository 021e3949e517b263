"""bench/training.py --mode scaling: DEFINITIONS, the terminal table and the PNG of speedup
against ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEFINITIONS = {  # the contract of every reported number
    "step": "the slowest rank's mean iteration time over its timed iterations (s), i.e. "
    "1 / its throughput; of the repeats, the median one (median_iter_max_s: median "
    "over iterations of the slowest rank's time)",
    "samples_per_s": "ranks * batch / step",
    "speedup": "samples_per_s / samples_per_s of 'compute x1' (one rank, no communication)",
    "efficiency": "speedup / ranks",
    "contention": "compute(N) / compute(1): slowdown of the computation from sharing the box",
    "comm_s": "one allreduce of the gradients' size with the method's library, N ranks, alone "
    "(pyring's avg, torch.distributed's sum)",
    "exposed_s": "step(method, N) - step(compute, N)",
    "overlap": "1 - exposed / comm, clipped to [0, 1] (overlap_raw: unclipped)",
    "predicted": "the cost model's step and speedup at each --predict rank count, every rank on "
    "a device of its own (bench/_scaling_model.py)",
}


def _f(v: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-".rjust(int(fmt.split(".")[0])) if v is None else format(v * scale, fmt)


def print_table(rows: list[dict[str, Any]], cfg: dict[str, Any]) -> None:
    print(
        f"\nCharGPT {cfg['layers']}x{cfg['dim']}: {cfg.get('params', 0) / 1e6:.2f} M parameters"
        f" ({cfg.get('params', 0) * 4 / 2**20:.1f} MiB of float32 gradients); batch "
        f"{cfg['batch']} x seq {cfg['seq']} per rank; {cfg['threads']} thread(s)/rank"
    )
    hdr = (
        f"{'method':11s} {'ranks':>5s} {'step ms':>9s} {'samples/s':>9s} {'speedup':>7s} "
        f"{'effic.':>6s} {'comm ms':>8s} {'comm %':>6s} {'exposed':>8s} {'overlap':>7s}"
    )
    print(hdr + "\n" + "-" * len(hdr))
    for r in rows:
        if r["step_s"] is None:
            print(f"{r['method']:11s} {r['ranks']:5d}   FAILED: {r['error']}")
            continue
        comm = r.get("comm_s")
        pct = comm / r["step_s"] if comm is not None else None
        extra = f"  contention x{r['contention']:.2f}" if r.get("contention") else ""
        print(
            f"{r['method']:11s} {r['ranks']:5d} {_f(r['step_s'], '9.1f', 1e3)} "
            f"{_f(r['samples_per_s'], '9.1f')} {_f(r['speedup'], '7.2f')} "
            f"{_f(r['efficiency'], '6.0%')} {_f(comm, '8.2f', 1e3)} {_f(pct, '6.1%')} "
            f"{_f(r.get('exposed_s'), '8.1f', 1e3)} {_f(r.get('overlap'), '7.0%')}{extra}"
        )
    print("\n".join(f"  {k}: {v}" for k, v in DEFINITIONS.items()))


def plot(
    rows: list[dict[str, Any]], path: Path, title: str, methods: tuple[str, ...]
) -> str | None:
    """Speedup against ranks per method, with the ideal line; returns an error or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no PNG: {e}"
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    predicted = [r for r in rows if r.get("predicted")]
    rows = [r for r in rows if not r.get("predicted")]
    worlds = sorted({r["ranks"] for r in rows} | {r["ranks"] for r in predicted})
    ax.plot(worlds, worlds, "k--", lw=1, label="ideal (speedup = ranks)")
    for m in ["compute", *methods]:
        pts = sorted(
            (r["ranks"], r["speedup"])
            for r in rows
            if r["speedup"] and (r["method"] == m or r["ranks"] == 1)
        )  # every curve starts at compute x1
        if m != "compute" and len(pts) < 2:
            continue
        ax.plot(
            *zip(*pts),
            "o-" if m != "compute" else "s:",
            label="no communication (upper bound)" if m == "compute" else m,
        )
    for m in sorted({r["method"] for r in predicted}):
        pts = sorted((r["ranks"], r["speedup"]) for r in predicted if r["method"] == m)
        ax.plot(*zip(*pts), ":", lw=1, label=f"{m} (cost model)")
    ax.set(xlabel="ranks", ylabel="speedup over 1 rank (samples/s)", title=title)
    ax.set_xticks(worlds, [str(w) for w in worlds])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
