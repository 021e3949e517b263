"""Where a rank's threads run, when the launcher left that open (PYRING_AFFINITY).

torchrun and ``mp.spawn`` start every rank free to run on every core. The scheduler then
sometimes puts two ranks of one host, or a rank and the progress thread of another, on one
core for a whole run: a 4 KiB allreduce then waits out a spin budget or a wake-up (15-30 us
instead of 1-2 us), and a background load makes it likelier. ``auto`` (the default) splits
the CPUs every local rank may use into local_world_size contiguous shares, as ``mpirun
--bind-to`` does, and binds this rank's init thread to its share before pyring starts its
threads, which inherit it; so do the threads the init thread starts afterwards (torch's
intra-op pool where it is first used after init). It does so only where every local rank has
the same CPUs, at least one each (a launcher that bound the ranks gave them different
ones). ``off`` leaves every thread where it is.
"""

from __future__ import annotations

import os

MODES = ("auto", "off")


def cpus_text(cpus: set[int] | list[int]) -> str:
    """'0-3,8' for {0, 1, 2, 3, 8}."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def share(cpus: list[int], local_index: int, local_world: int) -> list[int]:
    """The local_index-th of local_world contiguous, near-equal shares of cpus (sorted)."""
    cpus = sorted(cpus)
    base, extra = divmod(len(cpus), local_world)
    start = local_index * base + min(local_index, extra)
    return cpus[start:start + base + (1 if local_index < extra else 0)]


def plan(mode: str, mine: list[int], local_masks: list[list[int]], local_index: int
         ) -> tuple[list[int] | None, str]:
    """(the CPUs to bind this rank to, or None to leave it; why), from this rank's CPUs and
    those of every local rank (local_masks[i] is local rank i's)."""
    local_world = len(local_masks)
    if mode == "off":
        return None, "PYRING_AFFINITY=off"
    if local_world < 2:
        return None, "the only rank on its host"
    if any(sorted(m) != sorted(mine) for m in local_masks):
        return None, "the launcher gave the local ranks different CPUs"
    if len(mine) < local_world:
        return None, (f"{local_world} local ranks share {len(mine)} CPU(s): binding would not "
                      f"keep them apart")
    cpus = share(mine, local_index, local_world)
    return cpus, (f"local rank {local_index} of {local_world} bound to CPUs {cpus_text(cpus)} "
                  f"of {cpus_text(mine)}")


def apply(cpus: list[int] | None) -> None:
    """Binds the calling thread (and the threads it starts from now on) to cpus."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
