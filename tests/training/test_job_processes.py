"""What training jobs leave behind in the service: nothing, after any number of jobs, however they end (succeeded,
failed, cancelled, killed), and nothing outlives the service's stop.

Under systemd every process left in the unit's cgroup when the main process exits is killed with SIGKILL and the
journal says so (``Killing process N (python) with signal SIGKILL``): multiprocessing's resource tracker, started by
the first job, was such a process at every stop. Pinned here without systemd: the service's children, threads and
file descriptors are counted after each job ends, and the job process running at SIGTERM is gone when the service
has exited. A real server over a socket, real job processes, a real SIGKILL.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from training_helpers import LiveServer, start

from cerebellar_norse.config import load_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training.checkpoints import ModelStore
from cerebellar_norse.training.data import write_csv

pytestmark = pytest.mark.slow

TOKEN = "secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JOB_TIMEOUT_S = 180.0
SETTLE_S = 20.0  # how long an ended job's process may take to exit (its interpreter's teardown)


@dataclass
class Served:
    srv: LiveServer
    client: httpx.Client


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("jobprocs")
    state, data = root / "state", root / "data"
    write_csv(data / "small.csv", generate_ticks(3000, 1, seed=1))
    (data / "bad.csv").write_text("no,ticks,here\n1,2,3\n")
    cfg = load_config(None, environ={})
    store = ModelStore(state)
    store.save(generate_weights(cfg), cfg, {"validation": {"loss": 1.1}}, version="20240101T000000Z-aaaaaa")
    store.set_active("20240101T000000Z-aaaaaa")
    srv = start(state, root / "server.log", {"CEREBELLAR_NORSE_PATHS__DATA_DIR": str(data),
                                             "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN})
    try:
        with httpx.Client(base_url=srv.url, timeout=30.0) as client:
            yield Served(srv, client)
    finally:
        srv.stop()


def children(pid: int) -> set[int]:
    """The live children of process ``pid`` (every thread's)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found.update(int(c) for c in task.read_text().split())
        except OSError:  # (a thread that just ended)
            continue
    return found


def counts(pid: int) -> tuple[int, int]:
    """(threads, open file descriptors) of process ``pid``."""
    threads = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("Threads:"))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def wait_state(s: Served, job_id: str, until: Any) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while True:
        st: dict[str, Any] = s.client.get(f"/training/status/{job_id}", headers=AUTH).json()
        if until(st):
            return st
        assert time.monotonic() < deadline, (st, s.srv.log()[-4000:])
        time.sleep(0.1)


def no_children_left(s: Served) -> None:
    """Wait until the service has no child process (an ended job's exits within moments); fail naming them."""
    pid = s.srv.proc.pid
    deadline = time.monotonic() + SETTLE_S
    while (left := children(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, [Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ") for c in left if
                      Path(f"/proc/{c}").exists()]


def start_job(s: Served, body: dict[str, Any]) -> str:
    r = s.client.post("/training", json={"activate": "never", **body}, headers=AUTH)
    assert r.status_code == 202, r.text
    job_id: str = r.json()["job_id"]
    return job_id


def running(st: dict[str, Any]) -> bool:
    assert st["state"] == "running", st
    return bool(st["progress"] > 0)


def one_of_each(s: Served) -> list[str]:
    """A failed, a cancelled, a killed and a succeeded job, one after the other; their end states."""
    ends = []
    job = start_job(s, {"files": ["bad.csv"]})
    ends.append(wait_state(s, job, lambda st: st["state"] != "running")["state"])
    no_children_left(s)

    job = start_job(s, {"files": ["small.csv"], "epochs": 1000})
    wait_state(s, job, running)
    ends.append(s.client.delete(f"/training/{job}", headers=AUTH).json()["state"])
    no_children_left(s)

    job = start_job(s, {"files": ["small.csv"], "epochs": 1000})
    wait_state(s, job, running)
    (proc,) = children(s.srv.proc.pid)
    os.kill(proc, signal.SIGKILL)
    ends.append(wait_state(s, job, lambda st: st["state"] != "running")["state"])
    no_children_left(s)

    job = start_job(s, {"files": ["small.csv"], "epochs": 1})
    ends.append(wait_state(s, job, lambda st: st["state"] != "running")["state"])
    no_children_left(s)
    return ends


def test_jobs_however_they_end_leave_no_process_descriptor_or_thread_behind(served: Served) -> None:
    pid = served.srv.proc.pid
    assert one_of_each(served) == ["failed", "cancelled", "failed", "succeeded"]
    after_first = counts(pid)
    assert one_of_each(served) == ["failed", "cancelled", "failed", "succeeded"]
    threads, fds = counts(pid)
    assert fds <= after_first[1], (after_first, (threads, fds))
    assert threads <= after_first[0], (after_first, (threads, fds))


def test_nothing_the_service_started_outlives_its_stop_during_a_job(served: Served) -> None:
    """SIGTERM while a job runs: the job is cancelled, its process ended and reaped before the service exits, and no
    other process of the service's (a resource tracker) is left for systemd to kill."""
    pid = served.srv.proc.pid
    job = start_job(served, {"files": ["small.csv"], "epochs": 1000})
    wait_state(served, job, running)
    seen = children(pid)
    assert len(seen) == 1, seen  # the job process, nothing beside it
    assert served.srv.stop() == 0
    alive = [c for c in seen if Path(f"/proc/{c}").exists()]
    assert alive == [], "a process of the service outlived it"
    log = served.srv.log()
    assert "Traceback" not in log and "resource_tracker" not in log, log[-4000:]
