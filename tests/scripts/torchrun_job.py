"""Launched by torchrun in test_rendezvous: pyring.init() from torchrun's environment alone."""

import json
import os
import sys

import torch

import pyring

comm = pyring.init()
t = torch.full((4097,), float(comm.rank + 1))
pyring.all_reduce(t)
peer = (comm.rank + 1) % comm.world_size
report = {"rank": comm.rank, "world": comm.world_size, "local_world": comm.local_world_size,
          "value": float(t[0]), "transport": comm.transport(peer),
          "local_rank_env": int(os.environ["LOCAL_RANK"])}
pyring.destroy()
with open(os.path.join(sys.argv[1], f"rank{report['rank']}.json"), "w") as f:
    json.dump(report, f)
