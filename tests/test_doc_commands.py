"""Every command the docs show (README.md, docs/*.md, bench/README.md) names a script or module
that exists, and its arguments parse with that script's own parser (tests/doc_commands.py):
a renamed script or flag fails here. Commands with values for the reader to fill in (<sha>,
LOAD) are only listed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "doc_commands.py"


def _run(*code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *code], cwd=ROOT.parent, capture_output=True,
                          text=True, timeout=600)


def test_every_documented_command_parses():
    r = _run(str(DRIVER))
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert not doc["bad"], "\n".join(doc["bad"])
    assert doc["checked"] >= 50, doc  # the extraction found the docs' commands
    assert len(doc["skipped"]) <= 10, doc["skipped"]


def test_a_renamed_flag_or_script_is_caught():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import doc_commands as d; "
            "print(repr(d._check_one('script', 'bench/allreduce.py', ['--no-such-flag']))); "
            "print(repr(d._check_one('script', 'bench/gone.py', []))); "
            "print(repr(d._check_one('module', 'pyring.tools.selfcheck', ['--quick'])))")
    r = _run("-c", code, str(ROOT / "tests"))
    flag, gone, fine = r.stdout.strip().splitlines()[-3:]
    assert "unrecognized arguments: --no-such-flag" in flag, r.stdout + r.stderr[-2000:]
    assert "does not exist" in gone and fine == "None", r.stdout
