"""Runs torch's own distributed test suite, ``DistributedTest._DistTestBase`` from the
installed wheel, against a backend (default: pyring) with forked ranks.

    python tests/torch_suite.py --world 3 [--backend gloo] [-k substring] [--json out.json]

Prints a summary line and exits 1 when any test fails or errors. The suite's own decorators
decide which tests run for the backend; the rest are skipped, as upstream.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import unittest


def _suite_class(backend: str, world: int, decorators_for: str) -> type:
    # The suite reads these at import; its skip decorators test BACKEND then.
    os.environ["BACKEND"] = decorators_for
    os.environ["WORLD_SIZE"] = str(world)
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="pyring-torch-suite-"))
    import torch.multiprocessing as tmp
    from torch.testing._internal.distributed import distributed_test
    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest,
        TestDistBackend,
    )

    import pyring  # noqa: F401  registers the backend before the ranks fork

    distributed_test.BACKEND = backend  # what the ranks run on, and the tests' own checks

    class TorchSuite(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self) -> None:
            super().setUp()
            # Forked ranks start in milliseconds; upstream spawns them.
            self._start_processes(tmp.get_context("fork").Process)

    return TorchSuite


class _Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.passed: list[str] = []

    def addSuccess(self, test) -> None:
        super().addSuccess(test)
        self.passed.append(test.id().rsplit(".", 1)[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="pyring")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--decorators-for", help="evaluate the suite's skip decorators as for this "
                    "backend (e.g. gloo: its backend-name checks lifted); default --backend")
    ap.add_argument("-k", dest="pattern", default="",
                    help="only tests whose name contains one of these (comma-separated)")
    ap.add_argument("--json", help="write names of passed/failed/skipped tests here")
    ap.add_argument("-v", action="store_true", help="one line per test")
    args = ap.parse_args(argv)
    cls = _suite_class(args.backend, args.world, args.decorators_for or args.backend)
    names = sorted(n for n in unittest.TestLoader().getTestCaseNames(cls)
                   if any(p in n for p in args.pattern.split(",")))
    suite = unittest.TestSuite(cls(n) for n in names)
    t0 = time.monotonic()
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2 if args.v else 1,
                                     resultclass=_Result).run(suite)
    took = time.monotonic() - t0
    name = lambda t: t.id().rsplit(".", 1)[-1]  # noqa: E731
    summary = {
        "backend": args.backend, "world": args.world, "seconds": round(took, 1),
        "passed": sorted(result.passed),
        "failed": sorted(name(t) for t, _ in result.failures + result.errors),
        "skipped": sorted(name(t) for t, _ in result.skipped),
    }
    print(f"torch suite on {args.backend}, world {args.world}: {len(summary['passed'])} passed, "
          f"{len(summary['failed'])} failed, {len(summary['skipped'])} skipped in {took:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    shutil.rmtree(os.environ["TEMP_DIR"], ignore_errors=True)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
