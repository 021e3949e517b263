"""Compile-only checks of the CUDA runtime seam on the toolkits pyring supports: the toolkit
installed here as it is, and as a CUDA 12.0-12.4 toolkit sees it (CUDART_VERSION below 12050,
where cudaGetDriverEntryPointByVersion does not exist: any use of it is poisoned). Runs
wherever nvcc is found; nothing runs on a GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc"
RUNTIME = CSRC / "device" / "cuda" / "cuda_runtime.cu"

# What a toolkit older than 12.5 lacks, spelt after its headers are in.
BEFORE_12_5 = """#include <cuda_runtime.h>
#undef CUDART_VERSION
#define CUDART_VERSION 12040
#pragma GCC poison cudaGetDriverEntryPointByVersion
"""


def _nvcc() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on this machine: the CUDA sources cannot be compiled here")
    return nvcc


@pytest.mark.parametrize("toolkit", ["installed", "12.4"])
def test_cuda_runtime_compiles(toolkit, tmp_path):
    nvcc = _nvcc()
    src = tmp_path / "runtime.cu"
    prelude = BEFORE_12_5 if toolkit == "12.4" else ""
    src.write_text(f'{prelude}#include "{RUNTIME}"\n')
    cmd = [nvcc, "-std=c++17", "-arch=sm_80", "-c", f"-I{CSRC}", "-DPYRING_WITH_CUDA=1",
           "-Wno-deprecated-declarations", str(src), "-o", str(tmp_path / "runtime.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}"
