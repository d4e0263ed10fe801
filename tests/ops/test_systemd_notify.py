"""sd_notify messages over a fake NOTIFY_SOCKET, in process and from the real service."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cerebellar_norse.observability import systemd


@pytest.fixture()
def notify_socket(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(30)
    yield path, s
    s.close()


def test_notify_without_socket_is_a_noop() -> None:
    assert systemd.notify("READY=1", environ={}) is False


def test_notify_sends_datagram(notify_socket) -> None:  # type: ignore[no-untyped-def]
    path, s = notify_socket
    assert systemd.notify("READY=1\nSTATUS=x", environ={"NOTIFY_SOCKET": path})
    assert s.recv(100) == b"READY=1\nSTATUS=x"


def test_notify_to_missing_socket_returns_false(tmp_path: Path) -> None:
    assert systemd.notify("READY=1", environ={"NOTIFY_SOCKET": str(tmp_path / "nope")}) is False


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    assert systemd.watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert systemd.watchdog_interval_s({}) is None
    assert systemd.watchdog_interval_s({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"}) is None  # meant for another process
    assert systemd.watchdog_interval_s({"WATCHDOG_USEC": "junk"}) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_service_sends_ready_watchdog_stopping_and_exits_zero(notify_socket, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path, s = notify_socket
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEREBELLAR_NORSE_")}
    env.update(NOTIFY_SOCKET=path, WATCHDOG_USEC="200000", CEREBELLAR_NORSE_PATHS__STATE_DIR=str(tmp_path / "state"),
               CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN="false")
    proc = subprocess.Popen([sys.executable, "-m", "cerebellar_norse.cli", "--port", str(_free_port())], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        before = []  # the start's stages, the status line while `systemctl status` says "activating (start)"
        while not (msg := s.recv(4096).decode()).startswith("READY=1"):
            before.append(msg)
        assert all(m.startswith("STATUS=starting: ") for m in before), before
        assert "STATUS=starting: loading the model" in before, before
        assert "STATUS=starting: warming up the kernels" in before, before
        assert msg.startswith("READY=1\nSTATUS=serving model "), msg
        pings = [s.recv(4096).decode() for _ in range(3)]
        assert pings == ["WATCHDOG=1"] * 3
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        msgs = []
        while time.monotonic() < deadline:
            msg = s.recv(4096).decode()
            msgs.append(msg)
            if msg.startswith("STOPPING=1"):
                break
        assert any(m.startswith("STOPPING=1") for m in msgs), msgs
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode() if proc.stderr else ""
        assert (tmp_path / "state" / "market_state.bin").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_draining_stop_says_stopping_and_keeps_the_watchdog_fed(notify_socket, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``server.drain_s``: STOPPING=1 with the drain in its status at once, and WATCHDOG=1 still sent while it runs (a
    drain longer than WatchdogSec= is no wedged service); a second SIGTERM ends it."""
    path, s = notify_socket
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEREBELLAR_NORSE_")}
    env.update(NOTIFY_SOCKET=path, WATCHDOG_USEC="200000", CEREBELLAR_NORSE_PATHS__STATE_DIR=str(tmp_path / "state"),
               CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN="false", CEREBELLAR_NORSE_SERVER__DRAIN_S="300")
    proc = subprocess.Popen([sys.executable, "-m", "cerebellar_norse.cli", "--port", str(_free_port())], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while (msg := s.recv(4096).decode()).startswith("STATUS=starting: "):
            pass
        assert msg.startswith("READY=1"), msg
        assert s.recv(4096).decode() == "WATCHDOG=1"
        proc.send_signal(signal.SIGTERM)
        msg = s.recv(4096).decode()
        while msg == "WATCHDOG=1":  # (sent before the drain began)
            msg = s.recv(4096).decode()
        assert msg.startswith("STOPPING=1") and "draining for 300 s (server.drain_s)" in msg, msg
        after = [s.recv(4096).decode() for _ in range(3)]
        assert after == ["WATCHDOG=1"] * 3, after
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.asyncio
async def test_the_status_line_is_not_set_back_to_serving_once_a_stop_has_begun(
        notify_socket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """While a stop drains, a change of what the serving line says (here the served model no longer degraded) sent
    ``serving model …`` again over the drain's ``stopping: …`` line: ``systemctl status`` said it served."""
    import asyncio

    from cerebellar_norse.api import lifecycle
    from cerebellar_norse.api.server import build_service
    from cerebellar_norse.config import load_config

    path, s = notify_socket
    for k in [k for k in os.environ if k.startswith("CEREBELLAR_NORSE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setattr(lifecycle, "STATUS_PERIOD_S", 0.01)
    state = build_service(load_config(environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"),
                                               "CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN": "false"}))
    assert state.degraded is not None  # the untrained network is served
    s.setblocking(False)
    announcer = asyncio.create_task(lifecycle.announce_when_listening(state, lambda: True))
    try:
        await asyncio.sleep(0.1)
        assert s.recv(4096).decode().startswith("READY=1\nSTATUS=serving model")
        state.draining = True  # (a SIGTERM's drain: GracefulServer.handle_exit)
        state.degraded = None
        await asyncio.sleep(0.2)
        with pytest.raises(BlockingIOError):
            s.recv(4096)
        state.draining = False  # (no stop: the change is sent, as before)
        await asyncio.sleep(0.2)
        assert "STATUS=serving model" in s.recv(4096).decode()
    finally:
        announcer.cancel()
