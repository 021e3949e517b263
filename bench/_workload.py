"""The training workload of bench/: examples/train.py's CharGPT, its corpus (the Python standard
library's own source) and its batches. No other module in bench/ imports examples/train.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from train import CharGPT, get_batch, load_corpus  # noqa: E402

__all__ = ["CharGPT", "get_batch", "load_corpus"]
