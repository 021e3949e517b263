"""Every command the docs show (README.md, docs/*.md, bench/README.md) names a script or module
that exists, and its arguments parse with that script's own parser (tests/doc_commands.py):
a renamed script or flag fails here. Commands with values for the reader to fill in (<sha>,
LOAD) are only listed."""

from __future__ import annotations

import json
import re
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


def test_no_documented_command_replaces_a_cited_result():
    """A documented command leaves the tree clean: it writes under bench/results/runs/ (ignored
    by git) or outside the clone, and replacing a cited file (--replace, --out into
    bench/results/) is said in prose, never shown as the command to run."""
    sys.path.insert(0, str(ROOT / "tests"))
    import doc_commands

    writes = re.compile(r"--replace\b|--(?:out|benchmark-json)[ =]\S*bench/results/(?!runs/)")
    found = []
    for page in doc_commands.pages():
        for _, block in doc_commands.FENCE.findall(page.read_text()):
            joined = re.sub(r"\\\n\s*", " ", block)
            found += [f"{page.name}: {line.strip()}" for line in joined.splitlines()
                      if writes.search(line)]
    assert not found, "\n".join(found)
