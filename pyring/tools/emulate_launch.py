"""One emulated host's launcher (see pyring.tools.emulate): started by path inside the host's
network, IPC and mount namespaces, it starts that host's ranks, records each exit status in its "rc"
file and dies with its parent. Standard library only.

    python -I emulate_launch.py SPEC.json
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


def _launch(spec_path: str) -> int:
    """One host's launcher: starts its ranks, records each exit status in its "rc" file."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def die_with_launcher() -> None:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    with open(spec_path) as f:
        ranks = json.load(f)
    procs = {}
    for r in ranks:
        with open(r["out"], "w") as out, open(r["err"], "w") as err:
            p = subprocess.Popen(r["argv"], env=r["env"], stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=err, preexec_fn=die_with_launcher)
        procs[p.pid] = (p, r)  # the Popen stays referenced: its __del__ would reap the pid
    status = 0
    while procs:
        pid, code = os.wait()
        if pid not in procs:
            continue
        r = procs.pop(pid)[1]
        rc = os.waitstatus_to_exitcode(code)
        status = status or (rc != 0)
        with open(r["rc"] + ".tmp", "w") as f:
            f.write(str(rc))
        os.replace(r["rc"] + ".tmp", r["rc"])
    return status


if __name__ == "__main__":
    sys.exit(_launch(sys.argv[1]))
