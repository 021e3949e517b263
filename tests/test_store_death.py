"""The store dies (rank 0's store process is killed) while the ranks are inside pyring.init, or
inside torch's new_group on the pyring backend: every rank raises CommError naming the store's
address and what it was exchanging, at once rather than at the deadline."""

from __future__ import annotations

import pytest

from pyring.launch import run_ranks
from pyring.testing.faults import DoomedStore, check_store_dies, store_dies

TIMEOUT_S = 20.0


@pytest.mark.parametrize("phase", ["init", "new_group"])
def test_store_death_names_the_store(phase):
    doomed = DoomedStore()
    try:
        results = run_ranks(3, store_dies, phase, TIMEOUT_S,
                            store=("127.0.0.1", doomed.port, ""), timeout=120)
    finally:
        doomed.close()
    assert check_store_dies(results, doomed.port, TIMEOUT_S / 4) == []
    for r in results:
        assert "failed in" in r["error"][1], r  # what it was doing with the store
