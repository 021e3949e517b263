"""The main job's workload (examples/train.py, bench/training.py and bench/overlap.py): a small
character-level transformer and its corpus, the Python standard library's own source, which
every machine with Python has. Needs torch."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


def load_corpus(max_bytes: int) -> torch.Tensor:
    """The stdlib's *.py files (site-packages excluded), sorted by path, up to max_bytes."""
    root = os.path.dirname(os.__file__)
    paths = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages"))
        paths += [os.path.join(d, f) for f in files if f.endswith(".py")]
    out, n = [], 0
    for p in sorted(paths, key=lambda p: os.path.relpath(p, root)):
        with open(p, "rb") as f:
            b = f.read(max_bytes - n)
        out.append(b)
        n += len(b)
        if n >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(out)), dtype=torch.uint8)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    """A GPT over bytes (vocabulary 256) with learned positions; forward returns the loss."""

    def __init__(self, dim: int = 128, layers: int = 4, heads: int = 4, seq: int = 128) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(256, dim), nn.Embedding(seq, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, 256, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        logits = self.head(self.ln(self.blocks(h)))
        return F.cross_entropy(logits.view(-1, 256), y.reshape(-1))


def get_batch(data: torch.Tensor, starts: torch.Tensor, seq: int,
              device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + torch.arange(seq + 1)
    w = data[idx].long().to(device)
    return w[:, :-1], w[:, 1:]
