"""Hypothesis over the Python API (tests/api_fuzz.py): random dtypes, shapes, strides, devices,
ops, sizes, async_op and out on 2 real ranks. PYRING_FUZZ_CALLS sets the number of calls
(default 300)."""

from __future__ import annotations

import collections
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyring.testing import api_fuzz as af

WORLD = 2


def specs():
    shape = st.one_of(
        st.lists(st.integers(0, 5), min_size=0, max_size=3),
        st.lists(st.integers(1, 70_000), min_size=1, max_size=1),  # several segments
    )
    return st.fixed_dictionaries({
        "kind": st.sampled_from(af.KINDS),
        "dtype": st.sampled_from(af.DTYPES),
        "shape": shape,
        "layout": st.sampled_from(af.LAYOUTS),
        "device": st.sampled_from(("cpu", "cpu", "cpu", "meta")),
        "numpy": st.booleans(),
        "op": st.sampled_from(af.OPS),
        "async_op": st.booleans(),
        "out": st.sampled_from(af.OUTS),
        "algo": st.sampled_from(af.ALGOS),
        "wire": st.sampled_from(af.WIRES),
        "root": st.integers(-1, WORLD),
    })


def test_random_calls_are_right_or_refused_before_sending():
    calls = int(os.environ.get("PYRING_FUZZ_CALLS", "300"))
    pool = af.Pool(WORLD)
    seen: collections.Counter = collections.Counter()
    try:
        @settings(max_examples=calls, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(specs())
        def run(spec):
            outcomes = pool.call(spec)
            assert outcomes is not None, f"a rank hung on {spec}"
            verdict = af.judge(spec, outcomes, WORLD)
            assert verdict is None, f"{spec}: {verdict}"
            seen[outcomes[0][0]] += 1

        run()
    finally:
        pool.close()
    print(f"outcomes of {calls} calls: {dict(seen)}")
    assert seen["ok"] > calls // 10 and seen["ValueError"] + seen["TypeError"] > calls // 10, seen
