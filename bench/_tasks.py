"""The training tasks of bench/convergence.py and bench/slowlink.py, each seeded.

- ``digits``: scikit-learn's bundled load_digits (1797 8x8 images, no download), an MLP
  64-128-10; 80% train (each rank its interleaved half, batches of 32), 20% validation.
- ``charlm``: the main job's character-level transformer (examples/train.py's CharGPT on the
  Python standard library's source), shrunk to fit this benchmark's budget: dim 64, 2
  layers, 4 heads, 64-byte sequences, 8 per rank per step, 1 MB of corpus (the first 90% to
  train, 8 fixed batches of the rest to validate).
"""

from __future__ import annotations

import torch
from torch import nn


class Digits:
    name = "digits"

    def __init__(self, seed: int) -> None:
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x, dtype=torch.float32) / 16.0
        y = torch.tensor(y)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        cut = int(0.8 * len(y))
        self.xt, self.yt = x[perm[:cut]], y[perm[:cut]]
        self.xv, self.yv = x[perm[cut:]], y[perm[cut:]]
        self.seed = seed

    def model(self) -> nn.Module:
        torch.manual_seed(self.seed)
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def batch(self, rank: int, world: int, g: torch.Generator) -> tuple:
        shard = torch.arange(rank, len(self.yt), world)
        idx = shard[torch.randint(0, len(shard), (32,), generator=g)]
        return self.xt[idx], self.yt[idx]

    def loss(self, model: nn.Module, batch: tuple) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> tuple[float, float | None]:
        out = model(self.xv)
        return (
            float(nn.functional.cross_entropy(out, self.yv)),
            float((out.argmax(1) == self.yv).float().mean()),
        )


class CharLM:
    name = "charlm"
    seq, per_rank = 64, 8

    def __init__(self, seed: int) -> None:
        from pyring.tools.workload import CharGPT, get_batch, load_corpus

        data = load_corpus(1 << 20)
        cut = int(0.9 * len(data))
        self.train_data, self.val_data = data[:cut], data[cut:]
        self._gpt, self._get_batch = CharGPT, get_batch
        g = torch.Generator().manual_seed(10_000 + seed)
        starts = torch.randint(0, len(self.val_data) - self.seq - 1, (8, 32), generator=g)
        self.val = [self._get_batch(self.val_data, s, self.seq, "cpu") for s in starts]
        self.seed = seed

    def model(self) -> nn.Module:
        torch.manual_seed(self.seed)
        return self._gpt(dim=64, layers=2, heads=4, seq=self.seq)

    def batch(self, rank: int, world: int, g: torch.Generator) -> tuple:
        # Every rank draws the same numbers and keeps its own rows: disjoint batches.
        starts = torch.randint(
            0, len(self.train_data) - self.seq - 1, (world, self.per_rank), generator=g
        )[rank]
        return self._get_batch(self.train_data, starts, self.seq, "cpu")

    def loss(self, model: nn.Module, batch: tuple) -> torch.Tensor:
        return model(*batch)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> tuple[float, float | None]:
        return sum(float(model(x, y)) for x, y in self.val) / len(self.val), None


TASKS = {"digits": Digits, "charlm": CharLM}
