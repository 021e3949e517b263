"""Reads PYRING_IPC_TRACE's files (csrc/transport/cuda_ipc/ipc_link.h writes them: one CSV per
cuda_ipc link, "ns,event,slot,bytes", events q (a slot's copy queued), p (published), r (a
slot from the peer handed on), f (released)) and says where a slot's time goes. Used by
bench/probes/ipc_slots.py --trace."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any


def read_trace(prefix: str) -> dict[tuple[int, int], dict[str, list[int]]]:
    """PYRING_IPC_TRACE's files under `prefix`: {(local rank, peer's): {event: [ns, ...]}}."""
    links: dict[tuple[int, int], dict[str, list[int]]] = {}
    for path in sorted(Path(prefix).parent.glob(Path(prefix).name + ".*.csv")):
        mine, peer = (int(x) for x in path.name.rsplit(".", 2)[1].split("-"))
        events: dict[str, list[int]] = {e: [] for e in "qprf"}
        with path.open() as f:
            for row in csv.DictReader(f):
                events[row["event"]].append(int(row["ns"]))
        links[(mine, peer)] = events
    return links


def summarize_trace(prefix: str) -> dict[str, Any]:
    """Per slot sent, in microseconds (medians and sums over every slot of every link): copy
    (the sender queued it to saw it done and published it), handoff (published to the
    receiver handing it on), hold (handed on to released; none for a slot whose release came
    after the trace was written)."""
    links = read_trace(prefix)
    parts: dict[str, list[float]] = {"copy": [], "handoff": [], "hold": []}
    for (mine, peer), ev in links.items():
        back = links.get((peer, mine))
        if back is None:
            raise ValueError(f"trace {prefix}: link {mine}->{peer} has no file of its peer")
        # The last slots' releases may be seen only after a link wrote its trace: no hold.
        if not (len(ev["q"]) == len(ev["p"]) == len(back["r"]) >= len(back["f"])):
            raise ValueError(f"trace {prefix}: link {mine}->{peer} queued {len(ev['q'])}, "
                             f"published {len(ev['p'])}; its peer handed on {len(back['r'])}, "
                             f"released {len(back['f'])}")
        for q, p, r in zip(ev["q"], ev["p"], back["r"]):
            parts["copy"].append((p - q) / 1e3)
            parts["handoff"].append((r - p) / 1e3)
        parts["hold"] += [(f - r) / 1e3 for r, f in zip(back["r"], back["f"])]
    n = len(parts["copy"])
    return {"slots": n, "links": len(links),
            **{f"{k}_us_median": statistics.median(v) if v else None for k, v in parts.items()},
            **{f"{k}_us_total": sum(v) for k, v in parts.items()}}
