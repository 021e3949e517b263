"""Launched by torchrun in test_backend: init_process_group("pyring") from torchrun's env."""

import json
import os
import sys

import torch
import torch.distributed as dist

import pyring  # noqa: F401  (registers the backend)

dist.init_process_group("pyring")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((4097,), float(rank + 1))
dist.all_reduce(t)
model = torch.nn.Linear(3, 1, bias=False)
ddp = torch.nn.parallel.DistributedDataParallel(model)
ddp(torch.full((1, 3), float(rank + 1))).sum().backward()
report = {"rank": rank, "world": world, "backend": dist.get_backend(), "value": float(t[0]),
          "grad": model.weight.grad.tolist()}
dist.destroy_process_group()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(report, f)
