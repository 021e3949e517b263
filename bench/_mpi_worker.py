"""One rank of the Open MPI (mpi4py) allreduce benchmark (float32, sum).

Launched by bench/allreduce.py as `mpirun ... -np W python _mpi_worker.py CONFIG.json`
(config and result records: see _common.py). The rank comes from MPI.COMM_WORLD; the
environment's OMPI_COMM_WORLD_RANK names the result file before MPI is initialised.

Out-of-place is comm.Allreduce(sendbuf, recvbuf); in-place is
comm.Allreduce(MPI.IN_PLACE, buf), both on numpy float32 arrays. Rank r's input is
r+1 everywhere, so every output element must be W(W+1)/2 exactly; out-of-place #wrong
also counts input elements that changed.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import numpy as np
from _common import Ops, load_config, run_worker


class _MpiOps(Ops):
    def __init__(self, comm: Any, mpi: Any, bufs: dict[str, Any], nbytes: int) -> None:
        n = nbytes // 4
        self.comm = comm
        self.in_place = mpi.IN_PLACE
        self.op = mpi.SUM
        self.mine = bufs["mine"]
        self.expected = bufs["expected"]
        self.src = bufs["src"][:n]
        self.out = bufs["out"][:n]
        self.ip = bufs["ip"][:n]

    def barrier(self) -> None:
        self.comm.Barrier()

    def refill_oop(self) -> None:
        self.out.fill(np.nan)

    def run_oop(self) -> None:
        self.comm.Allreduce(self.src, self.out, op=self.op)

    def check_oop(self) -> int:
        bad_out = np.count_nonzero(self.out != self.expected)
        bad_in = np.count_nonzero(self.src != self.mine)
        return int(bad_out + bad_in)

    def refill_ip(self) -> None:
        self.ip.fill(self.mine)

    def run_ip(self) -> None:
        self.comm.Allreduce(self.in_place, self.ip, op=self.op)

    def check_ip(self) -> int:
        return int(np.count_nonzero(self.ip != self.expected))


def main() -> int:
    cfg = load_config()
    env_rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))

    def setup() -> tuple[dict[str, Any], Callable[[int], Ops], Callable[[], None]]:
        import mpi4py  # ImportError here means "skip mpi"

        mpi4py.rc.thread_level = "single"
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        if comm.Get_rank() != env_rank or comm.Get_size() != cfg["world"]:
            raise RuntimeError(
                f"MPI rank/size {comm.Get_rank()}/{comm.Get_size()} != "
                f"expected {env_rank}/{cfg['world']}"
            )
        n = max(cfg["sizes"]) // 4
        mine = np.float32(env_rank + 1)
        world = cfg["world"]
        bufs = {
            "mine": mine,
            "expected": np.float32(world * (world + 1) // 2),
            "src": np.full(n, mine, dtype=np.float32),
            "out": np.full(n, np.nan, dtype=np.float32),
            "ip": np.full(n, mine, dtype=np.float32),
        }
        info = {
            "mpi4py": mpi4py.__version__,
            "mpi_library": MPI.Get_library_version().strip("\x00 \n").splitlines()[0],
            "mpi_standard": "{}.{}".format(*MPI.Get_version()),
            "processor": MPI.Get_processor_name(),
            "numpy": np.__version__,
        }
        return info, (lambda nbytes: _MpiOps(comm, MPI, bufs, nbytes)), comm.Barrier

    return run_worker(cfg, env_rank, setup)


if __name__ == "__main__":
    sys.exit(main())
