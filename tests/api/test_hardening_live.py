"""Operator fault probes against the real server over loopback.

Auth that cannot be weakened (empty token, empty bearer, SIGHUP), slow and oversized
requests (stalled headers and bodies, the connection limit, a batch larger than the
queue, a chunked body over the limit), HEAD probes, far-future ticks and the reset of
one market, one error taxonomy on every route, and the log volume of evictions.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from live_helpers import REPO_ROOT, LiveServer, free_port, market, server_environ, signal_of, start
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

TOKEN = "probe-token-7f3a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUEUE = 300  # performance.queue_size of the module's server (batch_size 256 fits it)
REQUEST_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 2


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server with a token, short request and keep-alive deadlines, and a small queue."""
    root = tmp_path_factory.mktemp("hardening")
    (root / "data").mkdir()
    server = start(root / "state", root / "server.log", {
        "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN,
        "CEREBELLAR_NORSE_SERVER__REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S),
        "CEREBELLAR_NORSE_SERVER__KEEP_ALIVE_TIMEOUT": str(KEEP_ALIVE_S),
        "CEREBELLAR_NORSE_PERFORMANCE__QUEUE_SIZE": str(QUEUE),
        "CEREBELLAR_NORSE_PATHS__DATA_DIR": str(root / "data"),
    })
    try:
        yield server
    finally:
        rc = server.stop()
    assert rc == 0, server.log()[-4000:]


@pytest.fixture(scope="module")
def client(srv: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=60.0) as c:  # the first multi-tick batch compiles a kernel variant
        yield c


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def live_tick(market_id: str, ts: int, price: float = 100.0) -> dict[str, Any]:
    return {"price": price, "volume": 10.0, "timestamp": ts, "market_id": market_id}


def error_of(r: httpx.Response, status: int, kind: str, field: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err: dict[str, Any] = r.json()["error"]
    assert (err["type"], err["field"]) == (kind, field), err
    assert err["request_id"] == r.headers["x-request-id"]
    return err


def samples(client: httpx.Client, name: str) -> list[Any]:
    return [s for fam in text_string_to_metric_families(client.get("/metrics").text) for s in fam.samples if s.name == name]


def sample_value(client: httpx.Client, name: str, **labels: str) -> float:
    return sum(s.value for s in samples(client, name) if all(s.labels.get(k) == v for k, v in labels.items()))


def neural_ticks(client: httpx.Client) -> int:
    return int(client.get("/neural/metrics").json()["neural_metrics"]["ticks"])


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (s after the call)."""
    t0 = time.monotonic()
    sock.settimeout(limit_s)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data, time.monotonic() - t0
        data += chunk


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def raw_request(port: int, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """One request over a raw socket, headers sent verbatim (httpx refuses values such as "Bearer ")."""
    lines = [f"{method} {path} HTTP/1.1", "Host: x", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        raw, _ = read_until_closed(s, 10)
    return parse_response(raw)


def assert_no_error_logs(server: LiveServer) -> None:
    for line in server.log().splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            assert rec["level"] not in ("ERROR", "CRITICAL"), line
        assert "Traceback" not in line, line


# -- auth ----------------------------------------------------------------------------------------


def test_empty_or_blank_token_is_no_token_off_loopback(tmp_path: Path) -> None:
    procs = {}
    for name, token in {"empty": "", "blank": "   \t"}.items():
        env = server_environ(tmp_path / "state", {"CEREBELLAR_NORSE_SERVER__HOST": "0.0.0.0",
                                                  "CEREBELLAR_NORSE_SERVER__API_TOKEN": token})
        procs[name] = subprocess.Popen([sys.executable, "-m", "cerebellar_norse.cli", "--port", str(free_port())],
                                       cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs[name + " --validate-config"] = subprocess.Popen(
            [sys.executable, "-m", "cerebellar_norse.cli", "--validate-config"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, (name, out, err)
        assert "server.api_token" in err and "not loopback" in err, (name, err)
        assert "Traceback" not in out + err
        assert "Started server process" not in out + err, name


@pytest.mark.parametrize("header", ["Bearer ", "Bearer", "Bearer    ", "bearer", "Basic " + TOKEN, f"Token {TOKEN}",
                                    "Bearer wrong", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"{TOKEN}", None])
def test_bad_bearer_never_authenticates(srv: LiveServer, header: str | None) -> None:
    headers = {"Authorization": header} if header is not None else {}
    for method, path in (("GET", "/models"), ("DELETE", "/neural/markets/X"), ("GET", "/training/status/latest")):
        status, got, body = raw_request(srv.port, method, path, headers)
        assert status == 401, (method, path, body)
        assert got["www-authenticate"] == "Bearer"
        assert json.loads(body)["error"]["type"] == "unauthorized"
    assert raw_request(srv.port, "GET", "/models", AUTH)[0] == 200
    assert raw_request(srv.port, "GET", "/models", {"Authorization": f"bearer  {TOKEN} "})[0] == 200


def test_a_token_sent_as_a_trailer_does_not_authenticate(srv: LiveServer) -> None:
    """A chunked body's trailers are not headers: a proxy before the service does not see them as such."""
    for path in ("/training", "/models/v-trailer/activate"):
        raw = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n"
               b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(raw)
            answer, _ = read_until_closed(s, 10)
        status, headers, body = parse_response(answer)
        assert status == 401 and headers["www-authenticate"] == "Bearer", answer
        assert json.loads(body)["error"]["type"] == "unauthorized"


CONFIG = """
[server]
host = "127.0.0.1"
{token}
[logging]
level = "{level}"
"""


def _wait_for_log(server: LiveServer, needle: str, count: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.log().count(needle) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not logged {count} times\n{server.log()[-3000:]}")


def test_sighup_cannot_remove_or_change_the_token(tmp_path: Path, start_server: Callable[..., LiveServer]) -> None:
    cfg = tmp_path / "service.toml"
    cfg.write_text(CONFIG.format(token='api_token = "first-token"', level="INFO"))
    server = start_server(tmp_path / "state", args=["--config", str(cfg)])
    first, second = {"Authorization": "Bearer first-token"}, {"Authorization": "Bearer second-token"}
    with httpx.Client(base_url=server.url, timeout=10.0) as c:
        assert c.get("/models").status_code == 401
        assert c.get("/models", headers=first).status_code == 200
        for refusals, token_line in enumerate(("", 'api_token = ""', 'api_token = "   "', 'api_token = "second-token"'), 1):
            cfg.write_text(CONFIG.format(token=token_line, level="DEBUG"))
            server.proc.send_signal(signal.SIGHUP)
            _wait_for_log(server, "config reload refused", refusals)
            # the running config is kept whole: auth unchanged, and the level change of the same file not applied
            assert c.get("/models").status_code == 401, token_line
            assert raw_request(server.port, "GET", "/models", {"Authorization": "Bearer "})[0] == 401
            assert c.get("/models", headers=second).status_code == 401
            assert c.get("/models", headers=first).status_code == 200
            assert c.post("/neural/process", json=live_tick(market("HUP"), now_ms())).status_code == 200
        assert '"level": "DEBUG"' not in server.log()
        cfg.write_text(CONFIG.format(token='api_token = "first-token"', level="DEBUG"))  # same token: applies
        server.proc.send_signal(signal.SIGHUP)
        _wait_for_log(server, '"message": "config reloaded"', 1)
        assert c.get("/models", headers=first).status_code == 200
        assert c.post("/neural/process", json=live_tick(market("HUP"), now_ms())).status_code == 200
        _wait_for_log(server, '"level": "DEBUG"', 1)  # logging.level of the same file did apply this time
    refused = [json.loads(line) for line in server.log().splitlines()
               if line.startswith("{") and "config reload refused" in line]
    assert len(refused) == 4 and all("server.api_token" in r["message"] for r in refused)
    assert not any("first-token" in r["message"] or "second-token" in r["message"] for r in refused)  # no secrets


# -- load edge cases -----------------------------------------------------------------------------


def test_batch_larger_than_the_queue_is_422_not_503(client: httpx.Client) -> None:
    m = market("BIG")
    t0 = now_ms() - 10 * 60_000
    ticks = [live_tick(m, t0 + k) for k in range(QUEUE + 1)]
    before = neural_ticks(client)
    err = error_of(client.post("/neural/process/batch", json={"ticks": ticks}), 422, "validation", "ticks")
    assert "can never fit" in err["message"] and "performance.queue_size" in err["message"], err
    assert neural_ticks(client) == before
    r = client.post("/neural/process/batch", json={"ticks": ticks[:QUEUE]})  # exactly the queue fits
    assert r.status_code == 200, r.text
    schema = client.get("/openapi.json").json()["components"]["schemas"]["BatchIn"]["properties"]["ticks"]
    assert schema["maxItems"] == QUEUE


def test_chunked_body_over_the_limit_on_the_hot_path_is_413(srv: LiveServer, client: httpx.Client) -> None:
    body = json.dumps({"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "X" * 1_100_000}).encode()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 64 * 1024):
            yield body[i:i + 64 * 1024]

    r = client.post("/neural/process", content=chunks(), headers={"Content-Type": "application/json",
                                                                   "X-Request-ID": "chunky-1"})
    assert "content-length" not in r.request.headers
    err = error_of(r, 413, "body_too_large")
    assert err["request_id"] == "chunky-1" and "max_body_size" in err["message"]
    assert client.get("/health").status_code == 200
    assert_no_error_logs(srv)


@pytest.mark.parametrize(("path", "ctype"), [("/health", "application/json"), ("/metrics", "text/plain")])
def test_head_probes(client: httpx.Client, path: str, ctype: str) -> None:
    r = client.head(path)
    assert r.status_code == 200
    assert r.content == b""
    assert r.headers["content-type"].startswith(ctype)
    assert r.headers["x-request-id"]


def test_stalled_headers_are_cut_off_with_408(srv: LiveServer, client: httpx.Client) -> None:
    before = sample_value(client, "cerebellar_norse_http_request_timeouts_total", phase="headers")
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Ty")
        raw, waited = read_until_closed(s, 10)
    status, headers, body = parse_response(raw)
    assert status == 408, raw
    assert REQUEST_TIMEOUT_S * 0.8 <= waited < REQUEST_TIMEOUT_S + 3, waited
    err = json.loads(body)["error"]
    assert err["type"] == "request_timeout" and "server.request_timeout" in err["message"]
    assert err["request_id"] == headers["x-request-id"]
    # the same after a first request on a keep-alive connection
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        (status, _, first), = _read_responses(s, 1)  # the whole answer: its head and body may come apart
        assert status == 200, first
        s.sendall(b"GET /hea")
        raw, _ = read_until_closed(s, 10)
    assert parse_response(raw)[0] == 408
    assert sample_value(client, "cerebellar_norse_http_request_timeouts_total", phase="headers") == before + 2


@pytest.mark.parametrize("path", ["/neural/process", "/neural/process/batch", "/training"])
def test_stalled_body_is_cut_off_with_408(srv: LiveServer, client: httpx.Client, path: str) -> None:
    before = sample_value(client, "cerebellar_norse_http_request_timeouts_total", phase="body")
    rid = f"slow-body-{path.replace('/', '-')}"
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n"
                  f"Authorization: Bearer {TOKEN}\r\nX-Request-ID: {rid}\r\n\r\n{{\"ticks\": [".encode())
        raw, waited = read_until_closed(s, 10)
    status, headers, body = parse_response(raw)
    assert status == 408, raw
    assert REQUEST_TIMEOUT_S * 0.8 <= waited < REQUEST_TIMEOUT_S + 3, waited
    assert headers["connection"] == "close"
    err = json.loads(body)["error"]
    assert (err["type"], err["request_id"]) == ("request_timeout", rid)
    assert headers["x-request-id"] == rid
    assert sample_value(client, "cerebellar_norse_http_request_timeouts_total", phase="body") == before + 1
    assert sample_value(client, "cerebellar_norse_http_requests_total", route=path, status="408") >= 1
    assert_no_error_logs(srv)


def test_idle_connection_is_closed_after_keep_alive_timeout(srv: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        raw, waited = read_until_closed(s, 10)
    assert raw == b""
    assert KEEP_ALIVE_S * 0.8 <= waited < KEEP_ALIVE_S + 3, waited


def test_connection_limit_answers_json_503_and_frees_up(tmp_path: Path, start_server: Callable[..., LiveServer]) -> None:
    limit = 4
    # long enough that the slow sockets still hold every slot while the probes below run on a loaded host
    keep_alive_s, request_timeout_s = 6, 5.0
    server = start_server(tmp_path / "state", env={"CEREBELLAR_NORSE_SERVER__MAX_CONNECTIONS": str(limit),
                                                   "CEREBELLAR_NORSE_SERVER__KEEP_ALIVE_TIMEOUT": str(keep_alive_s),
                                                   "CEREBELLAR_NORSE_SERVER__REQUEST_TIMEOUT": str(request_timeout_s)})
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(limit - 1)]
    stalled = socket.create_connection(("127.0.0.1", server.port))
    stalled.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finishes its headers
    try:
        time.sleep(0.2)
        for path in ("/health", "/neural/process"):
            with httpx.Client(base_url=server.url, timeout=10.0) as c:
                r = c.request("POST" if path == "/neural/process" else "GET", path,
                              json=live_tick("LIMIT", now_ms()) if path == "/neural/process" else None,
                              headers={"X-Request-ID": f"limit{path.replace('/', '-')}"})
            err = error_of(r, 503, "capacity")
            assert int(r.headers["retry-after"]) >= 1
            assert err["request_id"] == f"limit{path.replace('/', '-')}"
            assert "server.max_connections" in err["message"]
        # the scrape is answered, with the figures that say why the others are not: refused, Prometheus saw the
        # service down and the connection gauges vanished just when the limit was used up
        with httpx.Client(base_url=server.url, timeout=10.0) as c:
            assert c.head("/metrics").status_code == 200
            assert sample_value(c, "cerebellar_norse_http_connections") > limit
            assert sample_value(c, "cerebellar_norse_http_connections_limit") == limit
        with pytest.raises(InvalidStatus) as refused:  # a stream handshake gets the same answer
            connect(f"{server.ws_url}/neural/stream", open_timeout=10)
        assert refused.value.response.status_code == 503
        assert json.loads(refused.value.response.body or b"{}")["error"]["type"] == "capacity"
        assert "without completing handshake" not in server.log()  # a denial is no error of the service
        # the slow sockets are cut off (request_timeout, keep_alive_timeout) and the service answers again
        deadline = time.monotonic() + keep_alive_s + 5
        while True:
            r = httpx.get(f"{server.url}/health", timeout=5.0)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200, r.text
        stalled.settimeout(1)
        assert parse_response(stalled.recv(65536))[0] == 408
    finally:
        for s in [*idle, stalled]:
            s.close()


# -- far-future ticks and the reset of one market --------------------------------------------------


def test_far_future_tick_is_refused_and_does_not_lock_the_market(client: httpx.Client) -> None:
    m = market("FUT")
    before = neural_ticks(client)
    err = error_of(client.post("/neural/process", json=live_tick(m, now_ms() + 10 * 60_000)), 409,
                   "future_timestamp", "timestamp")
    assert "server.max_clock_skew_ms" in err["message"]
    far = 4_000_000_000_000  # year 2096: inside the schema's range, far ahead of the clock
    error_of(client.post("/neural/process", json=live_tick(m, far)), 409, "future_timestamp", "timestamp")
    r = client.post("/neural/process/batch", json={"ticks": [live_tick(m, now_ms()), live_tick(m, far)]})
    error_of(r, 409, "future_timestamp", "ticks.1.timestamp")
    assert neural_ticks(client) == before  # nothing of it was applied
    assert client.post("/neural/process", json=live_tick(m, now_ms())).status_code == 200  # the market is not locked
    assert client.post("/neural/process", json=live_tick(m, now_ms() + 60_000)).status_code == 200  # within the skew


def test_far_future_tick_on_the_stream(srv: LiveServer) -> None:
    m = market("FUTWS")
    with connect(f"{srv.ws_url}/neural/stream") as ws:
        ws.send(json.dumps(live_tick(m, 4_000_000_000_000)))
        err = json.loads(ws.recv(timeout=10))["error"]
        assert (err["type"], err["field"]) == ("future_timestamp", "timestamp")
        ws.send(json.dumps(live_tick(m, now_ms())))
        assert json.loads(ws.recv(timeout=10))["market_id"] == m


def test_a_stream_handshake_answers_with_its_request_id(srv: LiveServer) -> None:
    """The 101 carries ``X-Request-ID`` as every HTTP answer does: the caller's when valid, else a fresh one; a
    refused handshake's JSON error names the same id."""
    with connect(f"{srv.ws_url}/neural/stream", additional_headers={"X-Request-ID": "ws-conn-1"}) as ws:
        assert ws.response is not None and ws.response.headers["X-Request-ID"] == "ws-conn-1"
    with connect(f"{srv.ws_url}/neural/stream", additional_headers={"X-Request-ID": "not valid!"}) as ws:
        assert ws.response is not None and re.fullmatch(r"[0-9a-f]{32}", ws.response.headers["X-Request-ID"])
    with pytest.raises(InvalidStatus) as refused:
        connect(f"{srv.ws_url}/neural/nowhere", additional_headers={"X-Request-ID": "ws-conn-2"}, open_timeout=10)
    assert refused.value.response.status_code == 404
    assert refused.value.response.headers["X-Request-ID"] == "ws-conn-2"
    assert json.loads(refused.value.response.body or b"{}")["error"]["request_id"] == "ws-conn-2"


def test_reset_one_market(client: httpx.Client) -> None:
    m, fresh = market("RST") + "/USD", market("REF")
    ahead = now_ms() + 60_000  # accepted (within the skew), and moves the market's clock a minute ahead
    assert client.post("/neural/process", json=live_tick(m, ahead)).status_code == 200
    error_of(client.post("/neural/process", json=live_tick(m, now_ms())), 409, "out_of_order", "timestamp")
    url = f"/neural/markets/{quote(m, safe='')}"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        error_of(client.delete(url, headers=headers), 401, "unauthorized")
    assert raw_request(int(client.base_url.port or 0), "DELETE", url, {"Authorization": "Bearer "})[0] == 401
    r = client.delete(url, headers={**AUTH, "X-Request-ID": "reset-1"})
    assert r.status_code == 200, r.text
    assert r.json() == {"market_id": m, "reset": True, "request_id": "reset-1"}
    # the market starts from rest: it answers exactly as a market never seen
    ts = now_ms()
    got = client.post("/neural/process", json=live_tick(m, ts)).json()
    ref = client.post("/neural/process", json=live_tick(fresh, ts)).json()
    assert signal_of(got) == signal_of(ref)
    r = client.delete(f"/neural/markets/{quote(market('NEVER'), safe='')}", headers=AUTH)
    error_of(r, 404, "not_found", "market_id")
    error_of(client.delete("/neural/markets/%20PAD", headers=AUTH), 404, "not_found", "market_id")  # not a valid id


# -- one error taxonomy ----------------------------------------------------------------------------


def test_invalid_utf8_is_malformed_json_on_every_route(client: httpx.Client) -> None:
    before = {k: sample_value(client, "cerebellar_norse_errors_total", kind=k) for k in ("malformed_json", "validation", "http")}
    raw = b'{"ticks": [{"market_id": "\xff\xfe"}]}'
    for path, headers in (("/neural/process", {}), ("/neural/process/batch", {}), ("/training", AUTH)):
        r = client.post(path, content=raw, headers={"Content-Type": "application/json", **headers})
        error_of(r, 400, "malformed_json")
        r = client.post(path, content=b'{"ticks": [', headers={"Content-Type": "application/json", **headers})
        error_of(r, 400, "malformed_json")
    after = {k: sample_value(client, "cerebellar_norse_errors_total", kind=k) for k in before}
    assert after["malformed_json"] == before["malformed_json"] + 6  # every 400 counted under its error.type
    assert after["validation"] == before["validation"] and after["http"] == before["http"] == 0


def test_hot_path_is_counted_under_its_route(client: httpx.Client) -> None:
    labels = {"route": "/neural/process", "method": "POST", "status": "200"}
    before = sample_value(client, "cerebellar_norse_http_requests_total", **labels)
    other = sample_value(client, "cerebellar_norse_http_requests_total", route="other", method="POST")
    for _ in range(3):
        assert client.post("/neural/process", json=live_tick(market("RT"), now_ms())).status_code == 200
    assert sample_value(client, "cerebellar_norse_http_requests_total", **labels) == before + 3
    assert sample_value(client, "cerebellar_norse_http_requests_total", route="other", method="POST") == other
    assert sum(s.value for s in samples(client, "cerebellar_norse_http_request_duration_seconds_count")
               if s.labels["route"] == "/neural/process") >= 3


def _read_responses(sock: socket.socket, count: int, data: bytes = b"", limit_s: float = 10.0) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` responses read off one connection (``data``: bytes of it already read), each cut by its Content-Length."""
    sock.settimeout(limit_s)
    out = []
    while len(out) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            status, headers, _ = parse_response(data[:head_end + 4])
            end = head_end + 4 + int(headers.get("content-length", "0"))
            if len(data) >= end:
                out.append((status, headers, data[head_end + 4:end]))
                data = data[end:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {len(out)} of {count} responses"
        data += chunk
    return out


def test_pipelined_requests_are_answered_whole_and_in_order(srv: LiveServer) -> None:
    """Requests written back to back on one connection get one whole answer each, in request order."""
    m = market("PIPE")
    ts = now_ms()
    bodies = [json.dumps(live_tick(m, ts + k, 100.0 + k)).encode() for k in range(3)]
    raw = b""
    for k, body in enumerate(bodies):
        raw += (b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"X-Request-ID: pipe-%d\r\nContent-Length: %d\r\n\r\n" % (k, len(body))) + body
        raw += b"GET /health HTTP/1.1\r\nHost: x\r\nX-Request-ID: pipe-health-%d\r\n\r\n" % k
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(raw)
        answers = _read_responses(s, 6)
    for k in range(3):
        (st_tick, h_tick, b_tick), (st_health, h_health, b_health) = answers[2 * k], answers[2 * k + 1]
        assert st_tick == 200 and h_tick["x-request-id"] == f"pipe-{k}"
        got = json.loads(b_tick)
        assert got["market_id"] == m and got["request_id"] == f"pipe-{k}"
        assert st_health == 200 and h_health["x-request-id"] == f"pipe-health-{k}"
        assert "status" in json.loads(b_health)


def test_expect_100_continue_gets_its_interim_answer_before_the_body(srv: LiveServer) -> None:
    body = json.dumps(live_tick(market("EXP"), now_ms())).encode()
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        s.settimeout(10)
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = s.recv(4096)
            assert chunk, "closed before the interim answer"
            interim += chunk
        assert interim.startswith(b"HTTP/1.1 100 ")
        rest = interim.partition(b"\r\n\r\n")[2]
        s.sendall(body)
        (status, headers, answer), = _read_responses(s, 1, rest)
    assert status == 200 and json.loads(answer)["request_id"] == headers["x-request-id"]


@pytest.mark.parametrize("raw", [
    b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 100,  # TLS spoken to a plain HTTP port
    b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"ZZZ\r\n\r\n",  # the headers were read, the body's chunk size is not a number
], ids=["bad version", "length and chunked", "TLS", "bad chunk"])
def test_malformed_request_is_a_json_400_and_the_connection_closes(srv: LiveServer, client: httpx.Client, raw: bytes) -> None:
    before = sample_value(client, "cerebellar_norse_errors_total", kind="bad_request")
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(raw)
        answer, _ = read_until_closed(s, 10)
    status, headers, body = parse_response(answer)
    assert status == 400 and headers["connection"] == "close" and headers["content-type"] == "application/json", answer
    err = json.loads(body)["error"]
    assert err["type"] == "bad_request" and err["request_id"] == headers["x-request-id"]
    assert sample_value(client, "cerebellar_norse_errors_total", kind="bad_request") == before + 1
    assert client.get("/health").status_code == 200
    assert_no_error_logs(srv)


@pytest.mark.parametrize("after", [b"GARBAGE\r\n\r\n", b"X"])
def test_a_malformed_request_after_a_good_one_is_answered_after_it(srv: LiveServer, after: bytes) -> None:
    """The good request's answer comes first, then the refusal: a client matches answers to requests in order."""
    m = market("PIPE400")
    body = json.dumps(live_tick(m, now_ms())).encode()
    good = (b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(good + after + (b"" if after.endswith(b"\r\n\r\n") else b" / HTTP/1.1\r\n\r\n"))
        (st1, _, b1), (st2, h2, b2) = _read_responses(s, 2)
    assert st1 == 200 and json.loads(b1)["market_id"] == m
    assert st2 == 400 and h2["connection"] == "close" and json.loads(b2)["error"]["type"] == "bad_request"


def test_a_content_length_with_whitespace_after_it_is_read(srv: LiveServer) -> None:
    body = json.dumps(live_tick(market("OWS"), now_ms())).encode()
    for ows in (b" ", b"\t", b"  "):
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(b"POST /neural/process HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d%s\r\n\r\n" % (len(body), ows) + body)
            answer, _ = read_until_closed(s, 10)
        status, _, got = parse_response(answer)
        assert status == 200, answer[:300]
        body = json.dumps(live_tick(json.loads(got)["market_id"], now_ms() + 1)).encode()


def test_a_bad_chunked_body_pipelined_after_a_good_request_is_refused_after_it(srv: LiveServer) -> None:
    body = json.dumps(live_tick(market("PIPECHUNK"), now_ms())).encode()
    good = (b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body
    bad = (b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\nZZ\r\n\r\n")
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(good + bad)
        (st1, _, _), (st2, h2, b2) = _read_responses(s, 2, limit_s=5)
    assert (st1, st2) == (200, 400) and h2["connection"] == "close" and json.loads(b2)["error"]["type"] == "bad_request"


def test_the_header_limit_is_exactly_64_kib_of_request_line_and_headers(srv: LiveServer) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n"
    for size, status in ((65_536, 200), (65_537, 431)):
        request = head % (b"b" * (size - len(head % b"")))
        assert len(request) == size
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(request)
            ((got, _, _),) = _read_responses(s, 1)
        assert got == status, size


def test_headers_over_the_limit_in_one_write_are_a_json_431(srv: LiveServer) -> None:
    for size in (70_000, 122_552):
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * size + b"\r\n\r\n")
            answer, _ = read_until_closed(s, 10)
        status, _, body = parse_response(answer)
        assert status == 431 and json.loads(body)["error"]["type"] == "headers_too_large", answer[:300]


@pytest.mark.parametrize("shape", ["one long header", "many headers", "slowly"])
def test_headers_over_the_limit_are_a_json_431(srv: LiveServer, client: httpx.Client, shape: str) -> None:
    before = sample_value(client, "cerebellar_norse_errors_total", kind="headers_too_large")
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        try:
            if shape == "one long header":
                s.sendall(b"X-Big: " + b"b" * 1_000_000 + b"\r\n\r\n")
            elif shape == "many headers":
                s.sendall(b"".join(b"X-H%d: v\r\n" % k for k in range(20_000)) + b"\r\n")
            else:
                for k in range(100):  # in small writes, as a slow client sends them
                    s.sendall(b"X-Slow-%d: " % k + b"s" * 1000 + b"\r\n")
                    time.sleep(0.001)
        except OSError:
            pass  # the server may close before the client has written it all
        answer, _ = read_until_closed(s, 10)
    status, headers, body = parse_response(answer)
    assert status == 431 and headers["connection"] == "close", answer[:300]
    err = json.loads(body)["error"]
    assert err["type"] == "headers_too_large" and "65536" in err["message"]
    assert sample_value(client, "cerebellar_norse_errors_total", kind="headers_too_large") == before + 1


def test_headers_under_the_limit_are_served(client: httpx.Client) -> None:
    r = client.get("/health", headers={"X-Big": "b" * 60_000})
    assert r.status_code == 200
    many = {f"X-H{k}": "v" for k in range(2000)}
    assert client.get("/health", headers=many).status_code == 200


# -- log volume ------------------------------------------------------------------------------------


def test_evictions_are_logged_as_a_summary(tmp_path: Path, start_server: Callable[..., LiveServer]) -> None:
    server = start_server(tmp_path / "state", env={"CEREBELLAR_NORSE_PERFORMANCE__MAX_MARKETS": "4"})
    ts = now_ms()
    with httpx.Client(base_url=server.url, timeout=10.0) as c:
        for k in range(150):  # every tick a new market: each one evicts the least recently used
            assert c.post("/neural/process", json=live_tick(f"EV-{k}", ts)).status_code == 200
        evictions = c.get("/health").json()["pool"]["evictions"]
    assert evictions >= 146
    assert server.stop() == 0
    lines = [json.loads(line) for line in server.log().splitlines()
             if line.startswith("{") and "evicted least recently used markets" in line]
    assert 1 <= len(lines) <= 2, len(lines)  # the first at once, the rest in one summary (at shutdown here)
    assert sum(rec["fields"]["evicted"] for rec in lines) == evictions


@pytest.mark.parametrize("upgrade", [
    {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAAQCAAAAAAIAAAAA"},
    {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
     "Sec-WebSocket-Version": "13"},
], ids=["h2c", "websocket"])
def test_a_tick_asking_to_switch_protocols_is_served_over_http_1_1(srv: LiveServer, client: httpx.Client,
                                                                     upgrade: dict[str, str]) -> None:
    """``curl --http2`` on an ``http://`` URL asks every request to switch to h2c (``Upgrade: h2c``): the switch is
    not made, and the tick is read whole and applied (it was answered 422 "request body is missing"). A POST is no
    WebSocket handshake (those are GET requests): it was left unanswered."""
    m = market("UPG")
    r = httpx.post(f"{srv.url}/neural/process", json=live_tick(m, now_ms()), headers=upgrade, timeout=10)
    assert r.status_code == 200 and r.json()["market_id"] == m, r.text
    assert client.get(f"/debug/markets/{m}/state", headers=AUTH).json()["market_id"] == m
    assert_no_error_logs(srv)


@pytest.mark.parametrize("path", ["/neural/process", "/neural/process/batch"])
def test_whitespace_after_a_header_value_is_not_part_of_it(srv: LiveServer, path: str) -> None:
    """``X-Market-ID: M \\t`` routes the market ``M`` (it was refused 422, "differs from the X-Market-ID header
    'M \\t'"), and ``X-Request-ID: ows-1 `` is kept as ``ows-1`` (it was replaced by a fresh id)."""
    m = market("OWS")
    tick_ = live_tick(m, now_ms())
    body = json.dumps(tick_ if path == "/neural/process" else {"ticks": [tick_]}).encode()
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json \t\r\n"
                  b"X-Market-ID: %s \t \r\nX-Request-ID: ows-1  \r\nContent-Length: %d\r\n\r\n"
                  % (path.encode(), m.encode(), len(body)) + body)
        answer, _ = read_until_closed(s, 10)
    status, headers, payload = parse_response(answer)
    assert status == 200 and headers["x-request-id"] == "ows-1", answer
    assert m in payload.decode() and json.loads(payload)["request_id"] == "ows-1"
