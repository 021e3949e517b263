import os
import sys
from pathlib import Path

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


ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _source_tree_kept_off_sys_path():
    """Fails a test that leaves the source tree (or a folder in it holding pyring) on sys.path:
    rank processes inherit the parent's, and every later rank would import that pyring, which
    has no built core where the tests run against an installed one."""
    before = list(sys.path)
    yield
    added = [p for p in sys.path if p not in before and (Path(p or ".") / "pyring").is_dir()
             and (Path(p or ".").resolve() == ROOT)]
    for p in added:
        sys.path.remove(p)
    assert not added, f"the test left {added} on sys.path"
