"""Faults injected at the system-call level into a real service process with ``strace`` (its "Tampering" options),
as a tester outside the project would, rather than through the code's own seams.

* ``read`` of ``market_state.bin`` or of a journal file failing at start (EIO): the start stops with one line
  naming the file and the errno, nothing is moved aside, and the next start restores every acknowledged tick (a
  failed read used to move the file aside, and with it every market's state and the journal after it; a single one
  does so for ``market_state.bin``).
* ``accept4`` failing with EMFILE while serving: the service tries again once a second, not at every turn of its
  loop (it spun a core on failed accepts as long as the shortage lasted, thousands a second, saying nothing), says so
  in one WARNING, and the connection that waited meanwhile is served once accepts succeed again.

Skipped where ``strace`` is not installed or may not trace (no ptrace permission, e.g. in a container without
CAP_SYS_PTRACE).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import BASE_TS, REPO_ROOT, free_port, server_environ, start

from cerebellar_norse.config import load_config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.engine.persistence import STATE_FILE
from cerebellar_norse.engine.segments import JOURNAL_DIR, list_segments
from cerebellar_norse.neurons.encoder import S_N_TICKS
from cerebellar_norse.ticks import Tick


def strace_or_skip() -> str:
    """The strace binary, after checking it may trace here; skips the test otherwise."""
    path = shutil.which("strace")
    if path is None:
        pytest.skip("strace is not installed")
    probe = subprocess.run([path, "-qq", "-o", "/dev/null", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"strace may not trace here: {probe.stderr.strip()[:200]}")
    return path


def engine_of(state_dir: Path) -> tuple[Engine, Durability]:
    """The engine a service on ``state_dir`` runs (its default config, no model: the untrained network), recovered."""
    cfg = load_config(None, environ={k: v for k, v in server_environ(state_dir).items() if k.startswith("CEREBELLAR_NORSE_")})
    engine = Engine(cfg)
    durability = Durability(engine)
    durability.recover()
    return engine, durability


def counts(engine: Engine) -> dict[str, int]:
    return {m: int(engine.arrays.enc[s, S_N_TICKS]) for m, s in engine.pool.table.items()}


async def feed(engine: Engine, markets: list[str], first: int, n: int) -> None:
    for k in range(first, first + n):
        for m in markets:
            await engine.submit(Tick(price=100.0 + k % 7, volume=10.0 + k, timestamp=BASE_TS + 1000 * k, market_id=m))


@pytest.mark.slow
@pytest.mark.tools
@pytest.mark.parametrize("victim", ["market_state.bin", "journal file"])
def test_a_failed_read_of_a_state_file_at_start_stops_the_start_and_moves_nothing_aside(tmp_path: Path,
                                                                                        victim: str) -> None:
    strace = strace_or_skip()
    state_dir = tmp_path / "state"
    engine, durability = engine_of(state_dir)
    asyncio.run(feed(engine, ["A", "B"], 0, 20))
    asyncio.run(durability.checkpoint())  # market_state.bin holds these 40 ticks ...
    asyncio.run(feed(engine, ["A", "C"], 20, 10))  # ... and the journal these 20, as after a crash
    acked = counts(engine)
    durability.close(save=False)
    (_, segment), = list_segments(state_dir / JOURNAL_DIR)
    target = state_dir / STATE_FILE if victim == "market_state.bin" else segment
    before = sorted(p.name for p in state_dir.rglob("*"))

    # every read of the file fails (a disk that cannot read it for now); --seccomp-bpf: only reads stop the process
    proc = subprocess.Popen([strace, "-f", "--seccomp-bpf", "-qq", "-o", "/dev/null", "-P", str(target), "-e",
                             "trace=read", "-e", "inject=read:error=EIO:when=1+", "--",
                             sys.executable, "-m", "cerebellar_norse.cli", "--port", str(free_port())],
                            cwd=REPO_ROOT, env=server_environ(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:  # it served instead of refusing: fail, leaving no process behind
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert res.returncode == 1, (res.stdout[-2000:], res.stderr[-2000:])
    assert "Traceback" not in res.stdout + res.stderr and "Started server process" not in res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    what = "the market state" if victim == "market_state.bin" else "journal file"
    assert line == f"cerebellar-norse: cannot read {what} {target}: Input/output error (errno 5 EIO)"
    assert sorted(p.name for p in state_dir.rglob("*")) == before  # nothing moved aside, nothing removed

    engine2, durability2 = engine_of(state_dir)  # the next start, without the fault
    try:
        assert counts(engine2) == acked
    finally:
        durability2.close(save=False)


def traced(pid: int) -> bool:
    """Whether every thread of process ``pid`` is traced (strace attached to it)."""
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir():
        status = (task / "status").read_text()
        if "TracerPid:\t0\n" in status:
            return False
    return True


@pytest.mark.slow
@pytest.mark.tools
def test_accepts_failing_for_want_of_a_descriptor_are_retried_once_a_second_and_the_waiting_connection_is_served(
        tmp_path: Path) -> None:
    strace = strace_or_skip()
    srv = start(tmp_path / "state", tmp_path / "service.log")
    trace = tmp_path / "accepts.txt"
    try:
        tracer = subprocess.Popen([strace, "-f", "-qq", "-o", str(trace), "-p", str(srv.proc.pid), "-e", "trace=accept4",
                                   "-e", "inject=accept4:error=EMFILE"], stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not traced(srv.proc.pid):  # strace attached to every thread: accepts fail from now on
                assert tracer.poll() is None and time.monotonic() < deadline, tracer.communicate()[1]
                time.sleep(0.05)
            # a connection made while every accept fails: it waits in the backlog, its request sent
            with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as conn:
                while "EMFILE" not in (trace.read_text() if trace.exists() else ""):  # the first failed accept
                    assert tracer.poll() is None and time.monotonic() < deadline, "no accept tried"
                    time.sleep(0.05)
                time.sleep(2.5)
                tracer.send_signal(signal.SIGINT)  # detach: accepts succeed again
                tracer.wait(timeout=30)
                failed = trace.read_text().count("EMFILE")
                assert 1 <= failed <= 10, f"{failed} failed accepts in about 2.5 s: retried without a pause"
                conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert conn.recv(64).startswith(b"HTTP/1.1 200 ")
        finally:
            if tracer.poll() is None:
                tracer.kill()
                tracer.wait()
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
    finally:
        srv.stop()
    records = [json.loads(line) for line in srv.log().splitlines() if line.startswith("{")]
    said = [r["message"] for r in records if r["level"] == "WARNING" and "cannot accept connections" in r["message"]]
    assert len(said) == 1 and "errno 24 EMFILE" in said[0], said
    assert any("accepting connections again" in r["message"] for r in records)
