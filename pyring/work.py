"""Work handles returned by collectives called with ``async_op=True``."""

from __future__ import annotations

import threading
from typing import Any

from .errors import CommTimeout
from .runtime.buffers import first_tensor

# Longest is_completed() waits for a work whose device results are in place to be marked.
_MARK_WAIT_S = 10.0


class Work:
    """One queued collective.

    ``get_future()`` returns a ``torch.futures.Future`` whose value is the collective's output
    tensor (or array); it completes on a pyring callback thread, never the progress thread,
    so its callbacks may launch collectives and wait on them.
    """

    __slots__ = ("_work", "_result", "_future", "_finish", "_lock", "_ticket", "_stream")

    def __init__(self, work: Any, result: Any, finish: Any = None, ticket: Any = None,
                 stream: Any = None) -> None:
        self._work = work
        self._result = result
        self._future = None
        # Device collectives (as NCCL's): the ticket of the results on the device, and a
        # function that returns the caller's current stream when wait() is called.
        self._ticket = ticket
        self._stream = stream
        # A copy-out from the exchange's buffer into the outputs (coalesced calls): run once,
        # after success, by whichever of wait(), is_completed() or the future gets there first.
        self._finish = finish
        self._lock = threading.Lock() if finish is not None else None

    def _run_finish(self) -> None:
        if self._finish is not None:
            with self._lock:
                finish, self._finish = self._finish, None
                if finish is not None:
                    finish()

    @property
    def source(self) -> int:
        """The rank a completed receive's message came from (-1 before then and for other
        ops)."""
        return self._work.source

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until done (and the future, if one was made, is set) and returns True; raises
        the collective's error, or CommTimeout when ``timeout`` seconds pass first (the
        collective itself keeps running).

        On device buffers: the host waits for the collective's host part (as gloo's CUDA
        work does), then the caller's current stream waits for the results, and the host does
        not wait for device work; ``synchronize()`` waits for that too. A stream made to wait
        for results that pyring's thread has still to queue would deadlock the process against
        any call that synchronizes the device meanwhile, on any thread (a kernel's module
        loaded lazily, cudaMalloc, cudaHostAlloc, cudaFree, a copy to pageable memory)."""
        if self._ticket is not None:
            self._wait_host(timeout)
            self._ticket.order_after(self._stream())
            self._run_finish()  # queued on that stream, after the results
            return True
        return self.synchronize(timeout)

    def _wait_host(self, timeout: float | None) -> None:
        """Blocks until the collective's host part has ended; raises its error, or CommTimeout."""
        if not self._work.wait(-1.0 if timeout is None else float(timeout)):
            raise CommTimeout(f"Timed out: {self._work.description} not complete after "
                              f"{timeout} s")

    def synchronize(self, timeout: float | None = None) -> bool:
        """Blocks the host until the results are in place (on the device, for device buffers)
        and returns True; raises as wait() does."""
        self._wait_host(timeout)
        if self._ticket is not None:
            self._ticket.wait_done(-1.0 if timeout is None else float(timeout))
        self._run_finish()  # after the results on the device, where they are there
        if self._future is not None:
            # A callback thread sets the future just after the work completes.
            self._future.wait()
        return True

    def is_completed(self) -> bool:
        """Done, with the results in place (on the device, for device buffers)."""
        if self._ticket is not None:
            if not self._ticket.done():
                return False
            # The device's done flag is raised once the host part has ended (after its copies
            # back, or after a failure); the thread that ran it marks the work an instant
            # later, so a caller whose stream has passed the flag sees a completed work.
            try:
                self._work.wait(_MARK_WAIT_S)
            except Exception:  # failed: is_completed() is True, wait() raises the error
                pass
        if not self._work.is_completed():
            return False
        if self._finish is not None:
            try:
                self._work.wait(0.0)
            except Exception:  # failed: no copy-out; wait() raises the error
                return True
            self._run_finish()
        return True

    def result(self) -> Any:
        """The output tensor, after waiting."""
        self.wait()
        return self._result

    def get_future(self) -> Any:
        import torch

        if self._future is None:
            # A future over CUDA tensors names their device, so that torch orders its users'
            # streams after the value (set once the results are in place on the device).
            # (The coalesced calls' result is a list of tensors, on one device.)
            first = first_tensor(self._result)
            devices = [first.device] if getattr(first, "is_cuda", False) else None
            fut = torch.futures.Future(devices=devices)
            result = self._result

            def done(error: BaseException | None) -> None:
                if error is None:
                    try:
                        if self._ticket is not None:
                            # The future's value is the device result: it completes once
                            # the copies back are done.
                            self._ticket.wait_done()
                        self._run_finish()
                    except Exception as e:
                        fut.set_exception(e)
                        return
                    fut.set_result(result)
                else:
                    fut.set_exception(error)

            self._work.add_done_callback(done)
            self._future = fut
        return self._future

    def __repr__(self) -> str:
        state = "completed" if self.is_completed() else "pending"
        return f"<pyring.Work {self._work.description} {state}>"
