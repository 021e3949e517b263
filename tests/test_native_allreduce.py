"""The core driven with no pybind and no Python (tests/native/allreduce_ranks.cc): ranks forked
from one C++ program prepare their host channels, exchange addresses through files, assemble
their communicators and check all_reduce over sizes, dtypes, ops and every algorithm, over shm,
tcp and both, on host buffers and on sim device buffers (placed by the planner; the sim
delaying every operation at random in one case, so that a missing stream order shows).

The program builds with the project's CMakeLists.txt in a build of its own, the core library
alone (-DPYRING_PYTHON_MODULE=OFF, no CUDA, -O1: about 35 s on 2 cores); the test skips,
saying so, where there is no cmake."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> str:
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("no cmake on PATH to build the native program with")
    build = tmp_path_factory.mktemp("native_build")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    steps = ([cmake, "-S", str(ROOT), "-B", str(build), *generator, "-DPYRING_PYTHON_MODULE=OFF",
              "-DPYRING_CUDA=OFF", "-DPYRING_CORE_OPT=-O1", "-DCMAKE_BUILD_TYPE="],
             [cmake, "--build", str(build), "--target", "native_allreduce", "-j2"])
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return str(build / "native_allreduce")


@pytest.mark.parametrize("world,transport,delay_us",
                         [(1, "auto", 0), (2, "shm", 0), (3, "tcp", 0), (4, "auto", 0),
                          (2, "auto", 100)])
def test_native_ranks_all_reduce_without_python(program, tmp_path, world, transport, delay_us):
    proc = subprocess.run([program, str(world), transport, str(tmp_path)], capture_output=True,
                          text=True, timeout=180,
                          env=dict(os.environ, PYRING_SIM_DELAY_US=str(delay_us)))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-4000:]


def test_a_bad_transport_name_is_refused(program, tmp_path):
    proc = subprocess.run([program, "2", "carrier-pigeon", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert "unknown transport 'carrier-pigeon' (valid: shm, tcp, cuda_ipc)" in proc.stderr
