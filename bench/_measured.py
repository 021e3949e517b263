"""The measured allreduce points of bench/results/allreduce_*.json for bench/costmodel.py, from
both formats: the libraries one after another (the older files, in- and out-of-place rows) and
bench/allreduce.py's runs, where they take turns (one mode per file). Emulated-host runs are
_tree_model.load_hosts's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# How auto chose when bench/results/allreduce_* were measured (direct up to 16 KiB, ring above),
# to label those rows; today's selector decides from its alpha-beta figures instead.
MEASURED_AUTO_DIRECT_MAX = 16 << 10
LINK_OF_LIB = {"gloo": "tcp", "mpi": "shm"}  # pyring's link is the file's transport


def load_points(paths: list[str], mode: str) -> list[dict[str, Any]]:
    """Measured allreduce rows: one point per (file, library, size), the median time of the
    slowest rank, in-place ('ip') or out-of-place ('oop')."""
    pts = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        cores = (doc.get("machine") or {}).get("cpu", {}).get("usable_cores") or 1 << 30
        if "sizes" in doc:  # bench/allreduce.py's interleaved runs
            if doc.get("out_of_place", False) == (mode == "oop"):
                pts += _interleaved_points(doc, Path(path).name, cores)
            continue
        for lib, res in doc.get("results", {}).items():
            if res.get("status") != "ok":
                continue
            link = LINK_OF_LIB.get(lib, doc.get("transport", "shm"))
            algo = (res.get("info") or {}).get("PYRING_ALGO") or "auto"
            for row in res.get("rows", []):
                m = row[mode]
                if m["wrong"] or m["time_us"] <= 0:
                    continue
                a = algo
                if algo == "auto":
                    a = "direct" if row["size"] <= MEASURED_AUTO_DIRECT_MAX else "ring"
                a = a if lib == "pyring" else "ring"
                pts.append({"cls": f"{lib}-{link}", "world": doc["world"], "size": row["size"],
                            "t": m["time_us"] * 1e-6,
                            "algo": a,
                            "file": Path(path).name, "started": doc.get("started_at", ""),
                            "oversub": doc["world"] > cores})
    return pts


def _interleaved_points(doc: dict[str, Any], name: str, cores: int) -> list[dict[str, Any]]:
    """One point per library and size of a local run of bench/allreduce.py (emulated hosts are
    _tree_model.load_hosts's): the median over rounds of its blocks' times."""
    if doc.get("hosts"):
        return []
    pts = []
    for e in doc["sizes"]:
        for lib, us in e["median_us"].items():
            base, _, algo = lib.partition("-")
            if base not in ("pyring", "gloo", "mpi") or e["wrong"].get(lib) or us <= 0:
                continue
            if base == "pyring" and algo not in ("", "ring", "direct", "tree"):
                continue  # a copy-mode or stream-count variant, not a distinct algorithm
            if base == "pyring" and not algo:
                algo = "direct" if e["bytes"] <= MEASURED_AUTO_DIRECT_MAX else "ring"
            link = LINK_OF_LIB.get(base, doc.get("transport") or "shm")
            pts.append({"cls": f"{base}-{link}", "world": doc["world"], "size": e["bytes"],
                        "t": us * 1e-6, "algo": algo or "ring", "file": name,
                        "started": "", "oversub": doc["world"] > cores})
    return pts


def aggregate(pts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Points of one class, world, algorithm and size from several runs -> one point: the
    median time over the runs (the mean of the middle two for an even count); "runs" keeps
    each run's time and file."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for p in pts:
        groups.setdefault((p["cls"], p["world"], p["algo"], p["size"]), []).append(p)
    out = []
    for g in groups.values():
        ts = sorted(q["t"] for q in g)
        mid = len(ts) // 2
        t = ts[mid] if len(ts) % 2 else (ts[mid - 1] + ts[mid]) / 2
        out.append({**g[0], "t": t, "file": ",".join(sorted({q["file"] for q in g})),
                    "runs": [(q["t"], q["file"]) for q in g]})
    return out
