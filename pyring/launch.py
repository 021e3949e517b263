"""Runs a function on N real processes that meet through a TCPStore: the project's one launcher
of local ranks (the main job, the multi-process tests, bench/ and the self-check).

``run_ranks(world, fn, *args)`` starts ``world`` spawned processes, each calling
``fn(rank, world, store, *args)``, and returns their results in rank order. A rank that raises,
dies or is still running at ``timeout`` (every rank is then killed) makes it raise RankFailure
with each such rank's error and traceback.
``Ranks(world, fn, *args)`` starts the same processes and returns at once: the caller may kill
a rank (``kill``), see which still run (``alive``, ``join``), collect the results as run_ranks
does (``wait``), and ends every process with ``close`` (or by leaving its ``with`` block).
With ``start_method="forkserver"`` (or ``PYRING_START_METHOD=forkserver``) the ranks are forked
from a server that has imported ``preload`` (torch and pyring unless given): a rank then starts
in milliseconds instead of importing torch itself, which is quicker where many jobs start in
turn or ranks outnumber cores. Either way a rank sees the launcher's environment as it is when
the job starts, plus ``env``.
A rank still running at ``timeout`` writes every Python thread's stack to its stderr
(faulthandler, on STACK_SIGNAL) before it is killed. A rank dies with the process that started
it. By default the store is a TCPStore hosted here;
``store=(host, port, prefix)`` joins an existing one (torchrun's) under a key prefix instead,
and ``ranks`` starts only some of the world's ranks here.
"""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import multiprocessing.reduction as mp_reduction
import os
import queue
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable

import torch.distributed as dist

from . import _settings

_PR_SET_PDEATHSIG = 1
START_METHODS = _settings.START_METHODS
DEFAULT_PRELOAD = ("torch", "pyring")
# A rank still running at its job's timeout is sent STACK_SIGNAL, on which faulthandler writes
# its threads' stacks, and is killed STACK_WAIT_S later.
STACK_SIGNAL = signal.SIGUSR1
STACK_WAIT_S = 1.0
# Once a rank has failed, the seconds the others get to end before they count as hung: a rank
# stuck where no timeout reaches it (a deadlock in a driver) must not hold the job to its
# whole limit.
FAILURE_GRACE_S = 60.0


def _die_with_parent(parent: int, direct: bool) -> None:
    """SIGKILL to this process once the launcher `parent` is gone. `direct`: the launcher is
    this process's parent (spawn). Otherwise a fork server is, which outlives the launcher
    while its children run, and a thread watches the launcher instead."""
    if not direct:
        threading.Thread(target=_watch_launcher, daemon=True).start()
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the rank outlives a killed parent
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(3)


def _watch_launcher() -> None:
    # The sentinel is the launcher's end of the pipe that carried this process's start: it
    # reads as ready once the launcher is gone, at once if it already is.
    mp_connection.wait([mp.parent_process().sentinel])
    os.kill(os.getpid(), signal.SIGKILL)


class _LauncherState:
    """What a forked rank takes from the launcher as its job starts: fds 1 and 2 and the
    environment. A fork server's own are those of the time it started (another job's, a
    finished test's capture). Pickled first among the rank's arguments, so that it is in place
    before fn's module is imported. The fds are looked at before the job opens anything, so
    that a closed one is not mistaken for the job's own socket or pipe that took its number."""

    def __init__(self) -> None:
        self.open = [fd for fd in (1, 2) if _is_open(fd)]
        self.environ = dict(os.environ)

    def __reduce__(self) -> tuple:
        fds = tuple(mp_reduction.DupFd(fd) if fd in self.open else None for fd in (1, 2))
        return _adopt, (*fds, self.environ)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


_fork_server_lock = threading.Lock()


def _ensure_fork_server() -> None:
    """Starts the fork server unless it runs, resolving its preload's imports along this
    process's sys.path. CPython's server (3.11 among others; a bug CPython fixed later) runs as
    ``python -c``, the working directory first on its path, and ignores the launcher's path:
    from a source checkout whose pyring/ has no built core, the preload of the installed pyring
    failed silently and every rank imported pyring itself (about 1.3 s of a core each). The
    server is started with PYTHONPATH set to this path and PYTHONSAFEPATH (3.11 and later),
    both restored at once (a rank adopts the launcher's environment as it starts)."""
    from multiprocessing import forkserver

    keys = ("PYTHONPATH", "PYTHONSAFEPATH")
    with _fork_server_lock:
        saved = {k: os.environ.get(k) for k in keys}
        os.environ["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        os.environ["PYTHONSAFEPATH"] = "1"
        try:
            forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _adopt(out: Any, err: Any, environ: dict) -> None:
    """Makes this process's fds 1 and 2 and its environment the launcher's. Where the launcher
    had an fd closed, this process's is left alone: its number may be one of the fork
    server's own."""
    for given, target in ((out, 1), (err, 2)):
        if given is not None:
            fd = given.detach()
            os.dup2(fd, target)
            os.close(fd)
    os.environ.clear()
    os.environ.update(environ)


def _child(
    launcher: None,  # a forked rank took the launcher's state (_LauncherState) as this unpickled
    fn: Callable,
    rank: int,
    world: int,
    where: tuple,
    env: dict,
    results: Any,
    args: tuple,
    parent: tuple[int, bool],
    hard_exit: bool,
) -> None:
    _die_with_parent(*parent)
    faulthandler.register(STACK_SIGNAL, all_threads=True)
    os.environ.update(env)
    try:
        host, port, prefix, joined = where
        store = dist.TCPStore(
            host,
            port,
            None if joined else world,
            is_master=False,
            timeout=datetime.timedelta(seconds=60),
        )
        if prefix:
            store = dist.PrefixStore(prefix, store)
        results.put((rank, True, fn(rank, world, store, *args)))
    except BaseException as e:  # report everything, including SystemExit
        results.put((rank, False, (type(e).__name__, str(e), traceback.format_exc())))
    if hard_exit:
        results.close()
        results.join_thread()  # the result is sent
        os._exit(0)


class RankFailure(AssertionError):
    """Some ranks failed, died or were killed at the timeout: ``failures`` maps each such rank
    to (kind, message, traceback or log tail); kind is the exception's type name, "Hang" (still
    running at the timeout, then killed) or "Exit" (a rank process that ended without a
    result)."""

    def __init__(self, failures: dict[int, tuple[str, str, str]], note: str = "") -> None:
        self.failures = failures
        text = "\n".join(f"--- rank {r}: {t}: {m}\n{tb}" for r, (t, m, tb) in failures.items())
        super().__init__(f"{len(failures)} rank(s) failed{note}:\n{text}")


class Ranks:
    """One job's rank processes, running from construction until `wait` or `close` ends them.

    `start_method` is "spawn" or "forkserver" (None: PYRING_START_METHOD's, default spawn);
    `preload` names the modules the fork server imports when it starts (default
    DEFAULT_PRELOAD; this process's first forkserver job starts the server, later jobs reuse
    it whatever their `preload`). The other arguments are run_ranks's. `pids` maps each started
    rank to its process id."""

    def __init__(
        self,
        world: int,
        fn: Callable,
        *args: Any,
        env: dict | None = None,
        ranks: list[int] | None = None,
        store: tuple[str, int, str] | None = None,
        hard_exit: bool = False,
        start_method: str | None = None,
        preload: list[str] | None = None,
    ) -> None:
        if start_method is None:
            start_method = _settings.read("PYRING_START_METHOD")
        elif start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, not {start_method!r}")
        ctx = mp.get_context(start_method)
        forked = start_method == "forkserver"
        launcher = _LauncherState() if forked else None
        if forked:
            ctx.set_forkserver_preload(list(DEFAULT_PRELOAD if preload is None else preload))
        self.ranks = list(range(world)) if ranks is None else list(ranks)
        self._master = None
        if store is None:
            self._master = dist.TCPStore(
                "127.0.0.1",
                0,
                world + 1,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=60),
            )
            where = ("127.0.0.1", self._master.port, "", False)
        else:
            where = (*store, True)
        self._results = ctx.Queue()
        parent = (os.getpid(), not forked)
        self._procs = {
            r: ctx.Process(
                target=_child,
                daemon=True,
                args=(launcher, fn, r, world, where, env or {}, self._results, args, parent,
                      hard_exit),
            )
            for r in self.ranks
        }
        self._closed = False
        self.exitcodes: dict[int, int | None] = {}
        try:
            if forked:
                _ensure_fork_server()  # where the first start would: after the store's fds
            for p in self._procs.values():
                p.start()
        except BaseException:
            self.close()
            raise
        self.pids = {r: p.pid for r, p in self._procs.items()}

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def kill(self, rank: int) -> None:
        """Sends SIGKILL to `rank`'s process (nothing when it has ended)."""
        if not self._closed:
            self._procs[rank].kill()

    def alive(self) -> list[int]:
        """The ranks whose processes still run."""
        if self._closed:
            return []
        return [r for r, p in self._procs.items() if p.is_alive()]

    def join(self, timeout: float) -> list[int]:
        """Waits up to `timeout` seconds for every process to end; returns alive()."""
        end = time.monotonic() + timeout
        for p in self._procs.values():
            if not self._closed and p.pid is not None:
                p.join(timeout=max(0.0, end - time.monotonic()))
        return self.alive()

    def wait(self, timeout: float = 120.0, allow_failures: bool = False) -> list[Any]:
        """run_ranks's result, counting `timeout` from this call, and at most FAILURE_GRACE_S
        after the first rank's failure; every process has ended when it returns or raises."""
        got: dict[int, Any] = {}
        failures: dict[int, tuple[str, str, str]] = {}
        deadline = time.monotonic() + timeout
        limit = f"within {timeout:g} s"
        try:
            while len(got) + len(failures) < len(self.ranks):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    rank, ok, value = self._results.get(timeout=min(left, 0.5))
                except queue.Empty:
                    # A rank that died without reporting (SIGKILL) counts once it has exited.
                    if not self.alive():
                        break
                    continue
                if ok:
                    got[rank] = value
                else:
                    if not failures and time.monotonic() + FAILURE_GRACE_S < deadline:
                        deadline = time.monotonic() + FAILURE_GRACE_S
                        limit = f"{FAILURE_GRACE_S:g} s after rank {rank} failed"
                    failures[rank] = value
        finally:
            for p in self._procs.values():
                p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            hung = set(self.alive())
            self._dump_stacks(hung - set(got) - set(failures))
            self.close()
        if allow_failures:
            out = {r: got.get(r) for r in self.ranks}
            for r, (t, m, _) in failures.items():
                out[r] = (t, m)
            return [out[r] for r in self.ranks]
        for r in self.ranks:
            if r not in got and r not in failures:
                failures[r] = (
                    ("Hang", f"no result {limit}, killed (its threads' stacks are on its "
                     "stderr)", "") if r in hung else
                    ("Exit", f"ended without a result (exit code {self.exitcodes[r]})", ""))
        if failures:
            raise RankFailure(dict(sorted(failures.items())))
        return [got[r] for r in self.ranks]

    def _dump_stacks(self, ranks: set[int]) -> None:
        """Has each of `ranks` write its threads' stacks to its stderr, and gives them
        STACK_WAIT_S to do it."""
        for r in ranks:
            p = self._procs[r]
            if p.pid is not None and p.is_alive():
                try:
                    os.kill(p.pid, STACK_SIGNAL)
                except ProcessLookupError:
                    pass
        if ranks:
            time.sleep(STACK_WAIT_S)

    def close(self) -> None:
        """Kills every process still running and waits for it: none outlives this call. Sets
        `exitcodes` (negative: the signal that ended the process, -9 for a kill)."""
        if self._closed:
            return
        self._closed = True
        for r, p in self._procs.items():
            if p.pid is None:  # never started
                continue
            if p.is_alive():
                p.kill()
            p.join()
            self.exitcodes[r] = p.exitcode
            p.close()
        self._results.close()
        self._master = None


def run_ranks(
    world: int,
    fn: Callable,
    *args: Any,
    env: dict | None = None,
    timeout: float = 120.0,
    allow_failures: bool = False,
    ranks: list[int] | None = None,
    store: tuple[str, int, str] | None = None,
    hard_exit: bool = False,
    start_method: str | None = None,
) -> list[Any]:
    """Returns each started rank's result (or, with allow_failures, (type, message) of its
    error; None for a rank that died without reporting), in the order of `ranks` (default:
    every rank of `world`). `start_method` is Ranks's. With hard_exit, a rank's process ends
    with os._exit once its result is sent: neither the objects fn left alive nor atexit
    handlers are torn down."""
    with Ranks(world, fn, *args, env=env, ranks=ranks, store=store, hard_exit=hard_exit,
               start_method=start_method) as job:
        return job.wait(timeout, allow_failures)
