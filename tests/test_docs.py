"""The documentation keeps up with the code: every relative link in the README and docs/
points at a file that exists, every PYRING_* variable the code reads is a row of the settings
table, the configuration page carries that table as generated, every results table marked as
generated matches what bench/tables.py renders from its JSON, every committed file of
bench/results/ is cited by a page, and the package's __all__ names every delegated
collective."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyring
from pyring import _settings, api

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
READ = re.compile(r"(?:getenv|environ\.get|environ\[|env\.get|env_int|read|given)\(?\s*"
                  r"[\"'](PYRING_[A-Z0-9_]+)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_committed_result_is_cited():
    """bench/results/ keeps what a page cites (a link, a table's source, a figure in the
    text); a run writes under bench/results/runs/, which git ignores."""
    listed = [p for p in (ROOT / "bench" / "results").iterdir() if p.is_file()]
    assert len(listed) > 10
    text = "".join(p.read_text() for p in [*_pages(), ROOT / "bench" / "README.md"])
    uncited = sorted(p.name for p in listed if p.name not in text)
    assert uncited == [], f"committed but cited by no page: {uncited}"


def test_relative_links_point_at_files():
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith(("#", "mailto:")):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_every_variable_the_code_reads_is_a_setting():
    read = set()
    for src in [*ROOT.joinpath("pyring").rglob("*.py"), *ROOT.joinpath("csrc").rglob("*.cc"),
                *ROOT.joinpath("csrc").rglob("*.h"), *ROOT.joinpath("csrc").rglob("*.cu")]:
        read |= set(READ.findall(src.read_text()))
    assert len(read) >= 15, sorted(read)  # the scan itself still finds them
    missing = sorted(read - set(_settings.BY_VARIABLE))
    assert not missing, f"read by the code, not rows of pyring/_settings.py: {missing}"


def test_configuration_page_carries_the_generated_tables():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == _settings.render_page(page), (
        "docs/configuration.md differs from the settings table; renew it with "
        "python -c 'import pyring._settings as s; s.write_page()'")
    for s in _settings.SETTINGS:
        assert f"`{s.variable}`" in page


def test_results_tables_match_their_files():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "tables.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (
        f"{out.stderr}renew them with python bench/tables.py")
    pages = "".join(page.read_text() for page in _pages())
    assert pages.count("<!-- table: ") >= 20  # the check itself still finds the tables


def test_a_malformed_variable_is_an_error_naming_it():
    for variable, bad in [("PYRING_SPIN_US", "fast"), ("PYRING_FLIGHT_RECORDER", "-1"),
                          ("PYRING_SEGMENT_BYTES", "huge"), ("PYRING_ALGO", "spiral"),
                          ("PYRING_TIMEOUT", "0")]:
        try:
            _settings.read(variable, {variable: bad})
        except ValueError as e:
            assert variable in str(e) and bad in str(e), e
        else:
            raise AssertionError(f"{variable}={bad!r} was accepted")
    assert _settings.read("PYRING_SEGMENT_BYTES", {}) == pyring._C.DEFAULT_SEGMENT_BYTES


def test_all_names_every_delegated_collective():
    assert set(api.DELEGATED) <= set(pyring.__all__)
    for name in pyring.__all__:
        assert hasattr(pyring, name), name


def _documented(page: str) -> tuple[set[str], set[str]]:
    """The names docs/api.md documents: each `::: target`'s last part and its `members`, and
    the modules it documents whole (no members option)."""
    names, whole = set(), set()
    lines = page.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("::: "):
            continue
        target = line[4:].strip()
        names.add(target.rsplit(".", 1)[-1])
        members = next((m for m in lines[i + 1:i + 4] if "members:" in m), None)
        if members:
            names |= {n.strip() for n in members.split("[", 1)[1].rstrip("]").split(",")}
        else:
            whole.add(target)
    return names, whole


def test_every_exported_name_has_an_api_entry():
    import importlib

    names, whole = _documented((ROOT / "docs" / "api.md").read_text())
    public = {f"pyring.{n}": getattr(pyring, n) for n in pyring.__all__}
    for module in ("pyring.optim", "pyring.hooks"):
        m = importlib.import_module(module)
        public |= {f"{module}.{n}": getattr(m, n) for n in dir(m)
                   if not n.startswith("_") and getattr(getattr(m, n), "__module__", "") == module}
    # Names a module documented whole holds (pyring.errors re-exports the core's errors).
    held = set()
    for target in whole:
        try:
            held |= {n for n in dir(importlib.import_module(target)) if not n.startswith("_")}
        except ImportError:  # a class or function, not a module
            pass
    missing = []
    for qual, obj in public.items():
        name = qual.rsplit(".", 1)[-1]
        home = getattr(obj, "__name__", "") if qual == "pyring.hooks" else ""
        if name in names | held or home in whole or getattr(obj, "__module__", None) in whole:
            continue
        missing.append(qual)
    assert not missing, f"no entry in docs/api.md: {missing}"
