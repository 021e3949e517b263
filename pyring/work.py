"""Work handles returned by collectives called with ``async_op=True``."""

from __future__ import annotations

from typing import Any

from .errors import CommTimeout


class Work:
    """One queued collective.

    ``get_future()`` returns a ``torch.futures.Future`` whose value is the collective's output
    tensor (or array); it completes on a pyring callback thread, never the progress thread,
    so its callbacks may launch collectives and wait on them.
    """

    __slots__ = ("_work", "_result", "_future")

    def __init__(self, work: Any, result: Any) -> None:
        self._work = work
        self._result = result
        self._future = None

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until done (and the future, if one was made, is set) and returns True; raises
        the collective's error, or CommTimeout when ``timeout`` seconds pass first (the
        collective itself keeps running)."""
        if not self._work.wait(-1.0 if timeout is None else float(timeout)):
            raise CommTimeout(f"Timed out: {self._work.description} not complete after "
                              f"{timeout} s")
        if self._future is not None:
            # A callback thread sets the future just after the work completes.
            self._future.wait()
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def result(self) -> Any:
        """The output tensor, after waiting."""
        self.wait()
        return self._result

    def get_future(self) -> Any:
        import torch

        if self._future is None:
            fut = torch.futures.Future()
            result = self._result

            def done(error: BaseException | None) -> None:
                if error is None:
                    fut.set_result(result)
                else:
                    fut.set_exception(error)

            self._work.add_done_callback(done)
            self._future = fut
        return self._future

    def __repr__(self) -> str:
        state = "completed" if self.is_completed() else "pending"
        return f"<pyring.Work {self._work.description} {state}>"
