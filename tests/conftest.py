import os
import sys

import pytest

# Every multi-process test runs under a short collective deadline unless it sets its own.
os.environ.setdefault("PYRING_TIMEOUT", "60")
# Rank processes fork from a server that has torch imported: the suite starts hundreds of them,
# and each spawned one would import torch itself (seconds of a core). Tests that need spawn
# ask for it by name.
os.environ.setdefault("PYRING_START_METHOD", "forkserver")


@pytest.fixture(autouse=True)
def _no_leaked_segments():
    """Fails a test that leaves a pyring shared-memory segment behind."""
    yield
    if os.path.isdir("/dev/shm"):
        leaked = [n for n in os.listdir("/dev/shm") if n.startswith("pyring-")]
        for n in leaked:
            os.unlink(os.path.join("/dev/shm", n))
        assert not leaked, f"shared-memory segments outlived the job: {leaked}"


@pytest.fixture(autouse=True)
def _sys_path_kept():
    """Fails a test that leaves a path on sys.path: rank processes inherit the parent's, and one
    into the source tree makes every later rank import a pyring without its built core."""
    before = list(sys.path)
    yield
    added = [p for p in sys.path if p not in before]
    sys.path[:] = before
    assert not added, f"the test left {added} on sys.path"
