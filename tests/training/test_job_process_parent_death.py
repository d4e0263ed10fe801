"""A job process stopped while it still imports its code dies with the service all the same.

The job process is to end with the service however the service ends (docs/operations.md, "What survives what"):
the kernel kills it when its parent dies (``PR_SET_PDEATHSIG``), and a thread in it watches the parent's pid. Both
were set up by the job's own entry point, after its module was imported (about a second with the training code, and
several on a busy host). A job process stopped in that window (``kill -STOP``, a frozen cgroup, a debugger) when the
service was killed had neither, and stayed behind stopped, holding its memory, until someone killed it by hand. The
process now asks for the signal before it reads its arguments.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# a job whose module takes long to import (the training code on a busy host): it says when the import began
SLOW_IMPORT = """
import os, pathlib, time
pathlib.Path(os.environ["IMPORT_MARK"]).write_text("importing")
time.sleep(120)

def job(out, stop):
    out.put(("succeeded", {}))
"""

# the service's part: start the job process and say its pid, then wait to be killed
PARENT = """
import sys, time
from cerebellar_norse.training.jobprocess import start_job_process
proc, out, stop = start_job_process("slow_import:job", ())
print(proc.pid, flush=True)
time.sleep(300)
"""


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` in /proc (``T`` stopped, ``Z`` dead but not reaped), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_job_process_stopped_while_importing_dies_when_the_service_is_killed(tmp_path: Path) -> None:
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT)
    mark = tmp_path / "importing"
    env = {**os.environ, "IMPORT_MARK": str(mark),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env)
    child = None
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 60
        while not mark.exists():  # the job process is importing its module now
            assert time.monotonic() < deadline and process_state(child) is not None, "the job process never imported"
            time.sleep(0.01)
        os.kill(child, signal.SIGSTOP)
        while process_state(child) != "T":  # (a signal is delivered asynchronously)
            assert time.monotonic() < deadline, process_state(child)
            time.sleep(0.01)
        parent.kill()  # the service dies (kill -9) while its job process is stopped
        parent.wait(30)
        deadline = time.monotonic() + 15
        while process_state(child) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_state(child) in (None, "Z"), "the stopped job process outlived the killed service"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child is not None and process_state(child) not in (None, "Z"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
