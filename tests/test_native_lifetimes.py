"""Native lifetimes under AddressSanitizer and UndefinedBehaviorSanitizer
(tests/native/callback_lifetime.cc), and the same case end to end: a completion callback that
drops the last reference to its communicator.

The native program builds with the system's C++ compiler and its ASan runtime; it skips, saying
so, where neither g++ nor clang++ can link one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from pyring.testing.native_fuzz import Unavailable, compile_sources

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["tests/native/callback_lifetime.cc", "csrc/core/callbacks.cc"]
FLAGS = ["-std=c++17", "-O1", "-g", "-pthread", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]


def _build(out: str) -> str:
    try:
        return compile_sources(out, ROOT, SOURCES, FLAGS,
                               (os.environ.get("CXX", ""), "g++", "clang++"), "asan")
    except Unavailable as e:
        pytest.skip(f"the sanitized native test cannot be built here: {e}")


def test_callback_runner_released_or_stopped_by_its_own_task(tmp_path):
    exe = _build(str(tmp_path / "callback_lifetime"))
    proc = subprocess.run([exe], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-6000:]


_DROPS_ITS_COMMUNICATOR = textwrap.dedent("""
    import gc, sys, threading
    import torch, torch.distributed as dist
    import pyring

    refs = []
    for _ in range(10):
        comm = pyring.init(0, 1, dist.HashStore(), set_default=False)
        fut = comm.all_reduce(torch.ones(1 << 16), async_op=True).get_future()
        done = threading.Event()
        held = [comm]

        def drop(f, held=held, done=done):
            refs.append(sys.getrefcount(held[0]))  # 2: the list's and the argument's
            held.clear()  # the communicator, its threads' engine and its runner go here
            done.set()

        del comm
        fut.then(drop)
        del fut, held
        gc.collect()
        assert done.wait(30), "the callback did not run"
    print("refs", sorted(set(refs)))
""")


def test_a_callback_that_drops_the_last_reference_to_its_communicator(tmp_path):
    # The communicator is destroyed on the callback thread that runs the future's callback:
    # its progress thread is joined from there, and that thread's own runner ends under it.
    # Run from tmp_path: `-c` puts the working directory first on sys.path, and a source tree
    # there would shadow the installed package.
    proc = subprocess.run([sys.executable, "-c", _DROPS_ITS_COMMUNICATOR], capture_output=True,
                          text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == "refs [2]", proc.stdout


_TERMINATES = textwrap.dedent("""
    import ctypes, threading
    import pyring._C  # noqa: F401 (installs the trace)

    def victim():
        libc = ctypes.CDLL(None)
        libc.prctl(15, b"terminate-test", 0, 0, 0)  # PR_SET_NAME
        ctypes.CDLL("libstdc++.so.6")._ZSt9terminatev()  # std::terminate()

    t = threading.Thread(target=victim)
    t.start()
    t.join()
""")


def test_a_terminate_names_its_thread_and_prints_its_stack(tmp_path):
    # The trace runs before the C++ runtime's own handler, which still prints its reason and
    # aborts the process.
    proc = subprocess.run([sys.executable, "-c", _TERMINATES], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == -6, (proc.returncode, proc.stderr[-4000:])
    head = "pyring: std::terminate on thread 'terminate-test'"
    assert head in proc.stderr, proc.stderr[-4000:]
    stack = proc.stderr.split(head, 1)[1]
    assert "libstdc++" in stack and "terminate called without an active exception" in stack, stack
