"""bench/training.py --mode step: per-round figures of each method, their medians over rounds,
the terminal table and DEFINITIONS."""

from __future__ import annotations

import statistics
from typing import Any

from _train_step import LIB

PHASES = ("forward", "backward", "optimizer")  # per method; "waits" is its sync_wait_s

DEFINITIONS = {
    "step": "the slowest rank's mean time per iteration (zero_grad, forward, backward, [sync], "
    "AdamW step), i.e. 1 / throughput; median over rounds",
    "scaling": "step(1 rank) / step(2 ranks) = throughput(2) / (2 x throughput(1)), same job "
    "(interleaved), per round; median over rounds",
    "vs gloo": "step(ddp-gloo[-copy], 2 ranks) / step(method, 2 ranks), same job; above 1 is "
    "faster than DDP on gloo",
    "comp 2r": "the bare model (no communication) on 2 ranks",
    "comp sc": "the bare model's scaling, compute(1 rank) / compute(2 ranks): the ceiling "
    "that sharing the machine's memory and caches leaves to every method",
    "lock sc": "the bare model's scaling when its ranks meet once per step (one 1-element "
    "pyring allreduce after backward, no gradients exchanged): compute(1 rank) / "
    "lockstep(2 ranks), the ceiling that synchronous steps leave to every method, "
    "however fast its exchange",
    "alone": "one allreduce of a flat float32 tensor of the gradients' size, 2 ranks, with the "
    "method's library (pyring's avg for pyring's methods, gloo's sum for DDP on gloo)",
    "exposed": "step(2 ranks) - comp 2r",
    "hidden": "1 - exposed / alone, clipped to [0, 1]",
    "phases": "forward includes zero_grad; DDP waits for its buckets inside backward, pyring's "
    "optimizer hook in synchronize() (sync)",
}


def per_round(job: dict[str, Any], method: str) -> dict[str, float | None]:
    """One method's figures from one job."""
    m = {k: v["step_s"] for k, v in job["modes"].items()}
    s1, s2, c2 = m[f"{method} x1"], m[f"{method} x2"], m["compute x2"]
    alone = m[f"alone-{LIB[method]} x2"]
    exposed = s2 - c2
    gloo = m.get("ddp-gloo-copy x2" if method.endswith("-copy") else "ddp-gloo x2")
    lock = m["lockstep x2"]
    phases = {
        name: job["modes"][f"{name} x2"]["phases_median_s"]
        for name in (method, "compute", "lockstep")
    }
    return {
        "step_1_s": s1,
        "step_2_s": s2,
        "compute_1_s": m["compute x1"],
        "compute_2_s": c2,
        "compute_scaling": m["compute x1"] / c2,
        "lockstep_2_s": lock,
        "lockstep_scaling": m["compute x1"] / lock,
        "alone_s": alone,
        "scaling_efficiency": s1 / s2,
        "exposed_s": exposed,
        "hidden_fraction": min(1.0, max(0.0, 1 - exposed / alone)),
        "sync_wait_s": job["modes"][f"{method} x2"].get("sync_wait_median_s"),
        "ddp_gloo_step_over_this": gloo / s2 if gloo else None,
        **{f"{k}_2_s": phases[method][k] for k in PHASES},
        **{
            f"{name}_{k}_2_s": phases[name][k]
            for name in ("compute", "lockstep")
            for k in (*PHASES, "waits")
        },
    }


def summarize(jobs: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    """A row per method: the median over rounds of every per-round figure, and the rounds."""
    ok = [j for j in jobs if j.get("status") == "ok"]
    rows = []
    for method in methods:
        per = [per_round(j, method) for j in ok]
        row: dict[str, Any] = {
            "method": method,
            "rounds_ok": len(per),
            "rounds_failed": len(jobs) - len(per),
        }
        for key in per[0] if per else {}:
            vals = [p[key] for p in per if p[key] is not None]
            row[key] = statistics.median(vals) if vals else None
            row[key + "_rounds"] = vals
        rows.append(row)
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def print_table(rows: list[dict[str, Any]], cfg: dict[str, Any]) -> None:
    print(
        f"\n{cfg['params'] / 1e6:.2f} M parameters = {cfg['params'] * 4 / 1e6:.1f} MB of "
        f"float32 gradients; batch {cfg['batch']} x seq {cfg['seq']} per rank; "
        f"{cfg['threads']} thread(s)/rank{'; ranks pinned to cores' if cfg['pin'] else ''}"
    )
    cols = [
        ("step 1r", "step_1_s", _ms),
        ("step 2r", "step_2_s", _ms),
        ("scaling", "scaling_efficiency", _pct),
        ("vs gloo", "ddp_gloo_step_over_this", _x),
        ("comp 2r", "compute_2_s", _ms),
        ("comp sc", "compute_scaling", _pct),
        ("lock sc", "lockstep_scaling", _pct),
        ("alone", "alone_s", _ms),
        ("exposed", "exposed_s", _ms),
        ("hidden", "hidden_fraction", _pct),
    ]
    hdr = f"{'method':15s}" + "".join(f"{c:>10s}" for c, _, _ in cols)
    print(hdr + "\n" + "-" * len(hdr))
    for r in rows:
        if not r["rounds_ok"]:
            print(f"{r['method']:15s} FAILED in every round")
            continue
        print(
            f"{r['method']:15s}"
            + "".join(f"{f(r.get(k)):>10s}" for _, k, f in cols)
            + (f"  ({r['rounds_failed']} rounds FAILED)" if r["rounds_failed"] else "")
        )
        print(
            f"{'':15s} scaling per round: "
            + ", ".join(_pct(e) for e in r["scaling_efficiency_rounds"])
        )
        if r.get("sync_wait_s") is not None:
            print(
                f"{'':15s} synchronize() waited {_ms(r['sync_wait_s'])} ms per step (median, "
                "slowest rank) for allreduces still in flight after backward"
            )
    ok = [r for r in rows if r["rounds_ok"]]
    if ok:
        first = ok[0]
        print(
            f"{'bare model':15s} comp sc per round: "
            + ", ".join(_pct(e) for e in first["compute_scaling_rounds"])
            + "; lock sc per round: "
            + ", ".join(_pct(e) for e in first["lockstep_scaling_rounds"])
        )
        print(
            f"\n2 ranks, per phase (ms; the slowest rank's median iteration, median over "
            f"rounds)\n{'':15s}{'forward':>10s}{'backward':>10s}{'sync':>10s}{'optimizer':>10s}"
        )
        phase_rows = [
            ("bare model", first, "compute_", None),
            ("lockstep", first, "lockstep_", first["lockstep_waits_2_s"]),
        ]
        phase_rows += [(r["method"], r, "", r["sync_wait_s"]) for r in ok]
        for label, r, pre, sync in phase_rows:
            print(
                f"{label:15s}{_ms(r[pre + 'forward_2_s']):>10s}"
                f"{_ms(r[pre + 'backward_2_s']):>10s}{_ms(sync):>10s}"
                f"{_ms(r[pre + 'optimizer_2_s']):>10s}"
            )
    print("\n".join(f"{k} = {v}" for k, v in DEFINITIONS.items()))
