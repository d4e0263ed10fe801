"""The client against a replica that is not listening yet (a restart): real sockets on the loopback."""

from __future__ import annotations

import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest

import cerebellar_norse.client as client_module
from cerebellar_norse.client import Client
from cerebellar_norse.errors import EngineFatalError, OutcomeUnknownError

TICK = {"price": 100.0, "volume": 1.0, "timestamp": 1_700_000_000_000, "market_id": "M"}


def bound_not_listening() -> tuple[socket.socket, str]:
    """A socket bound to a loopback port without ``listen``: connects to it are refused (RST)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


def answer_one(sock: socket.socket, start: threading.Event, seen: list[bytes]) -> None:
    """Listen once ``start`` is set, answer one request with a tick's result, record what was sent."""
    start.wait(10)
    sock.listen(1)
    sock.settimeout(20)
    conn, _ = sock.accept()
    with conn:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        while len(body) < length:
            body += conn.recv(65536)
        seen.append(body)
        out = json.dumps({"market_id": "M", "prediction": 0.0}).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(out), out))


def test_a_refused_connection_is_not_retried_by_default_and_names_the_tries() -> None:
    sock, url = bound_not_listening()
    with sock:
        with Client(url) as c, pytest.raises(EngineFatalError, match="cannot reach") as once:
            c.process(TICK)
        assert "tries" not in str(once.value)
        with Client(url, retries=2, max_wait_s=0.01) as c, pytest.raises(EngineFatalError, match=r"\(3 tries\)"):
            c.process(TICK)


def test_a_refused_connection_is_retried_until_the_replica_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    sock, url = bound_not_listening()
    start, seen, waits = threading.Event(), [], []  # type: ignore[var-annotated]
    server = threading.Thread(target=answer_one, args=(sock, start, seen), daemon=True)
    server.start()

    def wait_then_listen(s: float) -> None:  # the replica comes up during the client's first wait
        waits.append(s)
        start.set()
        time.sleep(min(s, 0.01))
    monkeypatch.setattr(client_module, "time", SimpleNamespace(sleep=wait_then_listen))
    with sock:
        with Client(url, retries=3, max_wait_s=5.0) as c:
            answer = c.process(TICK)
        server.join(5)
    assert answer["market_id"] == "M"
    assert waits == [0.1]  # refused once, answered at the first retry
    assert len(seen) == 1 and json.loads(seen[0]) == TICK  # delivered once


def test_a_service_that_takes_the_connection_and_never_answers_is_no_answer_not_unreachable() -> None:
    """A stopped (SIGSTOP) or stalled service: the kernel accepts the connection, nothing answers. A tick is an
    unknown outcome after ``timeout_s``; a health check says no answer came, not that the service cannot be reached."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)  # never accepted: connects complete in the kernel's backlog, nothing is read
    with sock, Client(f"http://127.0.0.1:{sock.getsockname()[1]}", timeout_s=0.2) as c:
        with pytest.raises(EngineFatalError) as health:
            c.health()
        assert "no answer" in str(health.value) and "cannot reach" not in str(health.value)
        with pytest.raises(OutcomeUnknownError, match="no answer"):
            c.process(TICK)


def serve_keep_alive(sock: socket.socket, accepted: list[int], requests: int) -> None:
    """Answer ``requests`` requests with a tick's result on kept-alive connections (each until the client closes
    it); count the connections accepted."""
    sock.listen(8)
    sock.settimeout(20)
    out = json.dumps({"market_id": "M", "prediction": 0.0}).encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(out), out)
    served = 0
    while served < requests:
        conn, _ = sock.accept()
        accepted.append(1)
        conn.settimeout(20)
        with conn:
            data = b""
            while served < requests and (chunk := conn.recv(65536)):
                data += chunk
                head, sep, rest = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), 0)
                if sep and len(rest) >= length:
                    data = rest[length:]
                    conn.sendall(answer)
                    served += 1


@pytest.mark.parametrize(("keepalive_s", "connections"), [(0.1, 2), (60.0, 1)])
def test_an_idle_connection_older_than_keepalive_s_is_not_reused(keepalive_s: float, connections: int) -> None:
    """A service or proxy whose idle timeout is below the client's would close a kept-alive connection just as the
    client sends on it (an unknown outcome for a tick never read): ``keepalive_s`` puts the client's below it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    accepted: list[int] = []
    server = threading.Thread(target=serve_keep_alive, args=(sock, accepted, 2), daemon=True)
    server.start()
    with sock, Client(f"http://127.0.0.1:{sock.getsockname()[1]}", keepalive_s=keepalive_s) as c:
        c.process(TICK)
        time.sleep(0.3)  # idle longer than 0.1 s, far less than 60 s
        c.process({**TICK, "timestamp": TICK["timestamp"] + 1000})  # type: ignore[operator]
    server.join(10)
    assert len(accepted) == connections
