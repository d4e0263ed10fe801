"""Signals against a real service process: a forced quit (SIGINT while a SIGTERM drains open requests), and a stop
while the training job's process is stopped (SIGSTOP).

uvicorn skips the app's shutdown on a forced quit and leaves it to the cancellation of
the lifespan at the loop's end; each cancelled request and the lifespan were logged as an
ERROR traceback. The service cuts the running requests off itself, says so in one
WARNING, saves the market state in order and exits 0, with every acknowledged tick.

A job process that is stopped keeps the SIGTERM of its cancel pending without ending: the service's stop then hung
after "Finished server process", waiting for it, until systemd's TimeoutStopSec killed the service.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import BASE_TS, start

from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training.data import write_csv


@pytest.mark.slow
def test_sigint_while_a_sigterm_drains_cuts_requests_off_with_one_line_and_saves(tmp_path: Path) -> None:
    srv = start(tmp_path / "state", tmp_path / "serve.log")
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            for k in range(20):
                r = c.post("/neural/process", json={"price": 100.0 + k % 3, "volume": 5.0,
                                                    "timestamp": BASE_TS + 1000 * k, "market_id": "SIG"})
                assert r.status_code == 200, r.text
        # a request whose body never completes: the graceful shutdown waits for it (server.connection_timeout)
        hanging = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        hanging.sendall(b"POST /neural/process/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 100000\r\n\r\n{")
        time.sleep(0.3)
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while "Waiting for connections to close" not in srv.log():
            assert time.monotonic() < deadline and srv.proc.poll() is None, srv.log()[-3000:]
            time.sleep(0.05)
        srv.proc.send_signal(signal.SIGINT)
        assert srv.stop() == 0, srv.log()[-3000:]
        hanging.close()
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
    log = srv.log()
    assert "Traceback" not in log and '"ERROR"' not in log, log[-4000:]
    assert [line for line in log.splitlines() if "forced quit" in line and '"WARNING"' in line], log[-3000:]
    assert len([line for line in log.splitlines() if "forced quit" in line]) == 1
    tail = log[log.index("forced quit"):]
    assert '"saved market state"' in tail and '"ticks": 20' in tail, tail[-2000:]


def job_process(service_pid: int) -> int:
    """The pid of the service's training job process."""
    for pid in Path(f"/proc/{service_pid}/task/{service_pid}/children").read_text().split():
        if b"cerebellar_norse.training.jobprocess" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return int(pid)
    raise AssertionError("no training job process")


@pytest.mark.slow
def test_a_stop_while_the_job_process_is_stopped_kills_it_and_exits(tmp_path: Path) -> None:
    write_csv(tmp_path / "data" / "small.csv", generate_ticks(6000, 2, seed=1))
    srv = start(tmp_path / "state", tmp_path / "serve.log", {"CEREBELLAR_NORSE_PATHS__DATA_DIR": str(tmp_path / "data")})
    job_pid = None
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/training", json={"files": ["small.csv"], "epochs": 1000})
            assert r.status_code == 202, r.text
            job_id = r.json()["job_id"]
            deadline = time.monotonic() + 180
            while c.get(f"/training/status/{job_id}").json()["progress"] == 0:  # inside its training loop
                assert time.monotonic() < deadline, srv.log()[-3000:]
                time.sleep(0.1)
        job_pid = job_process(srv.proc.pid)
        os.kill(job_pid, signal.SIGSTOP)
        srv.proc.send_signal(signal.SIGTERM)
        try:
            rc = srv.proc.wait(timeout=40)  # the job's grace (5 s), its SIGTERM's and SIGKILL's, and the final save
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the service did not exit with its job process stopped\n{srv.log()[-3000:]}") from None
        assert rc == 0, srv.log()[-3000:]
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
        if job_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(job_pid, signal.SIGKILL)
    assert not Path(f"/proc/{job_pid}").exists()  # (not a zombie either: the service reaped it)
    record = json.loads((tmp_path / "state" / "jobs" / f"{job_id}.json").read_text())
    assert record["state"] == "cancelled" and record["model_version"] is None, record
    assert "the service stopped" in record["error"], record
    assert not list((tmp_path / "state" / "models").glob("*")) or all(
        p.name.startswith("seed") for p in (tmp_path / "state" / "models").iterdir()), "a model was written"
    killed = [line for line in srv.log().splitlines() if "did not end" in line and "SIGKILL" in line]
    assert len(killed) == 1 and '"WARNING"' in killed[0], srv.log()[-3000:]
