"""``server.drain_s``: a SIGTERM first keeps serving (lame duck) before the stop goes on.

During the drain the listening socket still accepts and every request is answered, ``/health`` answers 503 with a
reason saying the service is stopping (``cerebellar_norse_ready`` 0), and every answer says ``Connection: close``; a
connection kept open from before the stop is answered too (without the drain the stop closes it at once, and a
request sent on it then is never read). A second SIGTERM, or a SIGINT, ends the drain. A reload applies the key.

Each test starts the real service in a subprocess and talks to it over real sockets.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from pathlib import Path
from typing import BinaryIO

import httpx
from live_helpers import LiveServer, start, tick

DRAIN = {"CEREBELLAR_NORSE_SERVER__DRAIN_S": "300"}  # far longer than any test: a second signal ends it


def _read_answer(f: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """One answer read from ``f`` (a socket's file): status, headers, body (by Content-Length)."""
    status_line = f.readline()
    assert status_line, "connection closed without an answer"
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = b""
    while len(body) < int(headers.get("content-length", "0")):
        chunk = f.read(int(headers["content-length"]) - len(body))
        assert chunk, "connection closed in the middle of an answer"
        body += chunk
    return int(status_line.split()[1]), headers, body


def _exchange(sock: socket.socket, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one request on ``sock`` and read its answer."""
    sock.sendall(request)
    with sock.makefile("rb", buffering=0) as f:
        return _read_answer(f)  # (unbuffered: nothing after the answer is taken from the socket)


def _tick_request(k: int) -> bytes:
    body = json.dumps(tick("DRAIN", k)).encode()
    return (b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _wait_draining(srv: LiveServer) -> httpx.Response:
    """The first ``/health`` on a new connection that answers 503 after the SIGTERM (the service still accepts)."""
    deadline = time.monotonic() + 20
    while True:
        assert srv.proc.poll() is None, srv.log()[-3000:]
        r = httpx.get(f"{srv.url}/health", timeout=5)  # a refused connection fails the test: it must still accept
        if r.status_code == 503:
            return r
        assert time.monotonic() < deadline, "GET /health still 200 after the SIGTERM"
        time.sleep(0.05)


def test_a_stop_drains_answering_every_request_with_connection_close_and_a_second_sigterm_ends_it(
        tmp_path: Path) -> None:
    cfg = tmp_path / "service.toml"
    cfg.write_text("[server]\ndrain_s = 0\n")
    srv = start(tmp_path / "state", tmp_path / "server.log", args=["--config", str(cfg)])
    try:
        # the key is applied by a reload (the running service started without a drain)
        cfg.write_text("[server]\ndrain_s = 300\n")
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while '"server.drain_s"' not in srv.log():
            assert time.monotonic() < deadline, srv.log()[-3000:]
            time.sleep(0.05)
        assert '"applied": ["server.drain_s"]' in srv.log()

        kept = socket.create_connection(("127.0.0.1", srv.port))  # a proxy's kept connection, idle at the stop
        status, headers, _ = _exchange(kept, _tick_request(0))
        assert status == 200 and headers.get("connection") != "close"

        srv.proc.send_signal(signal.SIGTERM)
        health = _wait_draining(srv)
        assert health.headers["connection"] == "close"
        assert health.json()["status"] == "unavailable"
        assert health.json()["reason"].startswith("stopping: draining for 300 s (server.drain_s)")
        metrics = httpx.get(f"{srv.url}/metrics", timeout=5)
        assert "cerebellar_norse_ready 0.0" in metrics.text and metrics.headers["connection"] == "close"

        # the kept connection is answered, says Connection: close, and is closed after its answer
        status, headers, body = _exchange(kept, _tick_request(1))
        assert status == 200, body
        assert headers["connection"] == "close"
        assert _closed_by_peer(kept)
        kept.close()
        # new connections are accepted and their ticks applied as usual
        r = httpx.post(f"{srv.url}/neural/process", json=tick("DRAIN", 2), timeout=5)
        assert r.status_code == 200 and r.headers["connection"] == "close"
        assert srv.proc.poll() is None

        srv.proc.send_signal(signal.SIGTERM)  # a second SIGTERM ends the drain: the stop goes on as without one
        assert srv.proc.wait(timeout=60) == 0, srv.log()[-3000:]
        assert "early by a second signal (SIGTERM)" in srv.log()
        assert '"ticks": 3' in srv.log()  # every tick answered was applied (and saved: "service stopped")
    finally:
        srv.stop()


def test_a_sigint_ends_the_drain(tmp_path: Path) -> None:
    srv = start(tmp_path / "state", tmp_path / "server.log", DRAIN)
    try:
        srv.proc.send_signal(signal.SIGTERM)
        assert _wait_draining(srv).json()["reason"].startswith("stopping: draining for 300 s")
        # two requests pipelined on one connection: both answered, the connection closed after the last one only
        with socket.create_connection(("127.0.0.1", srv.port)) as sock:
            sock.sendall(_tick_request(10) + _tick_request(11))
            with sock.makefile("rb") as f:
                first, second = _read_answer(f), _read_answer(f)
            assert (first[0], second[0]) == (200, 200)
            assert first[1].get("connection") != "close" and second[1]["connection"] == "close"
            assert _closed_by_peer(sock)
        srv.proc.send_signal(signal.SIGINT)
        assert srv.proc.wait(timeout=60) == 0, srv.log()[-3000:]
        assert "early by a second signal (SIGINT)" in srv.log() and "service stopped" in srv.log()
    finally:
        srv.stop()


def test_a_reload_while_draining_is_ignored_and_never_tells_systemd_the_service_serves(tmp_path: Path) -> None:
    """A SIGHUP during the drain applied the file's live keys and sent READY=1 with a ``serving model …`` status line
    after STOPPING=1: ``systemctl status`` said the stopping service served. Now it is logged and ignored."""
    notify = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    sock.settimeout(0.2)
    sent: list[str] = []
    done = threading.Event()

    def collect() -> None:  # read as they come: a queue of 10 datagrams (net.unix.max_dgram_qlen) drops the later ones
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                sent.append(sock.recv(4096).decode())

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    cfg = tmp_path / "service.toml"
    cfg.write_text("[server]\ndrain_s = 300\n[performance]\nqueue_size = 4096\n")
    srv = start(tmp_path / "state", tmp_path / "server.log", {"NOTIFY_SOCKET": str(notify)}, args=["--config", str(cfg)])
    try:
        srv.proc.send_signal(signal.SIGTERM)
        _wait_draining(srv)
        cfg.write_text("[server]\ndrain_s = 1\n[performance]\nqueue_size = 1000\n")
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while "reload requested while the service is stopping: ignored" not in srv.log():
            assert time.monotonic() < deadline and srv.proc.poll() is None, srv.log()[-3000:]
            time.sleep(0.05)
        health = httpx.get(f"{srv.url}/health", timeout=5)
        assert health.status_code == 503 and health.json()["queue_capacity"] == 4096  # the running config kept
        assert "config reloaded" not in srv.log()
        time.sleep(0.5)  # what the reload might have sent is read
        after_stop = sent[next(i for i, m in enumerate(sent) if "STOPPING=1" in m):]
        assert not any("READY=1" in m or "RELOADING=1" in m or "serving model" in m for m in after_stop), sent
        srv.proc.send_signal(signal.SIGTERM)  # ends the drain: still the 300 s one, not the file's 1 s
        assert srv.proc.wait(timeout=60) == 0, srv.log()[-3000:]
        assert "early by a second signal (SIGTERM)" in srv.log()
    finally:
        srv.stop()
        done.set()
        reader.join(5)
        sock.close()
