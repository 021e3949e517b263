"""How sends are copied into a peer's shm slots (PYRING_SHM_COPY, csrc/transport/shm/
stream_copy.cc): every method delivers the same bytes, whatever the alignment and length, and
stats() says which bytes went with non-temporal stores."""

from __future__ import annotations

import pytest
import torch

import pyring
from pyring.launch import run_ranks

MIN_STREAMED = 4 * 1024  # SlotCopier::kMinBytes


def _expected(n: int, world: int, salt: int) -> torch.Tensor:
    base = torch.arange(n, dtype=torch.float64) % 1000
    return sum(base * (r + 1) + salt for r in range(world)).to(torch.float32)


def _reduce_all(rank, world, store, algo):
    comm = pyring.init(rank, world, store, algo=algo)
    comm.reset_stats()
    bad = []
    # Lengths that end mid-line, and a view whose data starts 4 bytes past a line.
    for salt, (n, offset) in enumerate([(3 * 2**20 // 4 + 3, 0), (2**20 + 5, 1), (4000, 1)]):
        storage = torch.empty(n + offset, dtype=torch.float32)
        x = storage[offset:]
        x.copy_(torch.arange(n, dtype=torch.float32) % 1000 * (rank + 1) + salt)
        comm.all_reduce(x)
        if not torch.equal(x, _expected(n, world, salt)):
            bad.append((n, offset))
    stats = comm.stats()["links"]
    comm.close()
    return bad, {p: (v["bytes_sent"], v["bytes_streamed"]) for p, v in stats.items()}


@pytest.mark.parametrize("mode", ["cached", "streaming", "auto"])
@pytest.mark.parametrize("world,algo", [(2, "direct"), (3, "ring")])
def test_every_copy_method_delivers_the_same_bytes(monkeypatch, mode, world, algo):
    monkeypatch.setenv("PYRING_SHM_COPY", mode)
    monkeypatch.setenv("PYRING_TRANSPORT", "shm")
    for rank, (bad, links) in enumerate(run_ranks(world, _reduce_all, algo)):
        assert bad == [], f"rank {rank} ({mode}, {algo}): wrong sums for (length, offset) {bad}"
        used = {p: v for p, v in links.items() if v[0] > 0}  # a ring sends to one neighbour
        assert len(used) == 1 if algo == "ring" else len(used) == world - 1, (rank, links)
        for peer, (sent, streamed) in used.items():
            where = f"rank {rank} -> {peer} ({mode}, {algo})"
            assert sent > 2**20, where
            if mode == "cached":
                assert streamed == 0, where
            elif mode == "streaming":
                # Pieces of MIN_STREAMED and more stream; headers and short tails do not.
                assert sent / 2 < streamed < sent, where
            else:
                # auto measures both methods before it chooses.
                assert 0 < streamed < sent, where


def _small_only(rank, world, store):
    comm = pyring.init(rank, world, store)
    x = torch.ones(MIN_STREAMED // 4 - 1)
    for _ in range(20):
        comm.all_reduce(x)
    streamed = [v["bytes_streamed"] for v in comm.stats()["links"].values()]
    comm.close()
    return x[0].item(), streamed


def test_copies_below_the_minimum_are_never_streamed(monkeypatch):
    monkeypatch.setenv("PYRING_SHM_COPY", "streaming")
    for value, streamed in run_ranks(2, _small_only):
        assert value == 2.0**20 and streamed == [0]


def test_unknown_copy_method_names_the_valid_ones(monkeypatch):
    monkeypatch.setenv("PYRING_SHM_COPY", "fast")
    with pytest.raises(ValueError, match=r"PYRING_SHM_COPY='fast' .*auto, cached, streaming"):
        pyring.config.resolve()


def _laps(rank, world, store, algo):
    # Slots of 32 KiB: the data of lap k starts k % 8 steps of 4 KiB into its slot
    # (shm_link.h), unless it does not fit behind that. Lengths around every fit boundary,
    # packed small messages and whole-slot pieces, over many laps of the ring.
    comm = pyring.init(rank, world, store, algo=algo, segment_bytes=32 * 1024)
    step = 4096 // 4
    sizes = [1, 3, 1000, 1024 + 2, 7 * step, 7 * step + 2, 6 * step + 1, 8 * step, 8 * step + 1,
             25_000, 2 * step - 1, 5 * step, 3 * step + 7, 4 * step]
    bad = []
    for call in range(240):
        n = sizes[(call * 5) % len(sizes)] + call % 3
        x = (torch.arange(n, dtype=torch.float32) + call) % 512 * (rank + 1)
        comm.all_reduce(x)
        want = (torch.arange(n, dtype=torch.float32) + call) % 512 * sum(range(1, world + 1))
        if not torch.equal(x, want):
            bad.append((call, n))
    comm.close()
    return bad


@pytest.mark.parametrize("mode", ["cached", "auto"])
@pytest.mark.parametrize("world,algo", [(2, "direct"), (3, "ring")])
def test_rotated_slot_data_arrives_whole_over_many_laps(monkeypatch, mode, world, algo):
    monkeypatch.setenv("PYRING_SHM_COPY", mode)
    monkeypatch.setenv("PYRING_TRANSPORT", "shm")
    for rank, bad in enumerate(run_ranks(world, _laps, algo)):
        assert bad == [], f"rank {rank} ({mode}, {algo}): wrong sums at (call, length) {bad[:5]}"
