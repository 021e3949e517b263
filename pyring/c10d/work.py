"""The c10d Work that the ``pyring`` backend returns, over one :class:`pyring.Work`."""

from __future__ import annotations

import datetime
from typing import Any

from ..work import Work

try:
    import torch
    import torch.distributed as dist

    _Work = dist.Work
except (ImportError, AttributeError):  # no torch, or a torch built without distributed
    _Work = object


_DISABLE = getattr(getattr(globals().get("torch"), "compiler", None), "disable", None)


def run_as_is(fn: Any) -> Any:
    """`fn`, which torch.compile runs as it is (eager_under_compile, for one function)."""
    return _DISABLE(fn) if _DISABLE is not None else fn


def eager_under_compile(*torch_private: str) -> Any:
    """Class decorator: torch.compile runs the class's public methods, and the private ones
    c10d defines (``torch_private``), as they are. c10d's C++ (DDP's reducer, the functional
    collectives) calls a Python group and its Works back, also while a compiled region runs;
    traced, they fail on their own attributes (c10d's objects are opaque there). The helpers
    these call run under them. A no-op without ``torch.compiler``."""
    def apply(cls: type) -> type:
        if _DISABLE is None:
            return cls
        for name, member in list(vars(cls).items()):
            if name.startswith("_") and name not in torch_private:
                continue
            if isinstance(member, property):
                setattr(cls, name, property(_DISABLE(member.fget), member.fset, member.fdel,
                                            member.__doc__))
            elif callable(member) and not isinstance(member, (staticmethod, classmethod)):
                setattr(cls, name, _DISABLE(member))
        return cls

    return apply


def _seconds(timeout: Any) -> float | None:
    """Seconds of a c10d timeout; None for "none set" (None, zero or negative)."""
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    return float(timeout) if timeout is not None and timeout > 0 else None


@eager_under_compile("_source_rank")
class PyringWork(_Work):
    """c10d's Work over one :class:`pyring.Work` (None: the collective already ran).

    ``work`` None: the op completed before the Work was made (``source``: its sender).
    ``wait(timeout)`` raises the collective's error (pyring.CommError) or pyring.CommTimeout.
    ``get_future()`` completes with the list of output tensors, on one of pyring's callback threads;
    it is made on first request, except where outputs need a copy-out (``finish``), which runs
    in the future's callback before the future completes.
    """

    def __init__(self, work: Work | None, outputs: list, finish: Any = None,
                 timeout_s: float | None = None, source: int = -1) -> None:
        super().__init__()
        self._work = work
        self._source = source  # a receive that completed before this Work was made
        self._outputs = outputs
        self._finish = finish
        self._timeout_s = timeout_s
        self._future = self._chain() if work is not None and finish is not None else None

    def _chain(self) -> Any:
        outputs, finish = self._outputs, self._finish

        def done(fut: Any) -> list:
            fut.value()  # re-raises the collective's error into the returned future
            if finish is not None:
                finish()
            return outputs

        return self._work.get_future().then(done)

    def wait(self, timeout: Any = None) -> bool:
        if self._work is not None:
            self._work.wait(_seconds(timeout) or self._timeout_s)
            if self._finish is not None:
                self._future.wait()  # the copy-out has run
        return True

    def is_completed(self) -> bool:
        if self._work is None:
            return True
        if self._finish is not None:
            return self._future.done()
        return self._work.is_completed()

    def _source_rank(self) -> int:
        """The sender of a completed receive (torch calls it after recv from any source)."""
        return self._work.source if self._work is not None else self._source

    source_rank = _source_rank

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        """The collective's error once it has failed; None while running or on success."""
        if not self.is_completed():
            return None
        try:
            self.get_future().wait()  # set by a callback thread just after completion
        except Exception as e:  # the future re-raises the collective's error
            return e
        return None

    def result(self) -> list:
        self.wait()
        return self._outputs

    def get_future(self) -> Any:
        if self._future is None:
            if self._work is None:
                self._future = torch.futures.Future()
                self._future.set_result(self._outputs)
            else:
                self._future = self._chain()
        return self._future

    def __repr__(self) -> str:
        return f"<pyring.c10d.backend.PyringWork {self._work or 'completed'}>"
