"""Builds a git ref of pyring out of the source tree, beside a copy of its Python package, for
benchmarks that compare builds (callpath.py) or need an instrumented one (lsan.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What a build out of the tree needs besides a C++ compiler (pip install ".[bench]" has them).
NEEDS = {"pybind11": "pybind11", "cmake": "cmake"}


def check_needs(script: str) -> None:
    """Exits with one line naming what `script`'s builds lack, before any work starts."""
    missing = [pip for mod, pip in NEEDS.items()
               if importlib.util.find_spec(mod) is None and shutil.which(mod) is None]
    if missing:
        sys.exit(f"{script} builds pyring out of the tree and needs {', '.join(missing)}: "
                 f"pip install {' '.join(missing)} (or pip install \".[bench]\")")


def build(ref: str, root: Path, build_type: str = "RelWithDebInfo",
          flags: tuple[str, ...] = (), tag: str = "") -> Path:
    """Builds `ref` (without CUDA when flags are given) into root/<sha><tag>/; returns the
    directory holding its `pyring` package. A finished build is reused."""
    sha = subprocess.check_output(["git", "rev-parse", "--short", ref], cwd=ROOT, text=True).strip()
    out = root / (sha + tag)
    pkg = out / "pkg"
    if list((pkg / "pyring").glob("_C*.so")):
        return pkg
    src = out / "src"
    shutil.rmtree(out, ignore_errors=True)
    src.mkdir(parents=True)
    print(f"# building {ref} ({sha}{tag}, {build_type}) into {out}: a few minutes the first time, "
          f"reused after", flush=True)
    archive = subprocess.run(["git", "archive", sha], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    import pybind11

    extra = []
    if flags:
        joined = " ".join(flags)
        extra = ["-DPYRING_CUDA=OFF", f"-DCMAKE_CXX_FLAGS={joined}",
                 f"-DCMAKE_C_FLAGS={joined}", f"-DCMAKE_MODULE_LINKER_FLAGS={joined}",
                 f"-DCMAKE_SHARED_LINKER_FLAGS={joined}"]
    subprocess.run(["cmake", "-S", str(src), "-B", str(out / "build"),
                    f"-DCMAKE_BUILD_TYPE={build_type}",
                    f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                    f"-DPython_EXECUTABLE={sys.executable}", *extra], check=True,
                   capture_output=True)
    print("# configured; compiling", flush=True)
    subprocess.run(["cmake", "--build", str(out / "build"), f"-j{os.cpu_count()}"], check=True,
                   capture_output=True)
    print("# built", flush=True)
    for package in ("pyring", "_pyring_autoload"):
        if (src / package).is_dir():
            shutil.copytree(src / package, pkg / package)
    for so in (out / "build").glob("_C*.so"):
        shutil.copy(so, pkg / "pyring")
    return pkg
