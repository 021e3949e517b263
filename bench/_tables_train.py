"""bench/tables.py's renderers of the training, compression and reliability benchmarks: the
training step and scaling, point-to-point, convergence, slow links, the one-bit kernels, the
soak. Each takes [(path, document)] and the marker's options, and returns the table's lines."""

from __future__ import annotations

import shlex
from typing import Any

from _tables_fmt import DASH, mb, pct, rate_name, ratio, ratio3, sig, size, table

from pyring.optim.compression import WIRES

Docs = list[tuple[str, dict[str, Any]]]
Opts = dict[str, str]

METHOD = {"pyring": "`pyring.DistributedOptimizer` (a)",
          "ddp-pyring": "DDP on the `pyring` backend (b)", "ddp-gloo": "DDP on gloo (c)",
          "ddp-pyring-copy": "DDP on `pyring`, DDP defaults",
          "ddp-gloo-copy": "DDP on gloo, DDP defaults", "ddp-nccl": "DDP on nccl"}


def _ms(s: float | None, digits: int = 1) -> str:
    return DASH if s is None else f"{s * 1e3:.{digits}f} ms"


def _eff(x: float, rounds: list[float]) -> str:
    return f"**{pct(x)}** ({', '.join(f'{r * 100:.0f}' for r in rounds)})"


def step(docs: Docs, opts: Opts) -> list[str]:
    """training.py --mode step: a row per method (medians over rounds, efficiency per round),
    then the bare model alone and in lockstep."""
    (_, doc), = docs
    rows = []
    for m in doc["summary"]:
        vs = m.get("ddp_gloo_step_over_this")
        rows.append([METHOD.get(m["method"], m["method"]), _ms(m["step_1_s"]),
                     _ms(m["step_2_s"]), _eff(m["scaling_efficiency"],
                                              m["scaling_efficiency_rounds"]),
                     f"{vs:.2f}×" if vs else "", _ms(m["exposed_s"]), pct(m["hidden_fraction"])])
    m = doc["summary"][0]
    rows.append(["bare model, no communication", _ms(m["compute_1_s"]), _ms(m["compute_2_s"]),
                 _eff(m["compute_scaling"], m["compute_scaling_rounds"]), "", "", ""])
    if "lockstep_2_s" in m:
        rows.append(["bare model, lockstep", _ms(m["compute_1_s"]), _ms(m["lockstep_2_s"]),
                     _eff(m["lockstep_scaling"], m["lockstep_scaling_rounds"]), "", "", ""])
    return table(["method", "step, 1 rank", "step, 2 ranks", "2-rank efficiency (per round)",
                  "vs DDP on gloo", "exposed", "hidden"], rows, "lrrlrrr")


def phases(docs: Docs, opts: Opts) -> list[str]:
    """training.py --mode step: the phases at 2 ranks (ms) of the bare model, lockstep and the
    methods `methods`; a sync of none or 0 is blank."""
    (_, doc), = docs
    by = {m["method"]: m for m in doc["summary"]}
    first = doc["summary"][0]

    def row(label: str, m: dict[str, Any], pre: str, waits: float | None) -> list[str]:
        return [label, *(f"{m[f'{pre}{k}_2_s'] * 1e3:.1f}" for k in ("forward", "backward")),
                f"{waits * 1e3:.1f}" if waits else "", f"{m[f'{pre}optimizer_2_s'] * 1e3:.1f}"]

    rows = [row("bare model", first, "compute_", first["compute_waits_2_s"])]
    if "lockstep_forward_2_s" in first:
        rows.append(row("bare model, lockstep", first, "lockstep_", first["lockstep_waits_2_s"]))
    for name in opts.get("methods", ",".join(by)).split(","):
        rows.append(row(METHOD.get(name, name), by[name], "", by[name]["sync_wait_s"]))
    return table(["", "forward", "backward", "sync", "optimizer step"], rows, "lrrrr")


def scaling(docs: Docs, opts: Opts) -> list[str]:
    """training.py --mode scaling: a row per method and number of ranks."""
    (_, doc), = docs
    rows = []
    for r in doc["summary"]:
        if r.get("error"):
            rows.append([r["method"], str(r["ranks"]), "failed", *[DASH] * 6])
            continue
        compute = r["method"] == "compute"
        rows.append([r["method"], str(r["ranks"]), _ms(r["step_s"]), f"{r['samples_per_s']:.1f}",
                     f"{r['speedup']:.2f}", pct(r["efficiency"]),
                     DASH if compute else _ms(r.get("comm_s"), 2),
                     DASH if compute else _ms(r.get("exposed_s")),
                     DASH if compute else pct(r["overlap"])])
    return table(["method", "ranks", "step", "samples/s", "speedup", "efficiency", "comm",
                  "exposed", "overlap"], rows, "lrrrrrrrr")


P2P = [("send/recv 4 KiB, one way, through `torch.distributed`", "send_recv_4KiB_oneway_us",
        "send_recv_speedup_over_gloo", "µs"),
       ("the same through pyring's own `send`/`recv`", "send_recv_4KiB_oneway_us_pyring_api",
        "send_recv_speedup_over_gloo_pyring_api", "µs"),
       ("`all_to_all_single`, 4 ranks, 1 MiB per pair", "all_to_all_single_4ranks_1MiB_pair_ms",
        "all_to_all_single_speedup_over_gloo", "ms"),
       ("the same with `PYRING_SINGLE_COPY_BYTES=0`",
        "all_to_all_single_4ranks_1MiB_pair_ms_no_single_copy",
        "all_to_all_single_speedup_over_gloo_no_single_copy", "ms")]


def p2p(docs: Docs, opts: Opts) -> list[str]:
    """p2p.py: medians over rounds of pyring and gloo, and pyring's speedup."""
    (_, doc), = docs
    med = doc["medians"]
    rows = [[label, f"{sig(med['pyring'][key])} {unit}",
             f"{sig(med['gloo'][key])} {unit}" if key in med["gloo"] else "",
             f"{ratio3(doc['ratios'][sp])}x"] for label, key, sp, unit in P2P]
    return table(["", "pyring", "gloo", "pyring's speedup"], rows)


def _freeze(name: str, doc: dict[str, Any]) -> int:
    return int(name.rsplit("_", 1)[1]) if name[-1].isdigit() else doc["freeze"]


def convergence(docs: Docs, opts: Opts) -> list[str]:
    """convergence.py: a row per method; bold, the OneBitAdam run within the baseline's
    spread that received the fewest bytes."""
    (_, doc), = docs
    s = doc["summary"]
    wires = [f"adamw_{w}" for w in WIRES]  # the codec registry's order
    label = {**{k: f'AdamW, `compression="{k[6:]}"`' for k in wires[1:]},
             "adamw_fp32": "AdamW, fp32 allreduce",
             "periodic": f"`PeriodicAveraging`, {doc['freeze']} synchronous steps, then every "
                         f"{doc['period']} (bf16)"}
    onebit = sorted((k for k in s if k.startswith("onebit_adam")), key=lambda k: _freeze(k, doc))
    order = [k for k in wires if k in s]
    order += onebit + [k for k in s if k not in order and k not in onebit]
    held = [k for k in onebit if s[k]["loss_within_baseline_spread"]]
    best = max(held, key=lambda k: s[k]["bytes_ratio_vs_baseline"]) if held else None
    acc = any(v.get("accuracy_mean") is not None for v in s.values())
    rows = []
    for k in order:
        v = s[k]
        b = "**" if k == best else ""
        name = label.get(k) or (f"OneBitAdam, freeze after {_freeze(k, doc)} steps"
                                if k in onebit else f"`{k}`")
        rows.append([name, f"{b}{v['val_loss_mean']:.4f}{b} [{v['val_loss_min']:.4f}, "
                     f"{v['val_loss_max']:.4f}]", *([f"{v['accuracy_mean']:.3f}"] if acc else []),
                     mb(v["bytes_mean"]), f"{b}{v['bytes_ratio_vs_baseline']:.1f}x{b}"])
    seeds = len(next(iter(doc["runs"].values())))
    return table(["method", f"validation loss, mean [min, max] over {seeds} seeds",
                  *(["accuracy"] if acc else []), "bytes", "fewer than fp32"], rows)


SLOW = {"local": "AdamW alone, no exchange (compute)", "ddp_gloo_adamw": "DDP on gloo, AdamW",
        "adamw_fp32": "AdamW, pyring fp32", "adamw_bf16": 'AdamW, `compression="bf16"`',
        "onebit_adam": "OneBitAdam", "periodic": "`PeriodicAveraging` (bf16)"}


def slowlink(docs: Docs, opts: Opts) -> list[str]:
    """slowlink.py, a pair of columns per file: ms per step, and how much sooner than DDP on
    gloo the method first reaches the target loss (DDP on gloo's time to it in brackets)."""
    head, cols = ["method"], []
    for _, doc in docs:
        argv = shlex.split(doc["command"])
        task = argv[argv.index("--task") + 1] if "--task" in argv else "digits"
        head += [f"{task} {rate_name(doc['link']['rate'])}: ms/step",
                 "sooner than DDP/gloo"]
        cols.append(doc)
    rows = []
    for m in cols[0]["summary"]:
        row = [SLOW.get(m, f"`{m}`")]
        for doc in cols:
            v, sp = doc["summary"][m], doc["speedup_to_target_vs_ddp_gloo"].get(m)
            soon = "" if sp is None else f"{ratio(sp)}x"
            if m == "ddp_gloo_adamw":
                soon += f" ({v['time_to_target_s']:.2f} s)"
            row += [sig(v["step_ms"]), soon]
        rows.append(row)
    return table(head, rows)


KERNEL = {"memcpy": "memcpy", "pack": "pack (scale, signs)",
          "fused_residual": "fused (residual add, scale, signs, new residual)",
          "unpack": "unpack (decode-accumulate)"}


def kernels(docs: Docs, opts: Opts) -> list[str]:
    """pytest-benchmark's JSON of test_kernels_bench.py: GB/s of float32 input per kernel and
    buffer size; the fused kernel also as a share of memcpy."""
    (_, doc), = docs
    rate: dict[str, dict[int, float]] = {}
    for b in doc["benchmarks"]:
        name = b["name"].removeprefix("test_").split("[")[0]
        rate.setdefault(name, {})[b["params"]["data"]] = b["extra_info"]["gbps"]
    sizes = sorted({n for r in rate.values() for n in r})
    rows = []
    for name, r in rate.items():
        cells = [f"{r[n]:.1f}" for n in sizes]
        if name == "fused_residual" and "memcpy" in rate:
            cells = [f"{c} ({pct(r[n] / rate['memcpy'][n])} of memcpy)"
                     for c, n in zip(cells, sizes)]
        rows.append([KERNEL.get(name, name), *cells])
    return table(["GB/s of float32 input", *(size(n << 20) for n in sizes)], rows)


def soak(docs: Docs, opts: Opts) -> list[str]:
    """soak.py: a row per check the file holds (soak, API fuzz, kill trials, strangers)."""
    (_, doc), = docs
    rows = []
    if "soak" in doc:
        s = doc["soak"]
        algo = " / ".join(f"{k} {v:,}" for k, v in s["calls_by_algo"].items())
        topo = s["topology"].replace("|", "\\|")
        rows.append([f"soak: {s['world']} ranks (topology `{topo}`), {s['seconds'] / 60:g} "
                     "minutes of random verified calls",
                     f"{s['calls']:,} calls (every collective, {algo} allreduces, "
                     f"{s['by_kind'].get('wire', 0):,} on the fp16, bf16 and one-bit wires), "
                     f"**{s['wrong_elements']} wrong elements**, {len(s['errors'])} errors"])
    if "fuzz" in doc:
        f, o = doc["fuzz"], doc["fuzz"]["outcomes"]
        rows.append(["API fuzz: random calls on 2 ranks",
                     f"{f['calls']:,} calls: {o.get('ok', 0):,} right, "
                     f"{o.get('ValueError', 0):,} `ValueError`, {o.get('TypeError', 0):,} "
                     f"`TypeError` with no byte sent; **{f['crashes_or_wrong']} wrong or "
                     f"crashed, {f['hangs']} hangs**"])
    if doc.get("kill_trials", {}).get("trials"):
        k = doc["kill_trials"]
        raised = {ph: sorted({e for r in k["rows"] if r["phase"] == ph for e in r["raised"]})
                  for ph in k["trials_by_phase"]}
        left = any(r["processes_left"] or r["shm_left"] for r in k["rows"])
        rows.append([f"kill trials: SIGKILL a random rank of {k['world']}",
                     f"**{k['passed']} of {k['trials']} passed**: "
                     f"{k['trials_by_phase'].get('run', 0)} during the run (every survivor "
                     f"raised {_names(raised.get('run'))} within {k['max_raise_s']['run']} s "
                     f"of the kill), {k['trials_by_phase'].get('init', 0)} around init "
                     f"({_names(raised.get('init'))} within {k['max_raise_s']['init']} s, the "
                     f"deadline being {k['timeout_s']:g} s); "
                     + ("a process or `/dev/shm` segment left" if left
                        else "no process or `/dev/shm` segment left")])
    if "strangers" in doc:
        g = doc["strangers"]
        rows.append(["strangers: a silent, a garbage, a forged and a wrong-secret client on "
                     "every listening port",
                     f"start delayed by at most **{g['max_added_delay_s'] * 1e3:.1f} ms** over "
                     f"{g['trials']} trials (side by side with a quiet start); "
                     f"**{g['strangers_accepted']} accepted**"])
    return table(["check", "result"], rows)


def _names(errors: list[str] | None) -> str:
    return " or ".join(f"`{e}`" for e in errors or []) or "nothing"
