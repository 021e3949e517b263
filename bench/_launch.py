"""Process handling for bench/allreduce.py: one library's ranks and their records.

A Ranks object owns the processes it spawned (each in its own session, so its process
group id is its pid) and reads the per-rank JSON-lines files described in _common.py
incrementally. kill() signals only those process groups and the pids the ranks
reported in their "hello" records (mpirun's ranks may sit outside its group).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


class Ranks:
    """The processes of one library and the records their ranks have written so far."""

    def __init__(self, lib: str, world: int, result_dir: Path) -> None:
        self.lib, self.world, self.dir = lib, world, result_dir
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.offsets = [0] * world
        self.rows: list[list[dict[str, Any]]] = [[] for _ in range(world)]
        self.info: dict[int, Any] = {}
        self.pids: set[int] = set()
        self.skip: str | None = None
        self.errors: list[str] = []
        self.user_ticks: dict[int, int] = {}  # last seen utime of each process of ours

    def spawn(self, cmd: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.logs.append(log)
        with open(log, "w") as f:
            self.procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=cwd,
                )
            )

    def read(self) -> bool:
        """Consumes new complete records; returns whether there were any."""
        new = False
        for r in range(self.world):
            path = self.dir / f"rank{r}.jsonl"
            if not path.exists():
                continue
            with open(path) as f:
                f.seek(self.offsets[r])
                chunk = f.read()
            end = chunk.rfind("\n") + 1
            self.offsets[r] += len(chunk[:end].encode())
            for line in chunk[:end].splitlines():
                new = True
                self._record(json.loads(line))
        return new

    def _record(self, rec: dict[str, Any]) -> None:
        ev, rank = rec["event"], rec["rank"]
        if ev == "hello":
            self.pids.add(rec["pid"])
        elif ev == "start":
            self.info[rank] = rec["info"]
        elif ev == "row":
            self.rows[rank].append(rec)
        elif ev == "skip":
            self.skip = rec["reason"]
        elif ev == "error":
            self.errors.append(f"rank {rank}: {rec['reason']}\n{rec.get('traceback', '')}")

    def kill(self) -> None:
        """SIGTERM to our process groups and reported rank pids, SIGKILL after 5 s."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self._all_gone():
                return
            for p in self.procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            for pid in self.pids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not self._all_gone():
                time.sleep(0.05)

    def _all_gone(self) -> bool:
        if any(p.poll() is None for p in self.procs):
            return False
        for pid in self.pids:  # ranks mpirun started may sit outside its process group
            try:
                os.kill(pid, 0)
                return False
            except ProcessLookupError:
                pass
            except PermissionError:
                return False
        return True

    def sample_cpu(self) -> None:
        """Records the user CPU ticks of our processes; call often, before reaping them."""
        for pid in {p.pid for p in self.procs} | self.pids:
            ticks = _user_ticks(f"/proc/{pid}/stat")
            if ticks is not None:
                self.user_ticks[pid] = ticks

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for log in self.logs:
            text = log.read_text(errors="replace").strip().splitlines()[-lines:]
            if text:
                out.append(f"--- {log.name} (last {len(text)} lines)\n" + "\n".join(text))
        return "\n".join(out)


def _user_ticks(stat_path: str) -> int | None:
    """utime (clock ticks) of one process, all threads; None once it is gone."""
    try:
        with open(stat_path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11])  # field 14 of proc(5), counted after "pid (comm)"


def machine_user_ticks() -> int:
    """user + nice clock ticks of all CPUs since boot (/proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[1]) + int(fields[2])
    except (OSError, IndexError, ValueError):
        return 0


class ForeignLoad:
    """User CPU time that processes other than ours used between start and stop():
    machine user time minus our ranks' (Ranks.sample_cpu) and this process's own."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.machine0 = machine_user_ticks()
        self.self0 = os.times().user

    def stop(self, ranks: Ranks) -> dict[str, float]:
        hz = os.sysconf("SC_CLK_TCK")
        wall = time.monotonic() - self.t0
        machine = (machine_user_ticks() - self.machine0) / hz
        ours = sum(ranks.user_ticks.values()) / hz + (os.times().user - self.self0)
        foreign = max(0.0, machine - ours)
        return {
            "wall_s": round(wall, 2),
            "machine_user_cpu_s": round(machine, 2),
            "our_user_cpu_s": round(ours, 2),
            "foreign_user_cpu_s": round(foreign, 2),
            "foreign_share": round(foreign / (wall * (os.cpu_count() or 1)), 4) if wall else 0.0,
        }


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    env.update(extra)
    return env
