"""Fake sysfs trees for pyring.topology tests.

A tree is laid out like the real one: ``<root>/devices/pci<domain>:<bus>/<bridge>/.../<bdf>``
directories, each PCI device with a ``numa_node`` file, and ``<root>/bus/pci/devices/<bdf>``
relative symlinks ("../../../devices/pci0000:00/...") for every device, bridges included.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


class FakeSysfs:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "devices").mkdir(parents=True, exist_ok=True)
        (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)

    def add(self, chain: Sequence[str], numa: int | None = 0) -> str:
        """Adds the devices of ``chain`` (a root complex such as "pci0000:00", then bdfs from
        the top down) and returns the last bdf. ``numa`` None leaves numa_node out."""
        path = self.root / "devices"
        for i, name in enumerate(chain):
            path = path / name
            path.mkdir(exist_ok=True)
            if i == 0:
                continue
            if numa is not None:
                (path / "numa_node").write_text(f"{numa}\n")
            link = self.root / "bus" / "pci" / "devices" / name
            if not link.is_symlink():
                link.symlink_to(os.path.join("..", "..", "..", "devices", *chain[: i + 1]))
        return chain[-1]


def mariana(root: Path) -> list[str]:
    """The 6-GPU server of Mariana (Tencent, 2014): on one IOH (root complex pci0000:00),
    root port 00:02.0 leads to a switch whose two downstream ports each lead to a switch with
    two GPUs; root ports 00:03.0 and 00:07.0 hold one GPU each. Returns the GPU bus ids:
    switch A's two, switch B's two, then the two on the IOH."""
    fs = FakeSysfs(root)
    top = ["pci0000:00", "0000:00:02.0", "0000:02:00.0"]
    gpus = []
    lower_switches = (("0000:03:08.0", "0000:04:00.0", 5), ("0000:03:10.0", "0000:08:00.0", 9))
    for down, up, bus in lower_switches:
        for i, port in enumerate((f"0000:{bus:02x}:08.0", f"0000:{bus:02x}:10.0")):
            gpus.append(fs.add(top + [down, up, port, f"0000:{bus + 1 + i:02x}:00.0"]))
    gpus.append(fs.add(["pci0000:00", "0000:00:03.0", "0000:0c:00.0"]))
    gpus.append(fs.add(["pci0000:00", "0000:00:07.0", "0000:0d:00.0"]))
    return gpus


def dual_socket(root: Path, numa: bool = True) -> list[str]:
    """A dual-socket server with 8 GPUs: root complexes pci0000:00 (NUMA node 0) and
    pci0000:80 (NUMA node 1), each with two root ports leading to a switch of two GPUs.
    ``numa`` False writes numa_node -1, as on machines without NUMA information.
    Returns the GPU bus ids socket by socket, switch by switch."""
    fs = FakeSysfs(root)
    gpus = []
    for node, base in ((0, 0x00), (1, 0x80)):
        for port in range(2):
            up = base + 1 + 4 * port
            chain = [f"pci0000:{base:02x}", f"0000:{base:02x}:{port + 1:02x}.0",
                     f"0000:{up:02x}:00.0"]
            for i in range(2):
                gpus.append(fs.add(chain + [f"0000:{up + 1:02x}:{8 * (i + 1):02x}.0",
                                            f"0000:{up + 2 + i:02x}:00.0"],
                                   node if numa else -1))
    return gpus
