"""The package's shape: no import cycle among pyring's modules (imports inside functions count),
at most 12 modules at the top of pyring/ besides its subpackages, nothing outside
pyring/testing imports pyring.testing, and `import pyring` loads neither the developer tools
(pyring.tools: the self-check, the emulated hosts) nor pyring.testing."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pyring", "_pyring_autoload")
MAX_TOP_MODULES = 12


def _modules() -> dict[str, Path]:
    out = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    out["pyring._C"] = ROOT / "pyring" / "_C.pyi"  # the extension, by its stub
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of the packages it imports: `from P import n` reaches P.n when that
    is a module, else P; a package's parents, run first by any import, are not edges."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if _is_package(path) else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                for a in node.names:
                    if f"{src}.{a.name}" in mods:
                        targets.add(f"{src}.{a.name}")
                    elif src in mods:
                        targets.add(src)
        graph[name] = targets - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    graph = _edges(_modules())
    assert sum(len(t) for t in graph.values()) > 50  # the walk sees the package's imports
    assert _cycles(graph) == []


def test_the_walk_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_top_level_modules_and_testing_imports():
    top = sorted(p.name for p in (ROOT / "pyring").glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top
    graph = _edges(_modules())
    users = sorted(m for m, t in graph.items()
                   if not m.startswith("pyring.testing") and any(x.startswith("pyring.testing")
                                                                  for x in t))
    assert users == []


def test_import_pyring_loads_no_tools_and_no_testing():
    code = ("import sys, pyring, pyring.optim, pyring.hooks\n"
            "print(sorted(m for m in sys.modules if m.startswith(('pyring.tools', "
            "'pyring.testing'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
