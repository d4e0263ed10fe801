"""The connections of the real service over its own accept loop: the listening socket's backlog, the shutdown of
requests in flight, and the limits the ``[server]`` section sets.

Each test starts the service in a subprocess (the untrained network, no first-run training) on a free loopback
port and talks to it over real sockets.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import time
from pathlib import Path

import httpx
from live_helpers import LiveServer, start

BURST = 400  # connects at once: more than asyncio's default backlog (100), fewer than the service's (2048)


def _connect_all(port: int, n: int, within_s: float) -> tuple[list[socket.socket], int]:
    """``n`` non-blocking connects at once; the sockets and how many completed their handshake within ``within_s``."""
    socks, done = [], 0
    sel = selectors.DefaultSelector()
    try:
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            socks.append(s)
            sel.register(s, selectors.EVENT_WRITE)
        deadline = time.monotonic() + within_s
        while done < n and time.monotonic() < deadline:
            for key, _ in sel.select(0.1):
                sel.unregister(key.fileobj)
                if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:  # type: ignore[union-attr]
                    done += 1
    finally:
        sel.close()
    return socks, done


def test_a_burst_of_connects_waits_in_the_backlog_while_the_service_is_busy(live: LiveServer) -> None:
    """The kernel completes and queues the connects of a burst while the service accepts none (here: stopped); once
    it runs again every one of them is served. With a backlog of 100 (what the start-up responder's server left on
    the socket) the connects beyond it had their SYNs dropped and waited for retransmits, seconds each."""
    os.kill(live.proc.pid, signal.SIGSTOP)
    try:
        socks, connected = _connect_all(live.port, BURST, 5.0)  # a SYN dropped is sent again after 1 s, then 3 s
    finally:
        os.kill(live.proc.pid, signal.SIGCONT)
    try:
        assert connected == BURST
        for s in socks[:: BURST // 8]:  # and they are served
            s.setblocking(True)
            s.settimeout(10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert s.recv(12) == b"HTTP/1.1 200"
    finally:
        for s in socks:
            s.close()


def _read_all(s: socket.socket, timeout_s: float = 10.0) -> bytes:
    s.settimeout(timeout_s)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def _send_head(s: socket.socket, body: bytes, request_id: str = "") -> None:
    """Send the head of a tick request and wait until its app reads the body (uvicorn's ``100 Continue``)."""
    rid = f"X-Request-ID: {request_id}\r\n".encode() if request_id else b""
    s.sendall(b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sExpect: 100-continue\r\n"
              b"Content-Length: %d\r\n\r\n" % (rid, len(body)))
    assert s.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"


def test_a_connection_timeout_under_a_second_is_the_grace_of_requests_in_flight(tmp_path: Path) -> None:
    """``server.connection_timeout = 0.9``: a request whose body is still coming when SIGTERM arrives is read and
    answered within those 0.9 s. (It was truncated to 0 s: the request was cut off at once, answered 500.)"""
    server = start(tmp_path / "state", tmp_path / "server.log", {"CEREBELLAR_NORSE_SERVER__CONNECTION_TIMEOUT": "0.9"})
    try:
        body = json.dumps({"price": 100.0, "volume": 1000.0, "timestamp": 1_640_995_200_000,
                           "market_id": "GRACE"}).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            _send_head(s, body)
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.4)
            s.sendall(body)
            answer = _read_all(s)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["market_id"] == "GRACE"
    finally:
        assert server.stop() == 0, server.log()[-4000:]


def test_fractions_of_a_second_are_kept_for_the_server_timeouts() -> None:
    from fastapi import FastAPI

    from cerebellar_norse.api.server import uvicorn_config
    from cerebellar_norse.config import Config

    cfg = Config.model_validate({"server": {"keep_alive_timeout": 0.3, "connection_timeout": 2.5}})
    config = uvicorn_config(FastAPI(), cfg)
    assert (config.timeout_keep_alive, config.timeout_graceful_shutdown) == (0.3, 2.5)


def test_a_request_cut_off_by_a_forced_quit_is_answered_in_the_json_error_shape(tmp_path: Path) -> None:
    """SIGTERM, then SIGINT while a request is still running (its body not sent): the request is cut off and
    answered 500 in the service's error shape with its request id (uvicorn's own answer was plain text without one),
    and the service still saves its state and exits 0."""
    server = start(tmp_path / "state", tmp_path / "server.log")
    try:
        body = json.dumps({"price": 100.0, "volume": 1000.0, "timestamp": 1_640_995_200_000, "market_id": "CUT"}).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            _send_head(s, body, "cut-1")  # and its body never comes
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            server.proc.send_signal(signal.SIGINT)
            answer = _read_all(s)
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 500 "), answer[:300]
        headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        assert headers[b"content-type"] == b"application/json" and headers[b"x-request-id"] == b"cut-1"
        err = json.loads(payload)["error"]
        assert (err["type"], err["request_id"]) == ("internal", "cut-1")
        assert "shut down before this request was answered" in err["message"]
    finally:
        assert server.stop() == 0, server.log()[-4000:]
    assert "forced quit" in server.log()


def test_requests_still_running_when_the_connection_timeout_passes_are_cut_off_with_one_warning(tmp_path: Path) -> None:
    """A request still running (its body never sent) when ``server.connection_timeout`` has passed at shutdown is
    answered 500 in the error shape and said once, at WARNING, with the count; uvicorn's own ERROR line and a
    CancelledError traceback per request are not in the log."""
    server = start(tmp_path / "state", tmp_path / "server.log", {"CEREBELLAR_NORSE_SERVER__CONNECTION_TIMEOUT": "0.5"})
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            _send_head(s, b"{}" * 10, "late-1")
            server.proc.send_signal(signal.SIGTERM)
            answer = _read_all(s)
        assert answer.startswith(b"HTTP/1.1 500 "), answer[:300]
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["request_id"] == "late-1"
    finally:
        assert server.stop() == 0, server.log()[-4000:]
    lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    assert [(r["level"], r["fields"]["requests"]) for r in lines if "connection_timeout" in r["message"]] == [("WARNING", 1)]
    assert not [r for r in lines if r["level"] in ("ERROR", "CRITICAL")], [r for r in lines if r["level"] == "ERROR"]
    assert "Traceback" not in server.log()


def _open_connections(server: LiveServer) -> float:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = _read_all(s).decode()
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith("cerebellar_norse_http_connections "))


def test_a_client_that_takes_no_byte_of_its_answers_is_cut_off(tmp_path: Path) -> None:
    """A client that asks for more than the socket buffers hold and then reads nothing: once no byte of the answers
    waiting for it was taken for ``server.request_timeout``, its connection is cut off, and its slot of
    ``server.max_connections`` is free again. (It was held for as long as the client lived: no deadline ran while an
    answer was being written.)"""
    server = start(tmp_path / "state", tmp_path / "server.log", {"CEREBELLAR_NORSE_SERVER__REQUEST_TIMEOUT": "1"})
    try:
        size = len(httpx.get(f"{server.url}/openapi.json", timeout=10).content)
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", server.port))
        reader.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 60)  # more than the socket buffers hold
        deadline = time.monotonic() + 30
        while _open_connections(server) > 1 and time.monotonic() < deadline:  # (the scrape's own is open)
            time.sleep(0.5)
        assert _open_connections(server) == 1
        got = 0  # what the kernels held already comes, then the end: not the 60 answers
        try:
            got = len(_read_all(reader))
        except ConnectionResetError:
            pass
        finally:
            reader.close()
        assert got < 60 * size
    finally:
        assert server.stop() == 0, server.log()[-4000:]
