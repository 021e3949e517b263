"""Which rank hung, and where: when a collective times out, the ranks agree through the store on
what each last entered and completed, and the timeout's message says it.

Every communicator of more than one rank is watched by one thread per process, which polls its
store for a request every ``poll_s`` (a tenth of the timeout, at most 0.5 s). A rank whose
collective #k timed out (on the thread running it, before the communicator gives up) publishes
where it stands, raises the request, and waits up to ``2 * poll_s + 0.5`` s for every rank's
state: ranks waiting in the same collective publish their own when they time out, and the
watcher of a rank stuck elsewhere (user code, a data loader) publishes it within ``poll_s``.
The account names every rank that is not at #k, in rank order, so every rank that arrived
gives the same one. A rank that never answers is named as such; a store that does not answer
leaves the message as it was, with a note saying so.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import weakref
from typing import Any

from .. import _C

REQUEST = "hang/request"


def _state_key(rank: int) -> str:
    return f"hang/state/{rank}"


def poll_interval(timeout_s: float) -> float:
    return min(0.5, max(0.05, timeout_s / 10))


def account_wait(timeout_s: float) -> float:
    """The longest account() takes: what a timeout may add to the deadline."""
    return 2 * poll_interval(timeout_s) + 0.75


def _describe(entry: dict) -> str:
    """'all_reduce, 4.0 MiB' from a flight recorder entry."""
    nbytes = entry["count"] * _C.DTYPE_SIZES[_C.DTYPE_NAMES.index(entry["dtype"])]
    size = next((f"{nbytes / d:.1f} {u}" for d, u in ((1 << 30, "GiB"), (1 << 20, "MiB"),
                                                       (1 << 10, "KiB")) if nbytes >= d),
                f"{nbytes} B")
    return f"{entry['kind']}, {size}"


def state_of(core: Any) -> dict:
    """Where this rank stands: the last collective entered and the last completed, with the
    latter's kind and size when the flight recorder still holds it."""
    completed = core.completed_seq
    last = next((e for e in core.debug_dump() if e["seq"] == completed), None)
    return {"entered": core.entered_seq, "completed": completed,
            "last": _describe(last) if last is not None else None}


def compose(seq: int, what: str, states: dict[int, dict | None], world: int) -> str:
    """The account of collective #seq (described by ``what``) from every rank's state; None
    for a rank that did not answer."""
    kind = what.split("(", 1)[0]
    lines = []
    for r in range(world):
        s = states.get(r)
        if s is None:
            lines.append(f"rank {r} did not answer (dead, unreachable, or stuck where the "
                         "interpreter cannot run its watcher)")
        elif s["entered"] < seq:
            done = (f"its last completed collective is #{s['completed']}"
                    + (f" ({s['last']})" if s["last"] else "") if s["completed"]
                    else "it has completed none")
            lines.append(f"rank {r} never entered {kind} #{seq}; {done}")
        elif s["entered"] > seq:
            lines.append(f"rank {r} has gone on to #{s['entered']}")
    if not lines:
        return (f"hang account: every rank entered {kind} #{seq}, so its data did not arrive "
                "in time (a slow, cut or overloaded link)")
    return "hang account: " + "; ".join(lines)


def _gather(store: Any, rank: int, world: int, mine: dict, wait_s: float,
            out: dict[int, dict | None]) -> None:
    store.set(_state_key(rank), json.dumps(mine))
    store.set(REQUEST, "1")
    keys = {r: _state_key(r) for r in range(world)}
    end = time.monotonic() + wait_s
    while keys:
        for r, k in list(keys.items()):
            if store.check([k]):
                out[r] = json.loads(store.get(k))
                del keys[r]
        if not keys or time.monotonic() >= end:
            break
        time.sleep(0.02)


def account(store: Any, core_ref: Any, rank: int, world: int, timeout_s: float, seq: int,
            what: str) -> str:
    """The hook the core calls when collective #seq times out (Communicator.set_hang_account).
    Returns within 2 * poll_interval + 0.75 s (at most 1.75 s), whatever the store does."""
    core = core_ref()
    if core is None:
        return ""
    wait_s = account_wait(timeout_s) - 0.25
    states: dict[int, dict | None] = {}
    errors: list[str] = []

    def run() -> None:
        try:
            _gather(store, rank, world, state_of(core), wait_s, states)
        except Exception as e:  # the store is gone or broken
            # Its text only: the exception's traceback holds this frame, whose closure holds
            # `errors` and the core, a cycle that kept a failed communicator's buffers and
            # fds until the next cyclic collection.
            errors.append(str(e))

    t = threading.Thread(target=run, name="pyring-hang-account", daemon=True)
    t.start()
    t.join(wait_s + 0.25)
    if errors or t.is_alive():
        why = f"failed: {errors[0]}" if errors else f"did not answer within {wait_s:.1f} s"
        return f"no account of the other ranks: the store {why}"
    return compose(seq, what, dict(states), world)


class _Watcher:
    """One thread per process answering every live communicator's requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[Any, Any, int, float]] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._exit_hook = False

    def add(self, key: int, store: Any, core: Any, rank: int, timeout_s: float) -> None:
        with self._lock:
            if self._stopped:
                return
            self._watched[key] = (store, weakref.ref(core), rank, poll_interval(timeout_s))
            if self._thread is None or not self._thread.is_alive():
                if not self._exit_hook:
                    # Before the interpreter stops its threads: a daemon thread it stops while
                    # inside a store call would unwind through C++ and abort the process.
                    try:
                        threading._register_atexit(self.stop)
                    except RuntimeError:  # the interpreter is already stopping
                        return
                    self._exit_hook = True
                self._thread = threading.Thread(target=self._run, name="pyring-hang-watch",
                                                daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Ends the thread (at interpreter exit), waiting up to 2 s for its store call."""
        with self._lock:
            self._stopped = True
            self._watched.clear()
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)

    def remove(self, key: int) -> None:
        """Stops watching `key`; when it was the last, waits (up to 1 s, for a store call) for
        the thread to end, so that no pyring thread outlives the last communicator."""
        with self._lock:
            self._watched.pop(key, None)
            thread = None if self._watched else self._thread
            self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._watched:
                    self._thread = None
                    return
                watched = list(self._watched.items())
            for key, (store, core_ref, rank, _) in watched:
                if self._stopped:
                    return
                core = core_ref()
                try:
                    if core is not None and not store.check([REQUEST]):
                        continue
                    if core is not None and not store.check([_state_key(rank)]):
                        store.set(_state_key(rank), json.dumps(state_of(core)))
                except Exception:  # a broken store: the requesting ranks say so
                    pass
                with self._lock:  # answered, freed, or the store is gone: watched no more
                    self._watched.pop(key, None)
            self._wake.wait(min(w[3] for _, w in watched))
            self._wake.clear()


_watcher = _Watcher()


def watch(store: Any, core: Any, rank: int, world: int, timeout_s: float) -> None:
    """Installs the account on ``core`` and has this process's watcher answer for it, until
    unwatch(core)."""
    if world < 2:
        return
    core.set_hang_account(functools.partial(account, store, weakref.ref(core), rank, world,
                                            timeout_s))
    _watcher.add(id(core), store, core, rank, timeout_s)


def unwatch(core: Any) -> None:
    _watcher.remove(id(core))
