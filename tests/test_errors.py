"""Bad arguments, bad configuration, dead peers and deadlines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

import pyring
from pyring.launch import START_METHODS, RankFailure, Ranks, run_ranks


@pytest.fixture()
def solo():
    with pyring.init(0, 1, dist.HashStore(), set_default=False) as comm:
        yield comm


def _bad_calls(comm):
    """(callable, exception type, text the message must contain) for each bad argument."""
    t = torch.zeros(8)
    return [
        (lambda: comm.all_reduce(torch.zeros(4, 4).t()), ValueError, "not contiguous"),
        (lambda: comm.all_reduce(torch.zeros(4, dtype=torch.complex64)), TypeError,
         "unsupported dtype"),
        (lambda: comm.all_reduce(torch.zeros(4, dtype=torch.bool)), TypeError, "unsupported dtype"),
        (lambda: comm.all_reduce(torch.zeros(4, device="meta")), ValueError, "device meta"),
        (lambda: comm.all_reduce(torch.zeros(4).to_sparse()), TypeError, "layout"),
        (lambda: comm.all_reduce([1.0, 2.0]), TypeError, "torch.Tensor or numpy.ndarray"),
        (lambda: comm.all_reduce(t, out=torch.zeros(7)), ValueError, "out has 7 elements"),
        (lambda: comm.all_reduce(t, out=torch.zeros(8, dtype=torch.float64)), TypeError,
         "float32 but out is float64"),
        (lambda: comm.all_reduce(t, op="xor"), ValueError, "unknown reduce op 'xor'"),
        (lambda: comm.all_reduce(t, op=3), TypeError, "op must be"),
        (lambda: comm.all_reduce(t, op=dist.ReduceOp.BAND), ValueError, "BAND"),
        (lambda: comm.broadcast(t, src=comm.world_size), ValueError, "src="),
        (lambda: comm.all_gather_into_tensor(torch.zeros(3), t), ValueError,
         "out has 3 elements"),
        (lambda: comm.reduce_scatter_tensor(torch.zeros(3), t), ValueError,
         "tensor has 8 elements"),
        (lambda: comm.all_reduce(_readonly()), ValueError, "read-only"),
        (lambda: comm.all_reduce(np.zeros((4, 4), np.float32).T), ValueError,
         "not C-contiguous"),
    ]


def _readonly():
    a = np.zeros(4, np.float32)
    a.flags.writeable = False
    return a


def test_bad_arguments_single_rank(solo):
    for k, (call, exc, text) in enumerate(_bad_calls(solo)):
        with pytest.raises(exc) as info:
            call()
        assert text in str(info.value), f"case {k}: {info.value!r}"
        assert "all_reduce" in str(info.value) or "broadcast" in str(info.value) or \
            "gather" in str(info.value) or "scatter" in str(info.value), str(info.value)


def test_partial_overlap_rejected(solo):
    base = torch.zeros(12)
    with pytest.raises(ValueError, match="partially overlaps"):
        solo.all_reduce(base[0:8], out=base[2:10])


def _bad_then_good(rank, world, store):
    comm = pyring.init(rank, world, store, set_default=False, timeout=20)
    if rank == 0:
        errors = 0
        for call, exc, _ in _bad_calls(comm):
            try:
                call()
            except exc:
                errors += 1
    t = torch.full((1000,), float(rank + 1))
    comm.all_reduce(t)
    comm.close()
    return float(t[0]), (errors if rank == 0 else None)


def test_bad_arguments_send_nothing():
    """Rank 0 makes every mistake first; the next real collective still lines up."""
    res = run_ranks(2, _bad_then_good, timeout=120)
    assert res[0][0] == res[1][0] == 3.0
    assert res[0][1] == len(_bad_calls(_FakeComm()))


class _FakeComm:
    world_size = 2


@pytest.mark.parametrize(
    "env,kwargs,text",
    [({"PYRING_TRANSPORT": "carrier-pigeon"}, {}, "PYRING_TRANSPORT='carrier-pigeon'"),
     ({"PYRING_TIMEOUT": "soon"}, {}, "PYRING_TIMEOUT"),
     ({"PYRING_SEGMENT_BYTES": "lots"}, {}, "PYRING_SEGMENT_BYTES"),
     ({"PYRING_DEBUG": "LOUD"}, {}, "valid: WARN, INFO, DETAIL"),
     ({}, {"segment_bytes": 4}, "at least 8"),
     ({}, {"timeout": -1}, "positive")],
)
def test_bad_configuration(monkeypatch, env, kwargs, text):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError) as info:
        pyring.init(0, 1, dist.HashStore(), set_default=False, **kwargs)
    assert text in str(info.value)


def test_init_without_store_names_missing_environment(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"):
        pyring.init()


def test_no_default_communicator():
    pyring.destroy()
    with pytest.raises(pyring.Error, match="pyring.init"):
        pyring.all_reduce(torch.zeros(1))


def test_closed_communicator_raises(solo):
    solo.close()
    with pytest.raises(pyring.CommError, match="closed"):
        solo.all_reduce(torch.zeros(4))


def _killed_peer(rank, world, store, transport):
    comm = pyring.init(rank, world, store, transport=transport, set_default=False, timeout=30)
    big = torch.ones(8 << 20)
    comm.all_reduce(big[:1000])  # everyone is connected and warm
    if rank == 1:
        comm.all_reduce(big, async_op=True)
        time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        for _ in range(20):
            comm.all_reduce(big)
        return ("no error", "", 0.0)
    except pyring.CommError as e:
        first = (type(e).__name__, str(e), time.monotonic() - start)
    try:
        comm.all_reduce(big[:10])
        again = "no error"
    except pyring.CommError as e:
        again = str(e)
    comm.close()
    return first + (again,)


def _sends_then_ends(rank, world, store, transport, ending):
    import pyring

    comm = pyring.init(rank, world, store, transport=transport, set_default=False)
    x = torch.arange(1000, dtype=torch.float32) if rank == 1 else torch.zeros(1000)
    comm.all_reduce(torch.zeros(10))  # everyone is connected
    if rank == 1:
        comm.send(x * 2, 0, 5)
        comm.broadcast(x, src=1)  # complete once its bytes are in rank 0's inbox
        if ending == "exit":
            os._exit(0)  # at once: no close, and the process is gone
        comm.close()  # the peer learns it at once, but what was sent stays receivable
        time.sleep(3.0)
        return None
    # Rank 1 has ended by the time these look, and the peer checks ran while they slept.
    time.sleep(1.0)
    got = torch.zeros(1000)
    comm.recv(got, 1, 5)
    comm.broadcast(x, src=1)
    return bool((got == torch.arange(1000) * 2).all()), bool((x == torch.arange(1000)).all())


@pytest.mark.parametrize("ending", ["exit", "close"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_what_a_peer_sent_before_it_ended_arrives(transport, ending):
    res = run_ranks(2, _sends_then_ends, transport, ending, timeout=120, allow_failures=True)
    assert res[0] == (True, True), res[0]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_killed_peer_every_survivor_raises(transport):
    res = run_ranks(3, _killed_peer, transport, timeout=120, allow_failures=True)
    assert res[1] is None, f"rank 1 should have died silently, got {res[1]}"
    for rank in (0, 2):
        kind, msg, elapsed, again = res[rank]
        assert kind in ("CommError", "CommTimeout"), (rank, kind, msg)
        assert f"on rank {rank}/3" in msg and "all_reduce" in msg and "bytes" in msg, msg
        # The original cause, relayed by the rank that saw it first: breaking the link to
        # the dead rank must not cut that rank's other point-to-point links.
        assert "rank 1 (pid" in msg or "rank 1 at" in msg, msg
        assert elapsed < 30, f"rank {rank} took {elapsed:.1f} s to notice"
        assert "unusable after an earlier failure" in again, again


def _closed_peer(rank, world, store, transport, symmetric):
    import pyring

    comm = pyring.init(rank, world, store, transport=transport, set_default=False, timeout=30)
    x = comm.empty(1 << 16) if symmetric else torch.ones(1 << 16)
    comm.all_reduce(x)  # everyone is connected and warm
    if rank == 1:
        comm.close()
        time.sleep(8.0)  # alive, and never calls again
        return None
    start = time.monotonic()
    try:
        comm.all_reduce(x)
        return ("no error", "", 0.0)
    except pyring.CommError as e:
        return (type(e).__name__, str(e), time.monotonic() - start)


@pytest.mark.parametrize("transport,symmetric", [("shm", False), ("shm", True), ("tcp", False)])
def test_a_peer_that_closed_fails_the_next_collective_at_once(transport, symmetric):
    """Not at the deadline (30 s): a closed rank tells its peers, and one waiting for bytes
    it will never send raises; the third rank learns the cause from the second."""
    res = run_ranks(3, _closed_peer, transport, symmetric, timeout=120)
    assert res[1] is None
    for rank in (0, 2):
        kind, msg, elapsed = res[rank]
        assert kind == "CommError", (rank, kind, msg)
        assert "rank 1 closed its communicator" in msg or "closed by the peer" in msg, msg
        assert elapsed < 5, f"rank {rank} took {elapsed:.1f} s to notice"


def _rank_1_blocks(rank, world, store):
    while rank == 1:
        time.sleep(0.05)
    return "done"


@pytest.mark.parametrize("start_method", START_METHODS)
def test_launcher_kills_one_rank_and_leaves_no_process(start_method):
    """wait() returns once the killed rank is seen dead, not at its timeout. Its bound counts
    from the call and so includes rank 0's start (over 15 s for spawn under a sanitizer)."""
    timeout = 120.0
    with Ranks(2, _rank_1_blocks, start_method=start_method) as job:
        pids = list(job.pids.values())
        job.kill(1)
        start = time.monotonic()
        res = job.wait(timeout=timeout, allow_failures=True)
        waited = time.monotonic() - start
    assert res == ["done", None], res
    assert waited < timeout / 2, f"wait() took {waited:.1f} s of its {timeout:g} s"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _exits_or_hangs(rank, world, store):
    if rank == 0:
        os._exit(7)
    time.sleep(600)


def test_launcher_names_a_rank_that_exited_and_one_that_hung(capfd):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(2, _exits_or_hangs, timeout=3)
    assert time.monotonic() - start < 15
    failures = info.value.failures
    assert failures[0][:2] == ("Exit", "ended without a result (exit code 7)"), failures
    assert failures[1][:2] == ("Hang", "no result within 3 s, killed (its threads' stacks are "
                               "on its stderr)"), failures
    # The hung rank wrote where it stood before it was killed.
    err = capfd.readouterr().err
    assert "(most recent call first)" in err and " in _exits_or_hangs" in err, err


def _fails_or_hangs(rank, world, store):
    if rank == 0:
        raise RuntimeError("rank 0 gives up")
    time.sleep(600)


def test_ranks_left_hanging_after_a_failure_are_stopped_after_the_grace(monkeypatch):
    """A rank stuck where no timeout reaches it (a deadlock in a driver) does not hold the job
    to its whole limit once another rank has failed."""
    from pyring import launch

    monkeypatch.setattr(launch, "FAILURE_GRACE_S", 2.0)
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(2, _fails_or_hangs, timeout=300)
    assert time.monotonic() - start < 30
    failures = info.value.failures
    assert failures[0][0] == "RuntimeError" and "rank 0 gives up" in failures[0][1], failures
    assert failures[1][:2] == ("Hang", "no result 2 s after rank 0 failed, killed (its threads' "
                               "stacks are on its stderr)"), failures


# What a rank process saw as it imported this module (a forked rank imports it after taking
# the launcher's environment).
_AT_IMPORT = os.environ.get("PYRING_TEST_ADDED")


def _environment(rank, world, store, names):
    return {**{n: os.environ.get(n) for n in names}, "at import": _AT_IMPORT}


@pytest.mark.parametrize("start_method", START_METHODS)
def test_ranks_see_the_launchers_environment_as_the_job_starts(start_method, monkeypatch):
    # A fork server started by an earlier job has the environment of that time: the ranks it
    # forks must see this one's, as spawned ranks do, whatever was set or removed since.
    run_ranks(1, _environment, [], start_method=start_method)
    monkeypatch.setenv("PYRING_TEST_ADDED", "added")
    monkeypatch.delenv("PYRING_TIMEOUT", raising=False)
    got = run_ranks(2, _environment, ["PYRING_TEST_ADDED", "PYRING_TIMEOUT", "PYRING_TEST_ENV"],
                    env={"PYRING_TEST_ENV": "given"}, start_method=start_method)
    want = {"PYRING_TEST_ADDED": "added", "PYRING_TIMEOUT": None, "PYRING_TEST_ENV": "given",
            "at import": "added"}
    assert got == [want, want], got


def _pyring_file(rank, world, store):
    import pyring

    return pyring.__file__


def test_the_fork_server_preloads_the_launchers_pyring_whatever_the_working_directory(
        tmp_path, monkeypatch):
    # A pyring/ in the working directory (a source checkout without a built core) must not
    # shadow, in the fork server's preload, the pyring this process imported: the preload
    # failed silently there and every rank imported pyring itself.
    import multiprocessing.forkserver as forkserver

    import pyring

    shadow = tmp_path / "pyring"
    shadow.mkdir()
    marker = tmp_path / "shadow-imported"
    (shadow / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise ImportError('a shadow without a core')\n")
    monkeypatch.chdir(tmp_path)
    forkserver._forkserver._stop()  # the next job starts a server here
    try:
        got = run_ranks(2, _pyring_file, start_method="forkserver")
    finally:
        forkserver._forkserver._stop()  # later jobs start one elsewhere
    assert got == [pyring.__file__] * 2
    assert not marker.exists(), "the fork server imported the working directory's pyring/"


_CLOSED_STDOUT = """
import os, sys
from pyring.launch import run_ranks

def fn(rank, world, store):
    print("to the closed stdout", flush=True)
    print(f"rank {rank} on stderr", file=sys.stderr, flush=True)
    return rank

if __name__ == "__main__":
    os.close(1)
    got = run_ranks(2, fn, start_method=sys.argv[1])
    print(f"results {got}", file=sys.stderr, flush=True)
"""


@pytest.mark.parametrize("start_method", START_METHODS)
def test_ranks_write_where_the_launcher_does_even_with_stdout_closed(start_method, tmp_path):
    script = tmp_path / "closed_stdout.py"
    script.write_text(_CLOSED_STDOUT)
    proc = subprocess.run([sys.executable, str(script), start_method], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 on stderr" in proc.stderr and "rank 1 on stderr" in proc.stderr, proc.stderr
    assert "results [0, 1]" in proc.stderr and proc.stdout == "", proc.stderr


def test_launcher_refuses_an_unknown_start_method(monkeypatch):
    with pytest.raises(ValueError, match="start_method must be one of"):
        run_ranks(1, _environment, [], start_method="fork")
    monkeypatch.setenv("PYRING_START_METHOD", "fork")
    with pytest.raises(ValueError, match="PYRING_START_METHOD='fork' is not valid"):
        run_ranks(1, _environment, [])


def _absent_peer(rank, world, store):
    comm = pyring.init(rank, world, store, set_default=False, timeout=1.5)
    if rank == 1:
        time.sleep(4)
        try:
            comm.all_reduce(torch.ones(10))
            return "no error"
        except pyring.CommError as e:
            return type(e).__name__
    start = time.monotonic()
    try:
        comm.all_reduce(torch.ones(1 << 16))
        return "no error"
    except pyring.CommTimeout as e:
        return (type(e).__name__, str(e), time.monotonic() - start)


def test_deadline_raises_comm_timeout():
    res = run_ranks(2, _absent_peer, timeout=60)
    kind, msg, elapsed = res[0]
    assert kind == "CommTimeout" and isinstance(pyring.CommTimeout("x"), TimeoutError)
    assert "Timed out" in msg and "rank 1" in msg and "262144 bytes" in msg, msg
    assert 1.4 < elapsed < 5, elapsed
    assert res[1] == "CommError", "the late rank must learn that its peer gave up"


def _late_peer(rank, world, store):
    comm = pyring.init(rank, world, store, set_default=False, timeout=30)
    t = torch.ones(100)
    if rank == 1:
        time.sleep(1.0)
        comm.all_reduce(t)
        return None
    w = comm.all_reduce(t, async_op=True)
    try:
        w.wait(timeout=0.1)
        early = "completed"
    except pyring.CommTimeout as e:
        early = str(e)
    w.wait()
    return early, float(t[0])


def test_work_wait_timeout_then_completes():
    early, value = run_ranks(2, _late_peer, timeout=60)[0]
    assert "Timed out" in early and "not complete after 0.1 s" in early
    assert value == 2.0


class _HostCudaArray:
    """A __cuda_array_interface__ object that names no device (float64, host memory behind it:
    never read, as the call must refuse first)."""

    def __init__(self) -> None:
        self.a = np.zeros(4, np.float64)
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f8", "version": 3,
                                         "data": (self.a.ctypes.data, False), "strides": None}


def cuda_interface_body(rank, world, store):
    import pyring

    with pyring.init(rank, world, store, set_default=False) as comm:
        try:
            comm.all_reduce(_HostCudaArray())
        except ValueError as e:
            return str(e)
    return None


def test_a_cuda_array_without_cuda_in_torch_names_the_cause():
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    (message,) = run_ranks(1, cuda_interface_body, timeout=60)
    assert message is not None and "CUDA is not available to this torch" in message, message
