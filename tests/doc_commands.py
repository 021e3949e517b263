"""The shell commands the docs show (README.md, docs/*.md, bench/README.md), and a check of
each one's argument parsing without running it: tests/test_doc_commands.py runs this file once,
which parses every command's arguments with the script's own parser, in one process, and stops
each there (the parser's parse_args raises once it has parsed)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import runpy
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^[ \t]*```([a-z]*)\n(.*?)^[ \t]*```", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")
# Commands that are not the project's Python scripts: their existence is the system's affair.
OTHER = {"pip", "pytest", "mkdocs", "gcc", "git", "apt-get", "mpirun", "ip", "tc", "cd", "source",
         "valgrind", "export", "unshare", "mount", "sudo", "bash", "sh", "cmake", "nvcc", "perf",
         "clang-format", "ruff", "docker", "make", "ls", "cat", "echo", "/tmp/shared_ar",
         "compute-sanitizer", "ncu", "tee", "kill", "time", "env"}
# Values for the reader to fill in: <sha>, ..., {a,b}, and bare upper-case words (LOAD, N).
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|\{[A-Za-z0-9_,.]*\}"
                         r"|(?<![=\w-])(?!HEAD\b)[A-Z][A-Z_]*(?![\w=])")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]


def _segments(text: str) -> list[str]:
    out = []
    for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", text):
        part = part.strip()
        if part:
            out.append(part)
    return out


def commands() -> list[tuple[str, str]]:
    """(page, command) for every command line of a code block and every inline code span that
    starts like a command."""
    found = []
    for page in pages():
        text = page.read_text()
        name = str(page.relative_to(ROOT))
        for lang, block in FENCE.findall(text):
            if lang not in ("", "bash", "sh", "shell", "console"):
                continue
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.strip()
                if not line or line.startswith("#") or line.startswith(("$ ", ">>>")) is False \
                        and not re.match(r"^([A-Z_][A-Z0-9_]*=\S*\s+)*(python3?|torchrun)\b",
                                         line):
                    continue
                line = re.sub(r"\s+#.*$", "", line)
                found += [(name, seg) for seg in _segments(line)]
        for span in INLINE.findall(FENCE.sub("", text)):
            span = " ".join(span.split())
            if re.match(r"^([A-Z_][A-Z0-9_]*=\S*\s+)*(python3?|torchrun)\s", span):
                found += [(name, seg) for seg in _segments(span)]
    return found


def target(command: str) -> tuple[str, str, list[str]] | None:
    """(kind 'script' or 'module', path or module name, arguments), or None for a command
    that is not one of the project's Python entry points."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words.pop(0)
    if not words or words[0] in OTHER:
        return None
    if words[0] == "torchrun":
        for i, w in enumerate(words):
            if w.endswith(".py"):
                return "script", w, words[i + 1:]
        return None
    if words[0] not in ("python", "python3") or len(words) < 2:
        return None
    if words[1] == "-c":
        return None
    if words[1] == "-m":
        return ("module", words[2], words[3:]) if len(words) > 2 else None
    return "script", words[1], words[2:]


class _Parsed(Exception):
    pass


def _check_one(kind: str, name: str, args: list[str]) -> str | None:
    """None when the entry point's parser takes `args`, else what went wrong."""
    if kind == "script":
        path = ROOT / name
        if not path.exists():
            return f"{name} does not exist"
        if "argparse" not in path.read_text():
            return None  # no parser to check; it exists
    orig_parse, orig_known = argparse.ArgumentParser.parse_args, \
        argparse.ArgumentParser.parse_known_args

    inside = []  # parse_args calls parse_known_args, then refuses what is left

    def parse_args(self, a=None, ns=None):
        inside.append(True)
        try:
            orig_parse(self, a, ns)
        finally:
            inside.pop()
        raise _Parsed

    def parse_known_args(self, a=None, ns=None):
        result = orig_known(self, a, ns)
        if inside:
            return result
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_args
    argparse.ArgumentParser.parse_known_args = parse_known_args
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if kind == "script":
                sys.argv = [str(ROOT / name), *args]
                sys.path.insert(0, str((ROOT / name).parent))
                runpy.run_path(str(ROOT / name), run_name="__main__")
            else:
                sys.argv = [name, *args]
                runpy.run_module(name, run_name="__main__", alter_sys=True)
        return f"ran to its end without parsing arguments: {name} {args}"
    except _Parsed:
        return None
    except SystemExit as e:
        if e.code in (0, None):
            return None  # --help
        return f"{name} {' '.join(args)}: {err.getvalue().strip()[-400:] or e}"
    except Exception as e:  # noqa: BLE001 (any failure before parsing is a finding)
        return f"{name} {' '.join(args)}: {type(e).__name__}: {e}"[:600]
    finally:
        argparse.ArgumentParser.parse_args = orig_parse
        argparse.ArgumentParser.parse_known_args = orig_known
        sys.argv, sys.path[:] = saved_argv, saved_path


def main() -> int:
    checked, skipped, bad = 0, [], []
    seen = set()
    for page, command in commands():
        t = target(command)
        if t is None:
            continue
        if PLACEHOLDER.search(command):
            skipped.append(f"{page}: {command}")
            continue
        key = (t[0], t[1], tuple(t[2]))
        if key in seen:
            continue
        seen.add(key)
        checked += 1
        problem = _check_one(*t)
        if problem:
            bad.append(f"{page}: `{command}`: {problem}")
    print(json.dumps({"checked": checked, "skipped": skipped, "bad": bad}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
