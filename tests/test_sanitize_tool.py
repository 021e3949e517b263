"""pyring.testing.sanitize, the runner of the sanitizer jobs (.ci/run runs them, docs/sanitizers.md
says how): its report counting, its refusals, and CMake's check of PYRING_SANITIZE."""

from __future__ import annotations

import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pyring.testing import sanitize

ROOT = Path(__file__).resolve().parent.parent

OURS = """==4242==ERROR: AddressSanitizer: heap-use-after-free on address 0x602000000010
READ of size 8 at 0x602000000010 thread T3
    #0 0x7f in pyring::Work::run() /src/csrc/core/work.cc:33
    #1 0x7f in pyring::ProgressEngine::loop(State&) /src/csrc/core/progress.cc:101
"""
THEIRS = """WARNING: ThreadSanitizer: data race (pid=77)
  Write of size 8 at 0x7b0400000000 by thread T1:
    #0 memcpy <null> (libtsan.so.2+0x6)
    #1 at::native::copy_ <null> (libtorch_cpu.so+0x1)
"""
UB = """/src/csrc/kernels/reduce.cc:12:5: runtime error: signed integer overflow
    #0 0x1 in pyring::reduce_sum<int>(int*, int const*, long) /src/csrc/kernels/reduce.cc:12
SUMMARY: UndefinedBehaviorSanitizer: undefined-behavior /src/csrc/kernels/reduce.cc:12:5
"""


def test_reports_are_split_by_whether_pyring_is_in_the_stack(tmp_path):
    (tmp_path / "asan.4242").write_text("noise before\n" + OURS)
    (tmp_path / "tsan.77").write_text(THEIRS + THEIRS)
    (tmp_path / "ubsan.9").write_text(UB)
    ours, others = sanitize.split_reports(tmp_path)
    assert len(others) == 2 and all("ThreadSanitizer" in r for r in others)
    assert len(ours) == 2
    assert "heap-use-after-free" in ours[0] and "signed integer overflow" in ours[1]


def test_an_empty_report_folder_is_clean(tmp_path):
    assert sanitize.split_reports(tmp_path) == ([], [])


def test_the_command_comes_after_a_double_dash():
    with pytest.raises(SystemExit):
        sanitize.main(["address,undefined", "python", "-c", "pass"])
    with pytest.raises(SystemExit):
        sanitize.main(["thread", "--"])


def test_the_runtime_is_named_by_the_compiler():
    if shutil.which("g++") is None:
        pytest.skip("no g++ here")
    libs = sanitize.runtime_libraries("address,undefined")
    assert "libasan" in libs[0] and "libstdc++" in libs[-1]
    assert all(Path(p).is_file() for p in libs)


@pytest.mark.parametrize("value, text", [("adress", "a comma-separated list"),
                                         ("thread,address", "cannot be combined")])
def test_cmake_refuses_a_bad_sanitizer_list(tmp_path, value, text):
    if shutil.which("cmake") is None or not (ROOT / "CMakeLists.txt").is_file():
        pytest.skip("no cmake or no source tree here")
    proc = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path),
                           "-DPYRING_PYTHON_MODULE=OFF", f"-DPYRING_SANITIZE={value}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "PYRING_SANITIZE" in proc.stderr and text in proc.stderr, proc.stderr[-2000:]


def test_each_source_tree_has_its_own_build_folder(tmp_path):
    a = sanitize.default_build("address,undefined", tmp_path / "a")
    assert a != sanitize.default_build("address,undefined", tmp_path / "b")
    assert a != sanitize.default_build("thread", tmp_path / "a")
    assert a == sanitize.default_build("address,undefined", tmp_path / "a")


def test_a_build_folder_configured_from_another_tree_is_emptied(tmp_path, monkeypatch):
    # A CI checkout at a new path met the cache of an earlier one; CMake refused to configure.
    source = tmp_path / "src"
    (source / "pyring").mkdir(parents=True)
    (source / "CMakeLists.txt").write_text("")
    stale = tmp_path / "out" / "build"
    stale.mkdir(parents=True)
    (stale / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={tmp_path / 'old'}\n")
    (stale / "left").write_text("from the old tree")
    assert sanitize.configured_from(stale) == tmp_path / "old"
    seen = []

    def fake_run(cmd, **kw):
        seen.append(sorted(p.name for p in stale.iterdir()) if stale.exists() else [])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(sanitize.subprocess, "run", fake_run)
    # CMake never runs here, so pybind11 (installed only for the sanitizer jobs) need not be.
    monkeypatch.setitem(sys.modules, "pybind11", types.SimpleNamespace(get_cmake_dir=str))
    sanitize.build("address,undefined", source.resolve(), tmp_path / "out")
    assert seen[0] == []  # emptied before CMake ran
    (stale.mkdir(parents=True, exist_ok=True))
    (stale / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={source.resolve()}\n")
    seen.clear()
    sanitize.build("address,undefined", source.resolve(), tmp_path / "out")
    assert seen[0] == ["CMakeCache.txt"]  # its own tree's cache is kept


def test_deadlines_scale_with_the_sanitizer(monkeypatch):
    monkeypatch.delenv("PYRING_SANITIZED", raising=False)
    plain = sanitize.slowdown()
    monkeypatch.setenv("PYRING_SANITIZED", "address,undefined")
    asan = sanitize.slowdown()
    monkeypatch.setenv("PYRING_SANITIZED", "thread")
    assert plain == 1.0 < asan < sanitize.slowdown()
