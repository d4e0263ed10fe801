"""Fault injection against real service processes: the host's resources run short while ticks flow.

* too few file descriptors (an open-file limit below ``server.max_connections``): idle
  clients that open more connections than the limit leaves room for are answered 503
  (``capacity``, ``Retry-After``) at once, and the journal and checkpoints keep the
  descriptors they need: ticks are still acknowledged, the service keeps running, and
  one WARNING at start says what the limit allows;
* no file descriptor left when a full journal file needs its next one (the limit lowered
  on the running process): ticks are refused with 503 (``capacity``, ``Retry-After``)
  before they change anything, ``/health`` says why (503) and ``/metrics`` too, one
  WARNING; once descriptors are back the next tick is served, and every acknowledged tick
  is in the saved state (``--verify-data`` passes);
* stdout (journald's stream) that cannot be written (``/dev/full``, a reader gone): the
  service serves on and exits 0 at SIGTERM; stderr says so once, not a traceback per line.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import BASE_TS, REPO_ROOT, LiveServer, free_port, server_environ

from cerebellar_norse.engine.persistence import STATE_FILE
from cerebellar_norse.neurons.encoder import S_N_TICKS
from cerebellar_norse.storage import read_checksummed

NOFILE = 160  # the open-file limit of the service under test (FD_RESERVE of it is kept for the state dir)


def tick_of(market: str, k: int) -> dict[str, object]:
    return {"price": 100.0 + 0.37 * ((k * 13) % 11), "volume": 10.0 + (k * 17) % 90, "timestamp": BASE_TS + 250 * k,
            "market_id": market}


def launch_limited(state_dir: Path, log_path: Path, env: dict[str, str], nofile: int | None = None,
                   stdout: str | None = None) -> LiveServer:
    """The service with RLIMIT_NOFILE (soft and hard) set to ``nofile`` and stdout to ``stdout`` (both into
    ``log_path`` by default); healthy or the test fails with its log."""
    state_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with log_path.open("ab") as err, open(stdout or log_path, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cerebellar_norse.cli", "--port", str(port)], cwd=REPO_ROOT,
                                env=server_environ(state_dir, env), stdout=out,
                                stderr=subprocess.STDOUT if stdout is None else err, preexec_fn=limit)
    srv = LiveServer(proc, port, state_dir, log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited with {proc.returncode} during startup\n{srv.log()[-4000:]}"
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{srv.url}/health", timeout=1.0).status_code == 200:
                return srv
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise AssertionError(f"server not healthy in time\n{srv.log()[-4000:]}")


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[LiveServer]:
    env = {"CEREBELLAR_NORSE_PERFORMANCE__CHECKPOINT_INTERVAL_S": "0.2"}  # a checkpoint opens a new journal segment
    srv = launch_limited(tmp_path / "state", tmp_path / "serve.log", env, NOFILE)
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait()


@pytest.mark.slow
def test_idle_connections_beyond_the_open_file_limit_are_refused_and_ticks_go_on(limited: LiveServer) -> None:
    srv = limited
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        assert c.post("/neural/process", json=tick_of("FD", 0)).status_code == 200
        held: list[socket.socket] = []
        try:
            for _ in range(NOFILE + 40):  # more than the whole limit: idle clients that never send a byte
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
                held.append(s)
            last = held[-1]
            answer = b""
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                while chunk := last.recv(4096):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
            assert b"retry-after: 1" in answer.lower() and b'"capacity"' in answer
            k = 1
            for _ in range(30):  # ~1.5 s of batches: several checkpoints, each starting a journal segment
                r = c.post("/neural/process/batch", json={"ticks": [tick_of("FD", k + j) for j in range(20)]})
                assert r.status_code == 200, r.text
                k += 20
                time.sleep(0.05)
            health = c.get("/health")
            assert health.status_code == 200 and health.json()["accepting"] is True, health.text  # (degraded: untrained)
        finally:
            for s in held:
                s.close()
    assert srv.proc.poll() is None, srv.log()[-3000:]
    deadline = time.monotonic() + 10
    while True:  # the refused descriptors are back: new clients are served again
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{srv.url}/health", timeout=2).status_code == 200:
                break
        assert time.monotonic() < deadline, srv.log()[-3000:]
        time.sleep(0.1)
    assert srv.stop() == 0, srv.log()[-3000:]
    log = srv.log()
    assert "EMFILE" not in log and "Traceback" not in log, log[-3000:]
    warnings = [line for line in log.splitlines() if "open-file limit" in line]
    assert len(warnings) == 1 and f"open-file limit {NOFILE} leaves room for" in warnings[0], warnings


def test_the_connection_limit_gauge_is_the_room_the_open_file_limit_leaves(tmp_path: Path) -> None:
    """With fewer descriptors than server.max_connections needs, connections beyond the open-file limit's room are
    refused (test above): cerebellar_norse_http_connections_limit, what CerebellarNorseConnectionsNearLimit divides by,
    is that room, not server.max_connections (10000 by default), against which the alert never fired."""
    from cerebellar_norse.api.server import FD_RESERVE

    srv = launch_limited(tmp_path / "state", tmp_path / "serve.log", {}, NOFILE)
    try:
        text = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert f"cerebellar_norse_http_connections_limit {float(NOFILE - FD_RESERVE)}" in text.splitlines()
    finally:
        srv.proc.kill()
        srv.proc.wait()


def _ask(port: int, request: bytes) -> bytes:
    """``request`` sent on a new connection; everything read until the service closes it (or 5 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        answer = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := s.recv(65536):
                answer += chunk
    return answer


@pytest.mark.slow
def test_prometheus_scrapes_a_service_whose_open_file_limit_room_is_used_up(tmp_path: Path) -> None:
    """Clients holding every connection the open-file limit leaves room for (a connection leak) made each new
    connection 503 at once, Prometheus' scrape too: the target read as down (CerebellarNorseDown) and
    CerebellarNorseConnectionsNearLimit lost the gauges it reads, as over server.max_connections they are not. A new
    connection's GET /metrics is answered (then closed); any other request on it is still refused 503 capacity, and
    one that sends nothing is closed within SCRAPE_WAIT_S."""
    from cerebellar_norse.api.protocol import SCRAPE_ROOM, SCRAPE_WAIT_S
    from cerebellar_norse.api.server import FD_RESERVE

    srv = launch_limited(tmp_path / "state", tmp_path / "serve.log", {}, NOFILE)
    room = NOFILE - FD_RESERVE
    held: list[socket.socket] = []
    try:
        for _ in range(room):  # each one answered, so that every one of them is open at the service
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            held.append(s)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200 "), len(held)
        refused = _ask(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert refused.startswith(b"HTTP/1.1 503 "), refused[:300]
        assert b"retry-after: 1" in refused.lower() and b'"capacity"' in refused and b"open-file limit" in refused
        scrape = _ask(srv.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;"
                                b"version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n")
        head, _, body = scrape.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), scrape[:300]
        assert b"connection: close" in head.lower()  # its descriptor is given back at once
        gauges = dict(line.split(" ") for line in body.decode().splitlines()
                      if line.startswith("cerebellar_norse_http_connections"))
        assert float(gauges["cerebellar_norse_http_connections_limit"]) == room
        assert float(gauges["cerebellar_norse_http_connections"]) > room  # what the alert compares with 90 % of it
        head_only = _ask(srv.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head_only.startswith(b"HTTP/1.1 200 "), head_only[:300]
        # idle clients that take the scrapes' room and send nothing lose it within SCRAPE_WAIT_S
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(SCRAPE_ROOM)]
        held += idle
        for s in idle:
            s.settimeout(SCRAPE_WAIT_S + 10)
            assert s.recv(65536) == b""  # closed by the service, with no answer
        again = _ask(srv.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert again.startswith(b"HTTP/1.1 200 "), again[:300]
        for s in held:
            s.close()
        assert srv.stop() == 0, srv.log()[-3000:]
    finally:
        for s in held:
            s.close()
        if srv.proc.poll() is None:  # a failed assertion above: the service must not outlive the test
            srv.proc.kill()
            srv.proc.wait()
    assert "Traceback" not in srv.log(), srv.log()[-3000:]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_unwritable_stdout_keeps_serving_and_says_so_once_on_stderr(tmp_path: Path) -> None:
    srv = launch_limited(tmp_path / "state", tmp_path / "stderr.log", {}, stdout="/dev/full")
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            for k in range(5):
                r = c.post("/neural/process", json=tick_of("LOG", k))
                assert r.status_code == 200, r.text
            assert c.post("/neural/process", json={"price": "x"}).status_code == 422
        assert srv.stop() == 0
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
    err = srv.log()
    assert "Logging error" not in err and "Traceback" not in err, err[:3000]
    said = [line for line in err.splitlines() if "cannot write log lines to stdout" in line]
    assert said == ["cerebellar-norse: cannot write log lines to stdout: No space left on device (errno 28); they are "
                    "dropped (the service serves on) until stdout can be written again"], err[:3000]


def saved_tick_counts(state_dir: Path) -> dict[str, int]:
    """Ticks applied to each market, as saved in ``market_state.bin``."""
    with np.load(io.BytesIO(read_checksummed(state_dir / STATE_FILE)), allow_pickle=False) as z:
        return {str(m): int(z["enc"][j][S_N_TICKS]) for j, m in enumerate(z["markets"])}


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="no prlimit")
def test_a_full_journal_file_without_a_descriptor_for_the_next_refuses_ticks_until_there_is_one(tmp_path: Path) -> None:
    env = {"CEREBELLAR_NORSE_PERFORMANCE__JOURNAL_SEGMENT_SIZE": "1MB",
           "CEREBELLAR_NORSE_PERFORMANCE__CHECKPOINT_INTERVAL_S": "3600"}  # only a full file starts the next
    srv = launch_limited(tmp_path / "state", tmp_path / "serve.log", env)
    acked: dict[str, int] = {}
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:  # one connection, opened while descriptors are free
            assert c.get("/health").status_code == 200
            soft, hard = resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE)
            taken = {int(fd) for fd in os.listdir(f"/proc/{srv.proc.pid}/fd")}
            lowest_free = next(fd for fd in range(soft) if fd not in taken)
            resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE, (lowest_free, hard))  # no open() can succeed
            k, refused = 0, []
            while len(refused) < 3:
                assert k < 400 * 250, "the journal file never filled up"
                ticks = [tick_of(f"J{j % 4}", k + j) for j in range(250)]
                r = c.post("/neural/process/batch", json={"ticks": ticks})
                if r.status_code == 200:
                    for t in ticks:
                        acked[str(t["market_id"])] = acked.get(str(t["market_id"]), 0) + 1
                    k += 250
                else:
                    refused.append(r)
            for r in refused:
                assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
                err = r.json()["error"]
                assert err["type"] == "capacity" and "errno 24 EMFILE" in err["message"], err
            health = c.get("/health")
            assert health.status_code == 503 and "journal waiting for a file descriptor" in health.json()["reason"]
            metrics = c.get("/metrics").text
            assert "cerebellar_norse_journal_waiting 1.0" in metrics and "cerebellar_norse_ready 0.0" in metrics
            assert srv.proc.poll() is None
            resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE, (soft, hard))  # descriptors are back
            ticks = [tick_of(f"J{j % 4}", k + j) for j in range(8)]
            r = c.post("/neural/process/batch", json={"ticks": ticks})
            assert r.status_code == 200, r.text
            for t in ticks:
                acked[str(t["market_id"])] += 1
            assert c.get("/health").status_code == 200
            assert "cerebellar_norse_journal_waiting 0.0" in c.get("/metrics").text
        assert srv.stop() == 0, srv.log()[-3000:]
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
    log = srv.log()
    assert "Traceback" not in log and '"ERROR"' not in log, log[-3000:]
    warnings = [line for line in log.splitlines() if '"WARNING"' in line and "EMFILE" in line]
    assert len(warnings) == 1, warnings
    assert saved_tick_counts(srv.state_dir) == acked  # every acknowledged tick, none of the refused ones
    verify = subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "--verify-data", str(srv.state_dir)],
                            cwd=REPO_ROOT, env=server_environ(srv.state_dir), capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr
