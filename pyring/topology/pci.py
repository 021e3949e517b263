"""Where a GPU sits on the PCIe tree, read from sysfs (the input of topology.detect)."""

from __future__ import annotations

import os
import re
from typing import Any

_BUS_ID = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])")


def _bus_id(bus_id: Any) -> str:
    m = _BUS_ID.fullmatch(bus_id.strip().lower()) if isinstance(bus_id, str) else None
    if m is None:
        raise ValueError(f"pci_path: {bus_id!r} is not a PCI bus id such as '0000:3b:00.0'")
    domain, bus, device, function = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def pci_path(bus_id: str, sysfs_root: str = "/sys") -> list[str]:
    """The PCIe path of device ``bus_id`` ("0000:3b:00.0"; upper case and CUDA's 8-digit
    domain accepted), from the top: its NUMA node as "numa<N>" (the root complex's name when
    unknown), the root complex ("pci0000:3a"), every bridge on the way down, the device.
    Reads ``<sysfs_root>/bus/pci/devices/<bdf>``, a link into ``<sysfs_root>/devices`` that is
    resolved inside ``sysfs_root`` even when it is absolute. ValueError when it is missing."""
    bdf = _bus_id(bus_id)
    root = os.path.normpath(sysfs_root)
    link = os.path.join(root, "bus", "pci", "devices", bdf)
    if not os.path.islink(link):
        what = "not a link into devices/" if os.path.lexists(link) else "missing"
        raise ValueError(f"pci_path: no PCI device {bus_id!r}: {link} is {what}")
    target = os.readlink(link)
    if os.path.isabs(target):
        parts = target.split("/")
        if "devices" not in parts:
            raise ValueError(f"pci_path: {link} points to {target}, outside devices/")
        device_dir = os.path.join(root, *parts[parts.index("devices"):])
    else:
        device_dir = os.path.normpath(os.path.join(os.path.dirname(link), target))
    parts = os.path.relpath(device_dir, os.path.join(root, "devices")).split(os.sep)
    if parts[0] == ".." or parts[-1] != bdf or not os.path.isdir(device_dir):
        raise ValueError(f"pci_path: {link} points to {target}, not to a device {bdf} under "
                         f"{os.path.join(root, 'devices')}")
    parts = parts[next((i for i, p in enumerate(parts) if p.startswith("pci")), 0):]
    try:
        with open(os.path.join(device_dir, "numa_node")) as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        node = -1
    return [f"numa{node}" if node >= 0 else parts[0]] + parts


def local_gpu_path(sysfs_root: str = "/sys", index: int | None = None) -> list[str] | None:
    """pci_path() of CUDA device ``index`` (None: this process's current one); None without
    CUDA, without the PCI ids in torch's device properties, or on any error."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        dev = torch.cuda.current_device() if index is None else index
        props = torch.cuda.get_device_properties(dev)
        ids = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
        if not all(isinstance(i, int) for i in ids):
            return None
        return pci_path("{:04x}:{:02x}:{:02x}.0".format(*ids), sysfs_root)
    except Exception:
        return None
