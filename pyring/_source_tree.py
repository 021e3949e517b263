"""pyring imported from a source tree that holds no built extension (``pyring/_C*.so``): from a
clone's root, Python puts the clone first on ``sys.path``, so ``import pyring`` finds the
unbuilt tree before the package ``pip install .`` built. Such an import then runs the installed
package's modules (its ``__path__``), or fails saying exactly what is missing and how to fix it.
Imports nothing of pyring, so that it runs before ``_C`` is found."""

from __future__ import annotations

import sys
from pathlib import Path

_EXTENSION = "_C*.so"


def _built(folder: Path) -> bool:
    return any(folder.glob(_EXTENSION)) or any(folder.glob("_C*.pyd"))


def installed_copy(here: Path) -> Path | None:
    """Another ``pyring`` folder on sys.path that holds a built extension; None if none does."""
    for entry in sys.path:
        candidate = (Path(entry or ".").resolve() / "pyring")
        if candidate != here and (candidate / "__init__.py").exists() and _built(candidate):
            return candidate
    return None


def resolve(here: Path) -> list[str] | None:
    """The ``__path__`` pyring's modules should load from: None when ``here`` is built (nothing
    to change), else the installed copy's folder. Raises ImportError, naming the tree and the
    fix, when no copy is installed."""
    if _built(here):
        return None
    other = installed_copy(here)
    if other is not None:
        return [str(other)]
    raise ImportError(
        f"pyring is imported from the source tree at {here.parent}, which holds no built "
        f"extension (pyring/{_EXTENSION}), and no installed pyring was found on sys.path. "
        f"Install it with `pip install .` (the README's install), then run from any folder, this "
        f"one included.")
