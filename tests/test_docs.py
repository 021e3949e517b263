"""The documentation keeps up with the code: every relative link in the README and docs/
points at a file that exists, every PYRING_* variable the code reads is on the configuration
page, and the package's __all__ names every delegated collective."""

from __future__ import annotations

import re
from pathlib import Path

import pyring
from pyring import api

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
READ = re.compile(r"(?:getenv|environ\.get|environ\[|env\.get|env_int|_choice)\(?\s*"
                  r"[\"'](PYRING_[A-Z0-9_]+)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


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


def test_every_variable_the_code_reads_is_documented():
    read = set()
    for src in [*ROOT.joinpath("pyring").rglob("*.py"), *ROOT.joinpath("csrc").rglob("*.cc"),
                *ROOT.joinpath("csrc").rglob("*.h"), *ROOT.joinpath("csrc").rglob("*.cu")]:
        read |= set(READ.findall(src.read_text()))
    assert len(read) >= 15, sorted(read)  # the scan itself still finds them
    page = (ROOT / "docs" / "configuration.md").read_text()
    missing = sorted(v for v in read if f"`{v}`" not in page)
    assert not missing, f"read by the code, not on docs/configuration.md: {missing}"


def test_all_names_every_delegated_collective():
    assert set(api.DELEGATED) <= set(pyring.__all__)
    for name in pyring.__all__:
        assert hasattr(pyring, name), name
