"""Parent-side aggregation and presentation for bench/allreduce.py.

Timing convention: each rank times every iteration on its own; iteration i's time is
the maximum over ranks (the collective is done when its slowest rank is), and a row's
time is the median of those over the timed iterations, in microseconds.
algbw = bytes / time (GB/s, 1e9), busbw = algbw * 2(W-1)/W, as in nccl-tests.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

LIB_ORDER = ("pyring", "gloo", "mpi")
TIME_NOTE = (
    "time = median over iterations of the slowest rank's time per iteration (us); "
    "algbw = bytes/time, busbw = algbw*2(W-1)/W (GB/s = 1e9 B/s)"
)


def human_bytes(n: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _mode_stats(per_rank: Sequence[Sequence[float]], nbytes: int, world: int, wrong: int):
    iters = min(len(t) for t in per_rank)
    slowest = [max(t[i] for t in per_rank) for i in range(iters)]
    med = statistics.median(slowest)
    algbw = nbytes / (med * 1e-6) / 1e9 if med > 0 else 0.0
    return {
        "time_us": round(med, 3),
        "min_us": round(min(slowest), 3),
        "mean_us": round(statistics.fmean(slowest), 3),
        "max_us": round(max(slowest), 3),
        "algbw_GBps": round(algbw, 6),
        "busbw_GBps": round(algbw * 2 * (world - 1) / world, 6),
        "wrong": int(wrong),
        "iters": iters,
        "rank_median_us": [round(statistics.median(t), 3) for t in per_rank],
    }


def aggregate_row(rank_rows: Sequence[dict[str, Any]], world: int) -> dict[str, Any]:
    """One table row from the per-rank "row" records of one size (one per rank)."""
    nbytes = rank_rows[0]["size"]
    return {
        "size": nbytes,
        "count": nbytes // 4,
        "type": "float32",
        "redop": "sum",
        "oop": _mode_stats(
            [r["oop_us"] for r in rank_rows], nbytes, world, sum(r["oop_wrong"] for r in rank_rows)
        ),
        "ip": _mode_stats(
            [r["ip_us"] for r in rank_rows], nbytes, world, sum(r["ip_wrong"] for r in rank_rows)
        ),
    }


def _t(us: float) -> str:
    return f"{us:9.2f}" if us < 1e5 else f"{us:9.0f}"


def table_header(lib: str, title: str) -> str:
    return "\n".join(
        [
            f"# {lib}: {title}",
            f"# {TIME_NOTE}",
            "#" + " " * 48 + "out-of-place" + " " * 29 + "in-place",
            "#       size         count      type   redop"
            "      time   algbw   busbw  #wrong      time   algbw   busbw  #wrong",
            "#        (B)    (elements)                  "
            "      (us)  (GB/s)  (GB/s)              (us)  (GB/s)  (GB/s)",
        ]
    )


def table_row(row: dict[str, Any]) -> str:
    cells = [f"{row['size']:12d}  {row['count']:12d}  {'float':>8s}  {row['redop']:>6s}"]
    for mode in ("oop", "ip"):
        m = row[mode]
        cells.append(
            f"{_t(m['time_us'])} {m['algbw_GBps']:7.2f} {m['busbw_GBps']:7.2f} {m['wrong']:7d}"
        )
    return "  ".join(cells)


def table_footer(rows: Sequence[dict[str, Any]]) -> str:
    """Out-of-bounds total and the mean busbw over all rows and both modes (nccl-tests)."""
    wrong = sum(r[m]["wrong"] for r in rows for m in ("oop", "ip"))
    bws = [r[m]["busbw_GBps"] for r in rows for m in ("oop", "ip")]
    avg = statistics.fmean(bws) if bws else 0.0
    return "\n".join(
        [
            f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
            f"# Avg bus bandwidth    : {avg:.4f} GB/s",
        ]
    )


def summary(results: dict[str, dict[str, Any]]) -> str:
    """In-place time per size side by side; speed-up = other's time / baseline's time,
    where the baseline is pyring when it has rows, else the first library that has."""
    libs = [lib for lib in LIB_ORDER if results.get(lib, {}).get("rows")]
    if not libs:
        return "# summary: no library produced results"
    base, others = libs[0], libs[1:]
    by_size: dict[int, dict[str, float]] = {}
    for lib in libs:
        for row in results[lib]["rows"]:
            by_size.setdefault(row["size"], {})[lib] = row["ip"]["time_us"]
    head = f"{'size':>8s}" + "".join(f"  {lib + ' (us)':>13s}" for lib in libs)
    head += "".join(f"  {base + ' vs ' + o:>15s}" for o in others)
    lines = [
        f"# summary: in-place median time; '{base} vs X' = X time / {base} time "
        f"(>1: {base} faster)",
        "#" + head[1:],
    ]
    for size in sorted(by_size):
        t = by_size[size]
        line = f"{human_bytes(size):>8s}"
        line += "".join(f"  {t[lib]:13.2f}" if lib in t else f"  {'-':>13s}" for lib in libs)
        for o in others:
            ok = base in t and o in t and t[base] > 0
            line += f"  {t[o] / t[base]:14.2f}x" if ok else f"  {'-':>15s}"
        lines.append(line)
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], path: str, title: str) -> str | None:
    """busbw against size (log2 x), in-place solid and out-of-place dashed per library.
    Returns an error string instead of raising when matplotlib is missing or fails."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no plot ({e}); pip install matplotlib"
    try:
        fig, ax = plt.subplots(figsize=(9, 5.5))
        colors = {"pyring": "tab:red", "gloo": "tab:blue", "mpi": "tab:green"}
        sizes_seen: set[int] = set()
        for lib in LIB_ORDER:
            rows = results.get(lib, {}).get("rows") or []
            if not rows:
                continue
            xs = [r["size"] for r in rows]
            sizes_seen.update(xs)
            c = colors.get(lib)
            ax.plot(
                xs, [r["ip"]["busbw_GBps"] for r in rows], "o-", color=c, label=f"{lib} in-place"
            )
            ax.plot(
                xs,
                [r["oop"]["busbw_GBps"] for r in rows],
                "x--",
                color=c,
                alpha=0.6,
                label=f"{lib} out-of-place",
            )
        ax.set_xscale("log", base=2)
        ticks = sorted(sizes_seen)
        ax.set_xticks(ticks)
        ax.set_xticklabels([human_bytes(s) for s in ticks], rotation=45)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s), from median time")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    except Exception as e:  # a plotting problem must not lose the measurements
        return f"plot failed: {type(e).__name__}: {e}"
    return None
