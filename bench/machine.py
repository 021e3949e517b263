"""Description of the machine a benchmark ran on, for its JSON results.

describe() never raises and never initialises MPI or CUDA contexts beyond what
torch.cuda queries do; every field it cannot determine is None. Running this file
prints the description as JSON.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import socket
import subprocess
from importlib import metadata
from typing import Any


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cpu() -> dict[str, Any]:
    models, physical_ids = [], set()
    mhz = None
    for line in _read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name":
            models.append(value)
        elif key == "physical id":
            physical_ids.add(value)
        elif key == "cpu MHz" and mhz is None:
            mhz = float(value)
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {
        "model": models[0] if models else (platform.processor() or None),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "sockets": len(physical_ids) or None,
        "mhz": mhz,
        "machine": platform.machine(),
    }


def _memory() -> dict[str, Any]:
    fields = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if key in ("MemTotal", "MemAvailable") and parts:
            fields[key] = int(parts[0]) * 1024
    total = fields.get("MemTotal")
    return {
        "total_bytes": total,
        "total_gib": round(total / 2**30, 2) if total else None,
        "available_bytes": fields.get("MemAvailable"),
    }


def _os() -> dict[str, Any]:
    pretty = None
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            pretty = line.split("=", 1)[1].strip().strip('"')
    return {
        "system": platform.system(),
        "release": platform.release(),
        "distribution": pretty,
        "hostname": socket.gethostname(),
    }


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _open_mpi() -> str | None:
    """First line of `mpirun --version` (e.g. 'mpirun (Open MPI) 4.1.4'), if mpirun exists."""
    exe = shutil.which("mpirun")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0] if lines else None


def _gpus() -> list[dict[str, Any]] | None:
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return []
        gpus = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            cap = f"{p.major}.{p.minor}"
            gpus.append({"name": p.name, "memory_bytes": p.total_memory, "capability": cap})
        return gpus
    except Exception as e:  # a broken driver must not lose the rest of the description
        return [{"error": f"{type(e).__name__}: {e}"}]


def describe() -> dict[str, Any]:
    """Machine and software description: cpu, memory, os, python, library versions, gpus."""
    torch_version = _version("torch")
    try:
        import torch

        torch_version = torch.__version__
        torch_cuda = torch.version.cuda
    except ImportError:
        torch_cuda = None
    return {
        "collected_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "cpu": _cpu(),
        "memory": _memory(),
        "os": _os(),
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "packages": {
            "torch": torch_version,
            "torch_cuda": torch_cuda,
            "numpy": _version("numpy"),
            "mpi4py": _version("mpi4py"),
            "matplotlib": _version("matplotlib"),
            "pyring": _version("pyring"),
        },
        "open_mpi": _open_mpi(),
        "gpus": _gpus(),
    }


if __name__ == "__main__":
    print(json.dumps(describe(), indent=2))
