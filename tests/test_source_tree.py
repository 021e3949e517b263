"""From a clone's root the source tree comes first on sys.path: an unbuilt tree runs the
installed package's modules, and with none installed the import says what is missing and how
to fix it (pyring/_source_tree.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_clone_root_imports_the_installed_build():
    code = ("import pyring, pyring._settings, pyring.tools.selfcheck; "
            "print(pyring._C.__file__); print(pyring.tools.selfcheck.__file__)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    ext, module = r.stdout.split()
    assert Path(ext).parent == Path(module).parents[1]  # one package: the built one


def test_an_unbuilt_tree_with_nothing_installed_says_so(tmp_path):
    tree = tmp_path / "clone"
    (tree / "pyring").mkdir(parents=True)
    for name in ("__init__.py", "_source_tree.py"):
        (tree / "pyring" / name).write_text((ROOT / "pyring" / name).read_text())
    # -S: no site-packages, so no installed pyring to fall back on.
    r = subprocess.run([sys.executable, "-S", "-c", "import pyring"], cwd=tree,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pyring is imported from the source tree at "), last
    assert "no built extension" in last and "pip install ." in last, last
