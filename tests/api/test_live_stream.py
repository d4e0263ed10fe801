"""WS /neural/stream of a real server: ticks in, results out; bad messages answered, the socket stays open."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import LiveServer, market, signal_of, tick
from websockets.sync.client import ClientConnection, connect

RESULT_KEYS = {"market_id", "prediction", "probabilities", "confidence", "spike_count", "processing_time_ns",
               "warming_up", "model_version", "request_id"}


def exchange(ws: ClientConnection, message: str | bytes) -> dict[str, Any]:
    ws.send(message)
    reply = ws.recv(timeout=10)
    assert isinstance(reply, str)  # answers are text frames
    out: dict[str, Any] = json.loads(reply)
    return out


def errors_of_kind(client: httpx.Client, kind: str) -> float:
    """``cerebellar_norse_errors_total{kind=...}`` of the server's /metrics (0 before the first such error)."""
    prefix = f'cerebellar_norse_errors_total{{kind="{kind}"}} '
    lines = [line for line in client.get("/metrics").text.splitlines() if line.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


def assert_ws_error(reply: dict[str, Any], kind: str, field: str | None) -> None:
    assert set(reply) == {"error"}
    assert set(reply["error"]) == {"type", "message", "field", "request_id"}
    assert reply["error"]["type"] == kind
    assert reply["error"]["field"] == field
    assert reply["error"]["request_id"]
    assert "Traceback" not in json.dumps(reply)


def test_stream_answers_each_tick_like_http(live: LiveServer, client: httpx.Client) -> None:
    m, ref = market("WS"), market("WSREF")
    with connect(f"{live.ws_url}/neural/stream", open_timeout=10) as ws:
        replies = [exchange(ws, json.dumps(tick(m, k))) for k in range(8)]
    for k, r in enumerate(replies):
        assert set(r) == RESULT_KEYS
        assert r["market_id"] == m
        http = client.post("/neural/process", json=tick(ref, k)).json()
        assert signal_of(r) == signal_of(http)
    assert len({r["request_id"] for r in replies}) == len(replies)  # one id per message


BAD_MESSAGES: list[tuple[str, str | bytes, str, str | None]] = [
    ("not json", "hello", "malformed_json", None),
    ("truncated", '{"price": 1.0,', "malformed_json", None),
    ("missing field", '{"price": 100.0, "volume": 1.0, "market_id": "X"}', "validation", "timestamp"),
    ("wrong type", '{"price": "100", "volume": 1.0, "timestamp": 1640995200000, "market_id": "X"}', "validation", "price"),
    ("non-finite", '{"price": 1e400, "volume": 1.0, "timestamp": 1640995200000, "market_id": "X"}', "validation", "price"),
    ("extra field", '{"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "X", "y": 1}', "validation", "y"),
    ("bad market", '{"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "X\\u0001"}', "validation", "market_id"),
    ("binary garbage", b"\x00\xff", "malformed_json", None),
    ("nested too deeply", "[" * 50_000 + "]" * 50_000, "malformed_json", None),
    ("thousands of digits", '{"price": 1' + "0" * 5000 + '.5, "volume": 1.0, "timestamp": 1640995200000, "market_id": "X"}',
     "validation", "price"),
    ("timestamp of 400 digits", '{"price": 1.0, "volume": 1.0, "timestamp": 1' + "0" * 400 + ', "market_id": "X"}',
     "validation", "timestamp"),  # closed the socket with a traceback (an int no float holds)
]


@pytest.mark.parametrize(("message", "kind", "field"), [c[1:] for c in BAD_MESSAGES], ids=[c[0] for c in BAD_MESSAGES])
def test_stream_bad_message_keeps_socket_open(live: LiveServer, message: str | bytes, kind: str, field: str | None) -> None:
    m = market("WSBAD")
    with connect(f"{live.ws_url}/neural/stream", open_timeout=10) as ws:
        assert set(exchange(ws, json.dumps(tick(m, 0)))) == RESULT_KEYS
        assert_ws_error(exchange(ws, message), kind, field)
        good = exchange(ws, json.dumps(tick(m, 1)))
        assert set(good) == RESULT_KEYS and good["market_id"] == m


@pytest.mark.parametrize("body", [b"\xff\xfe\xfd", b"\x00\xff", b'{"price": 1.0,', b"[" * 50_000 + b"]" * 50_000],
                         ids=["not UTF-8", "binary garbage", "truncated", "nested too deeply"])
def test_stream_words_a_malformed_message_as_http_does(live: LiveServer, client: httpx.Client, body: bytes) -> None:
    http = client.post("/neural/process", content=body, headers={"content-type": "application/json"}).json()["error"]
    with connect(f"{live.ws_url}/neural/stream", open_timeout=10) as ws:
        reply = exchange(ws, body)
    assert_ws_error(reply, "malformed_json", None)
    assert reply["error"]["message"] == http["message"]


def test_stream_out_of_order_and_binary_frames(live: LiveServer, client: httpx.Client) -> None:
    m, ref = market("WSO"), market("WSOREF")
    with connect(f"{live.ws_url}/neural/stream", open_timeout=10) as ws:
        for k in (0, 1, 2):
            exchange(ws, json.dumps(tick(m, k)))
            client.post("/neural/process", json=tick(ref, k))
        assert_ws_error(exchange(ws, json.dumps(tick(m, 0))), "out_of_order", "timestamp")
        r = exchange(ws, json.dumps(tick(m, 3)).encode())  # a binary frame with UTF-8 JSON is a tick too
    assert signal_of(r) == signal_of(client.post("/neural/process", json=tick(ref, 3)).json())


def test_stream_connection_gauge(live: LiveServer, client: httpx.Client) -> None:
    def gauge() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith("cerebellar_norse_stream_connections "):
                return float(line.split()[1])
        raise AssertionError("no cerebellar_norse_stream_connections")

    with connect(f"{live.ws_url}/neural/stream", open_timeout=10) as ws:
        exchange(ws, json.dumps(tick(market("WSG"), 0)))
        assert gauge() == 1
    for _ in range(100):  # the server sees the close shortly after
        if gauge() == 0:
            break
        time.sleep(0.02)
    assert gauge() == 0


@pytest.mark.parametrize("path", ["/health", "/nope", "/neural/stream/"])
def test_a_websocket_to_a_path_without_one_is_a_json_404(live: LiveServer, client: httpx.Client, path: str) -> None:
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        connect(f"{live.ws_url}{path}", open_timeout=10)
    response = refused.value.response
    assert response.status_code == 404 and response.headers["content-type"] == "application/json"
    err = json.loads(response.body or b"{}")["error"]
    assert err["type"] == "not_found" and err["request_id"] == response.headers["x-request-id"]
    assert "/neural/stream" in err["message"]
    assert "without completing handshake" not in live.log()


@pytest.mark.parametrize(("headers", "status", "reason"), [
    ({"Sec-WebSocket-Version": "13"}, 400, "missing Sec-WebSocket-Key header"),
    ({"Sec-WebSocket-Key": "not base64!", "Sec-WebSocket-Version": "13"}, 400, "Sec-WebSocket-Key"),
    ({"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "8"}, 400, "Sec-WebSocket-Version"),
    # websockets cannot read these requests at all (no answer was written, the socket stayed open)
    ({"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13", "Content-Length": "5"}, 400,
     "unsupported request body"),
    ({"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13", "Transfer-Encoding": "chunked"},
     400, "transfer codings"),
])
def test_a_malformed_websocket_handshake_is_a_json_error(live: LiveServer, client: httpx.Client, headers: dict[str, str],
                                                         status: int, reason: str) -> None:
    """The websockets library refuses these before the app sees them; the answer still has the service's shape, and
    is counted as every error is. A handshake websockets read keeps the caller's X-Request-ID (it had one of its own)."""
    before = errors_of_kind(client, "bad_request")
    lines = ["GET /neural/stream HTTP/1.1", "Host: x", "Upgrade: websocket", "Connection: Upgrade", "X-Request-ID: ws-7f3a"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    got = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    assert status_line.split()[1] == str(status), raw
    assert got["content-type"] == "application/json" and int(got["content-length"]) == len(body)
    err = json.loads(body)["error"]
    assert err["type"] == "bad_request" and err["request_id"] == got["x-request-id"]
    read = "Content-Length" not in headers and "Transfer-Encoding" not in headers  # (the last two are not)
    assert (got["x-request-id"] == "ws-7f3a") is read, got
    assert err["message"].startswith("WebSocket handshake refused: ") and reason in err["message"], err
    assert errors_of_kind(client, "bad_request") == before + 1
    with connect(f"{live.ws_url}/neural/stream", open_timeout=10) as ws:  # a good handshake still works
        assert "prediction" in exchange(ws, json.dumps(tick(market("WSH"), 0)))


def test_a_stream_message_over_max_body_size_closes_the_socket_with_1009(
        tmp_path: Path, start_server: Callable[..., LiveServer]) -> None:
    """A message is bounded like a request body (server.max_body_size); under it a message is answered as usual."""
    from websockets.exceptions import ConnectionClosed

    cfg = tmp_path / "service.toml"
    cfg.write_text('[server]\nmax_body_size = "2KB"\n')
    server = start_server(tmp_path / "state", args=["--config", str(cfg)])
    with connect(f"{server.ws_url}/neural/stream", open_timeout=10) as ws:
        padded = json.dumps({**tick(market("WSB"), 0), "pad": " " * 1500})  # under 2,000 bytes: refused field, not size
        assert "error" in exchange(ws, padded)
        ws.send(json.dumps({**tick(market("WSB"), 1), "pad": " " * 3000}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    assert "Traceback" not in server.log()


def test_a_text_frame_that_is_not_utf8_closes_with_1007_without_an_error_log(live: LiveServer) -> None:
    """Invalid UTF-8 in a text frame is the client's protocol error: close 1007, no ERROR line or traceback."""
    import os
    import struct
    from urllib.parse import urlsplit

    where = urlsplit(live.url)
    payload = b'{"market_id": "\xc3\x28"}'  # \xc3 starts a 2-byte sequence, "(" cannot continue it
    for _ in range(2):
        with socket.create_connection((where.hostname, where.port), timeout=10) as s:
            s.sendall(b"GET /neural/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(4096)
            assert head.startswith(b"HTTP/1.1 101"), head
            key = os.urandom(4)
            masked = bytes(c ^ key[i % 4] for i, c in enumerate(payload))
            s.sendall(bytes([0x81, 0x80 | len(payload)]) + key + masked)
            answer = head.split(b"\r\n\r\n", 1)[1]
            while len(answer) < 4:
                chunk = s.recv(4096)
                if not chunk:
                    break
                answer += chunk
        assert answer[0] == 0x88 and struct.unpack(">H", answer[2:4])[0] == 1007, answer
    time.sleep(0.2)
    log = live.log()
    assert "Invalid UTF-8 sequence" not in log and "Traceback" not in log, log[-3000:]
