"""HTTP/1.1 as a client or proxy may speak it, against the protocol class and the real service over raw sockets.

* A client that half-closes its socket (shuts down its sending side) after its requests gets their answers
  (uvicorn closed the socket at the client's EOF: a tick was applied and its answer lost).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from typing import Any

import httpx
import pytest
from live_helpers import LiveServer
from test_protocol_framing import Transport, bodies, echo, request
from uvicorn.config import Config
from uvicorn.server import ServerState

from cerebellar_norse.api.protocol import guarded_protocol


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def market(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def live_tick(market_id: str, ts: int) -> dict[str, Any]:
    return {"price": 100.0, "volume": 10.0, "timestamp": ts, "market_id": market_id}


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes the connection (False: it did not within ``limit_s``)."""
    sock.settimeout(limit_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data, False
    return data, True


def half_closed(data: bytes) -> tuple[bool | None, list[bytes], bool, bytes]:
    """Feed ``data`` while ``/slow`` waits, then the client's EOF, then let ``/slow`` answer: what
    ``eof_received`` returned, the bodies answered, whether the transport was closed, and what was written."""

    async def run() -> tuple[bool | None, bytes, bool]:
        release = asyncio.Event()

        async def app(scope: dict, receive: Any, send: Any) -> None:
            if scope.get("path") == "/slow":
                await release.wait()
            await echo(scope, receive, send)

        protocol = guarded_protocol(30.0)(config=Config(app=app, lifespan="off", log_level="error"),
                                          server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
        transport = Transport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(data)
        for _ in range(10):
            await asyncio.sleep(0)
        kept = protocol.eof_received()
        if not kept:
            transport.close()  # what the event loop does when eof_received returns a false value
            protocol.connection_lost(None)
        release.set()
        for _ in range(20):
            await asyncio.sleep(0)
        closed = transport.closed
        protocol.connection_lost(None)
        return kept, transport.written, closed

    kept, written, closed = asyncio.run(run())
    return kept, bodies(written), closed, written


def post(path: str, body: bytes, sent: int | None = None) -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body[:sent if sent is not None else len(body)])


@pytest.mark.parametrize(("data", "answered"), [
    (request("/slow"), [b"/slow 0"]),
    (post("/slow", b"hello"), [b"/slow 5"]),
    (request("/slow") + request("/b") + post("/c", b"abc"), [b"/slow 0", b"/b 0", b"/c 3"]),
    (request("/slow") + b"GET /never-compl", [b"/slow 0"]),  # a head begun, never completed: not run
    (request("/slow") + post("/never", b"hello", sent=2), [b"/slow 0"]),  # a body begun, never completed: not run
], ids=["one request", "one with a body", "pipelined", "and half a head", "and half a body"])
def test_whole_requests_before_the_eof_are_answered_then_the_socket_closes(data: bytes, answered: list[bytes]) -> None:
    kept, got, closed, written = half_closed(data)
    assert kept is True
    assert got == answered
    assert closed
    last_head = written.rsplit(b"HTTP/1.1 ", 1)[1].partition(b"\r\n\r\n")[0].lower()
    assert b"connection: close" in last_head  # the last answer says the connection ends


@pytest.mark.parametrize("data", [b"", b"GET /hal", post("/slow", b"hello", sent=3)],
                         ids=["idle", "half a head", "the running request's body cut short"])
def test_nothing_whole_to_answer_closes_at_once(data: bytes) -> None:
    kept, got, _, _ = half_closed(data)
    assert not kept and got == []


def test_a_tick_from_a_half_closing_client_is_answered(live: LiveServer, client: httpx.Client) -> None:
    m = market("HALFCLOSE")
    ts = now_ms()
    body = json.dumps({"ticks": [live_tick(m, ts - 50 + k) for k in range(20)]}).encode()
    one = json.dumps(live_tick(m, ts)).encode()
    raw = b"".join(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                   % (path, len(b), b) for path, b in ((b"/neural/process/batch", body), (b"/neural/process", one)))
    with socket.create_connection(("127.0.0.1", live.port)) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        answer, closed = read_until_closed(s, 30)
    assert closed
    first, _, rest = answer.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 "), answer[:500]
    batch = json.loads(rest[:rest.index(b"HTTP/1.1 ")])
    assert len(batch["results"]) == 20
    second_head, _, second_body = rest[rest.index(b"HTTP/1.1 "):].partition(b"\r\n\r\n")
    assert second_head.startswith(b"HTTP/1.1 200 ") and b"connection: close" in second_head.lower()
    assert json.loads(second_body)["market_id"] == m
    state = client.get(f"/debug/markets/{m}/state").json()
    assert state["last_tick"]["timestamp"] == ts
