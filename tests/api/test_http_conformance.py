"""HTTP/1.1 as a client or proxy may speak it, against the protocol class and the real service over raw sockets.

* A client that half-closes its socket (shuts down its sending side) after its requests gets their answers
  (uvicorn closed the socket at the client's EOF: a tick was applied and its answer lost).
* A request whose framing or target the parser reads but RFC 9112 refuses (no ``Host`` in HTTP/1.1, two of them, a
  transfer coding other than ``chunked``, ``Transfer-Encoding`` in HTTP/1.0) is a JSON ``400 bad_request`` naming
  what is wrong, and the connection closes; so is one the parser refuses, with the parser's reason.
* An answer given before the request's body came (``Expect: 100-continue`` refused by its head: 413, 415) ends the
  connection (uvicorn kept reading for the body, so the client's next request was read as that body, unanswered).
* ``HEAD`` is answered on every ``GET`` route, as ``GET`` with no body (FastAPI's ``GET`` routes answered ``405``).
* The trailers of a chunked body are not headers; an HTTP/1.0 client gets no ``100 Continue`` and no ``101``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from typing import Any

import httpx
import pytest
from live_helpers import LiveServer, read_until_closed
from test_protocol_framing import Transport, answers, bodies, echo, request
from uvicorn.config import Config
from uvicorn.server import ServerState

from cerebellar_norse.api.protocol import guarded_protocol
from cerebellar_norse.api.schemas import ErrorOut


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def market(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def live_tick(market_id: str, ts: int) -> dict[str, Any]:
    return {"price": 100.0, "volume": 10.0, "timestamp": ts, "market_id": market_id}


def connected(app: Any) -> tuple[Any, Transport]:
    """The guarded protocol serving ``app`` on an in-memory transport (call inside a running event loop)."""
    protocol = guarded_protocol(30.0)(config=Config(app=app, lifespan="off", log_level="error"),
                                      server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport


async def feed(protocol: Any, reads: list[bytes]) -> None:
    """Each of ``reads`` as one socket read, the loop run a few times after each."""
    for data in reads:
        protocol.data_received(data)
        for _ in range(10):
            await asyncio.sleep(0)


def half_closed(data: bytes) -> tuple[bool | None, list[bytes], bool, bytes]:
    """Feed ``data`` while ``/slow`` waits, then the client's EOF, then let ``/slow`` answer: what
    ``eof_received`` returned, the bodies answered, whether the transport was closed, and what was written."""

    async def run() -> tuple[bool | None, bytes, bool]:
        release = asyncio.Event()

        async def app(scope: dict, receive: Any, send: Any) -> None:
            if scope.get("path") == "/slow":
                await release.wait()
            await echo(scope, receive, send)

        protocol, transport = connected(app)
        await feed(protocol, [data])
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


def chunked(version: bytes = b"1.1", coding: bytes = b"chunked", host: bytes = b"Host: x\r\n") -> bytes:
    return (b"POST /c HTTP/" + version + b"\r\n" + host + b"Transfer-Encoding: " + coding + b"\r\n\r\n"
            b"5\r\nhello\r\n0\r\n\r\n")


@pytest.mark.parametrize(("raw", "words"), [
    (b"GET /h HTTP/1.1\r\n\r\n", "an HTTP/1.1 request must have a Host header"),
    (b"GET /h HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "the request has 2 Host headers: one is required"),
    (b"GET /h HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n", "the request has 2 Host headers: one is required"),
    (b"GET /h HTTP/1.1\r\nHost: a b\r\n\r\n", "the Host header 'a b' is not a host with an optional port"),
    (b"GET /h HTTP/1.1\r\nHost: user@x:80\r\n\r\n", "the Host header 'user@x:80' is not a host"),
    (b"GET /h HTTP/1.0\r\nHost: x/y\r\n\r\n", "the Host header 'x/y' is not a host"),
    (chunked(coding=b"gzip, chunked"), "Transfer-Encoding 'gzip, chunked': chunked (once) is the only transfer coding"),
    (chunked(coding=b"gzip\r\nTransfer-Encoding: chunked"), "Transfer-Encoding 'gzip, chunked'"),
    (chunked(coding=b"chunked, chunked"), "the server could not parse it: Invalid `Transfer-Encoding` header value"),
    (chunked(version=b"1.0"), "an HTTP/1.0 request cannot have a Transfer-Encoding"),
    (b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
     "the server could not parse it: Duplicate Content-Length"),
    (b"GET /h HTTP/1.1\r\nHost: x\r\nX-A: a\r\n  folded\r\n\r\n", "the server could not parse it: Unexpected whitespace"),
    (b"OPTIONS http://x HTTP/1.1\r\nHost: x\r\n\r\n", "the request target 'http://x' names no path that can be read: send"),
    (b"CONNECT x:80 HTTP/1.1\r\nHost: x\r\n\r\n", "the request target 'x:80' names no path that can be read"),
    (b"GET http://x:99999/h HTTP/1.1\r\nHost: x\r\n\r\n", "or * with OPTIONS"),
], ids=["no host", "two hosts", "two hosts in 1.0", "host with a space", "host with userinfo", "host with a path",
        "gzip then chunked", "gzip and chunked on two lines",
        "chunked twice", "chunked in 1.0", "two lengths", "folded header", "absolute URL without a path",
        "authority form", "absolute URL with a bad port"])
def test_a_request_the_rfc_refuses_is_a_400_naming_why(raw: bytes, words: str) -> None:
    got = answers([raw + request("/after")])  # what follows on the connection is not read
    assert [status for status, _ in got] == [400], got
    err = ErrorOut.model_validate(json.loads(got[0][1])).error
    assert err.type == "bad_request" and words in err.message, err.message


@pytest.mark.parametrize("raw", [b"GET /h HTTP/1.0\r\n\r\n", chunked(coding=b"Chunked"), chunked(coding=b" chunked "),
                                 *(b"GET /h HTTP/1.1\r\nHost:" + host + b"\r\n\r\n" for host in
                                   (b"", b" example.com:8080 ", b"[::1]:80", b"10.0.0.1", b"my_host.local."))],
                         ids=["HTTP/1.0 without Host", "chunked in capitals", "chunked with spaces", "empty host",
                              "name and port", "IPv6 and port", "IPv4", "name with _ and final dot"])
def test_requests_the_rfc_allows_are_served(raw: bytes) -> None:
    assert [status for status, _ in answers([raw])] == [200]


def test_a_tick_the_rfc_refuses_changes_nothing(live: LiveServer, client: httpx.Client) -> None:
    """The tick of a refused request is not applied: its market holds no state, and no tick is counted."""
    m = market("NOHOST")
    body = json.dumps(live_tick(m, now_ms())).encode()
    before = client.get("/neural/metrics").json()["neural_metrics"]["ticks"]
    for head in (b"POST /neural/process HTTP/1.1\r\nContent-Length: %d\r\n" % len(body),
                 b"POST /neural/process HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: %d\r\n" % len(body)):
        chunk = hex(len(body))[2:].encode()
        for framing in (head, b"POST /neural/process HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n"):
            raw = framing + b"Content-Type: application/json\r\n\r\n"
            raw += (chunk + b"\r\n" + body + b"\r\n0\r\n\r\n") if b"chunked" in framing else body
            with socket.create_connection(("127.0.0.1", live.port)) as s:
                s.sendall(raw)
                answer, closed = read_until_closed(s, 10)
            head_part, _, err_body = answer.partition(b"\r\n\r\n")
            assert closed and head_part.startswith(b"HTTP/1.1 400 "), answer
            assert b"connection: close" in head_part.lower()
            assert json.loads(err_body)["error"]["type"] == "bad_request"
    assert client.get(f"/debug/markets/{m}/state").status_code == 404
    assert client.get("/neural/metrics").json()["neural_metrics"]["ticks"] == before


async def refuse_unread(scope: dict, receive: Any, send: Any) -> None:
    """``/refuse`` answers 415 without reading its body; other paths are :func:`echo`."""
    if scope["type"] == "http" and scope["path"] == "/refuse":
        await send({"type": "http.response.start", "status": 415, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    await echo(scope, receive, send)


def early_answer(reads: list[bytes]) -> tuple[bytes, bool]:
    """What is written for ``reads`` (each a socket read), and whether the protocol still reads the client."""

    async def run() -> tuple[bytes, bool]:
        protocol, transport = connected(refuse_unread)
        await feed(protocol, reads)
        reading = not protocol._refused and not transport.closed
        protocol.connection_lost(None)
        return transport.written, reading

    return asyncio.run(run())


def test_an_answer_before_the_body_came_ends_the_connection() -> None:
    head = b"POST /refuse HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
    written, reading = early_answer([head, request("/next")])  # no body: the client read the final answer
    assert written.startswith(b"HTTP/1.1 415 ") and written.count(b"HTTP/1.1 ") == 1, written
    assert b"connection: close" in written.lower() and b"100 Continue" not in written
    assert not reading  # what the client still sends is dropped, not read as a body or a request


def test_an_answer_after_the_whole_body_came_keeps_the_connection() -> None:
    written, reading = early_answer([b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", request("/next")])
    assert bodies(written) == [b"", b"/next 0"] and b"connection: close" not in written.lower()
    assert reading


def test_a_refused_expect_100_continue_ends_the_connection(live: LiveServer, client: httpx.Client) -> None:
    """curl and .NET send Expect: 100-continue before large bodies; the final answer to the head ends the connection,
    so a request sent next on it is not taken for the body."""
    before = client.get("/neural/metrics").json()["neural_metrics"]["ticks"]
    for ctype, length in ((b"text/plain", b"80"), (b"application/json", b"5000000")):
        with socket.create_connection(("127.0.0.1", live.port)) as s:
            s.sendall(b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
                      + length + b"\r\nExpect: 100-continue\r\n\r\n")
            answer, closed = read_until_closed(s, 5)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert closed, answer
        assert head.split(b" ")[1] in (b"413", b"415") and b"connection: close" in head.lower(), answer
        assert json.loads(body)["error"]["type"] in ("body_too_large", "unsupported_media_type")
    assert client.get("/neural/metrics").json()["neural_metrics"]["ticks"] == before


def test_a_body_over_the_limit_still_sent_gets_the_413_not_a_reset(live: LiveServer) -> None:
    body = b"[" + b"1," * 700_000 + b"1]"  # 1.4 MB, over the 1 MB default
    with socket.create_connection(("127.0.0.1", live.port)) as s:
        s.sendall(b"POST /neural/process/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        with contextlib.suppress(OSError):  # the server may have stopped reading meanwhile: what it got is enough
            s.sendall(body)
        answer, closed = read_until_closed(s, 10)
    assert closed and answer.startswith(b"HTTP/1.1 413 "), answer[:300]


VARYING = {"/health", "/metrics", "/neural/metrics", "/debug/backtrace"}  # bodies that change between two requests


def test_head_of_every_get_route_is_the_get_without_its_body(live: LiveServer, client: httpx.Client) -> None:
    m = market("HEAD")
    assert client.post("/neural/process", json=live_tick(m, now_ms())).status_code == 200
    doc = client.get("/openapi.json").json()
    fill = {"market_id": m, "request_id": "none-such", "job_id": "latest"}
    gets = [path for path, item in doc["paths"].items() if "get" in item]
    assert {path for path, item in doc["paths"].items() if "head" in item} == set(gets)
    for template in gets:
        path = template.format(**fill)
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code, path
        assert head.content == b"", path
        assert head.headers["content-length"], path
        for name in ("content-type", "content-length", "allow", "www-authenticate"):
            if name == "content-length" and template in VARYING:
                continue
            assert head.headers.get(name) == got.headers.get(name), (path, name)
    assert client.post("/neural/moves").headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize(("method", "path", "words"), [
    ("post", "/neural/process", ("market_moving", "the journal waits for a file descriptor", "queue is full")),
    ("post", "/neural/process/batch", ("market_moving", "the journal waits for a file descriptor", "queue is full")),
    ("delete", "/neural/markets/{market_id}", ("the journal waits for a file descriptor",)),
    ("put", "/neural/markets/{market_id}/state", ("the journal waits for a file descriptor",)),
    ("post", "/neural/markets/{market_id}/release", ("the journal waits for a file descriptor",)),
    ("post", "/models/{version}/activate", ("the journal waits for a file descriptor",)),
    ("put", "/models/{version}", ("no room in the state dir",)),
])
def test_the_document_names_the_503s_of_each_operation(client: httpx.Client, method: str, path: str,
                                                       words: tuple[str, ...]) -> None:
    """A tick of a moving market, or one refused while the journal waits for a descriptor, is a 503 with Retry-After:
    the operation's 503 says so (it said only: connections, queue, shutting down)."""
    described = client.get("/openapi.json").json()["paths"][path][method]["responses"]["503"]["description"]
    for word in words:
        assert word in described, described


def test_every_operation_declares_the_retry_after_of_its_503(client: httpx.Client) -> None:
    """At ``server.max_connections`` every request, ``/health`` included, is answered 503 ``capacity`` with
    ``Retry-After``: each operation's 503 declares the header (``/health``'s said so in words only, so a client generated
    from the document had no header to read)."""
    doc = client.get("/openapi.json").json()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            header = op["responses"]["503"].get("headers", {}).get("Retry-After")
            assert header is not None, (method, path)
            assert header["schema"]["type"] == "integer", (method, path)


HUGE = 10**400  # an integer no float holds: valid JSON, and up to 4,300 digits are read as a number
# the least valid JSON body of each operation that takes one (``{market}`` filled in), so that a number put in it is the
# only thing wrong; an operation with a JSON body that is missing here fails the test below
LEAST_BODIES: dict[tuple[str, str], Any] = {
    ("post", "/neural/process"): {"price": 100.0, "volume": 10.0, "timestamp": 1640995200000, "market_id": "{market}"},
    ("post", "/neural/process/batch"): {"ticks": [{"price": 100.0, "volume": 10.0, "timestamp": 1640995200000,
                                                   "market_id": "{market}"}]},
    ("post", "/training"): {"files": ["no-such-file.csv"]},
}


def _resolved(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _numeric(doc: dict[str, Any], schema: dict[str, Any]) -> bool:
    schema = _resolved(doc, schema)
    return schema.get("type") in ("integer", "number") or any(_numeric(doc, b) for b in schema.get("anyOf", ()))


def numeric_places(doc: dict[str, Any], schema: dict[str, Any], value: Any, place: tuple[str | int, ...] = ()
                   ) -> list[tuple[str | int, ...]]:
    """Where ``value`` (a body) holds or may hold a number, by its schema: each place a key or list index path."""
    schema = _resolved(doc, schema)
    if isinstance(value, list):
        return [p for k, item in enumerate(value) for p in numeric_places(doc, schema.get("items", {}), item, (*place, k))]
    out: list[tuple[str | int, ...]] = []
    for name, prop in schema.get("properties", {}).items():
        if _numeric(doc, prop):
            out.append((*place, name))
        elif isinstance(value, dict) and name in value:
            out += numeric_places(doc, prop, value[name], (*place, name))
    return out


def put_at(body: Any, place: tuple[str | int, ...], value: Any) -> Any:
    """A copy of ``body`` with ``value`` at ``place``."""
    out = json.loads(json.dumps(body))
    target = out
    for step in place[:-1]:
        target = target[step]
    target[place[-1]] = value
    return out


def test_a_number_no_float_holds_is_refused_naming_its_field_on_every_operation(live: LiveServer,
                                                                                client: httpx.Client) -> None:
    """Every number of every operation's JSON body or query, given as an integer of 401 digits, is a documented 4xx
    naming its field, and changes nothing: a tick's timestamp of that size was multiplied by a float to guess its unit
    (OverflowError): a 500 on the tick routes, and the stream closed with a traceback."""
    doc = client.get("/openapi.json").json()
    logged = len(live.log())
    checked = 0
    for path, item in doc["paths"].items():
        for method, op in item.items():
            documented = set(op["responses"])
            url = path.replace("{market_id}", "NOPE").replace("{request_id}", "nope").replace("{job_id}", "nope") \
                .replace("{version}", "nope")
            for param in op.get("parameters", []):
                if param["in"] == "query" and _numeric(doc, param["schema"]):
                    for value in (HUGE, -HUGE):
                        r = client.request(method, url, params={param["name"]: str(value)})
                        assert 400 <= r.status_code < 500 and str(r.status_code) in documented, (method, path, r.text)
                        checked += 1
            content = op.get("requestBody", {}).get("content", {})
            if "application/json" not in content:
                continue
            assert (method, path) in LEAST_BODIES, f"{method} {path}: add its least valid body to LEAST_BODIES"
            mid = market("HUGE")
            least = json.loads(json.dumps(LEAST_BODIES[method, path]).replace("{market}", mid))
            places = numeric_places(doc, content["application/json"]["schema"], least)
            assert places, (method, path)
            for place in places:
                for value in (HUGE, -HUGE):
                    r = client.request(method, url, json=put_at(least, place, value))
                    assert r.status_code == 422, (method, path, place, r.text)
                    assert r.json()["error"]["field"] == ".".join(map(str, place)), (method, path, r.text)
                    checked += 1
            assert client.get(f"/debug/markets/{mid}/state").status_code == 404  # nothing applied
    assert checked >= 20, checked
    assert "Traceback" not in live.log()[logged:]


async def headers_of(scope: dict, receive: Any, send: Any) -> None:
    """Answers the request's header names, after reading its body."""
    while (await receive()).get("more_body"):
        pass
    body = b",".join(name for name, _ in scope["headers"])
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


TRAILERS = b"Authorization: Bearer t\r\nX-Market-ID: OTHER\r\nX-Request-ID: from-trailer\r\nContent-Type: text/plain\r\n"


@pytest.mark.parametrize("split", [False, True], ids=["in one read", "trailers in a read of their own"])
def test_trailers_are_not_headers(split: bool) -> None:
    head = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n"
    reads = [head, TRAILERS + b"\r\n"] if split else [head + TRAILERS + b"\r\n"]

    async def run() -> bytes:
        protocol, transport = connected(headers_of)
        await feed(protocol, reads)
        protocol.connection_lost(None)
        return transport.written

    assert bodies(asyncio.run(run())) == [b"host,transfer-encoding"]


def test_a_trailer_names_no_market_and_no_request_id(live: LiveServer) -> None:
    m = market("TRAILER")
    body = json.dumps({"ticks": [live_tick(m, now_ms())]}).encode()
    with socket.create_connection(("127.0.0.1", live.port)) as s:
        s.sendall(b"POST /neural/process/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, TRAILERS))
        answer, _ = read_until_closed(s, 30)
    head, _, got = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), answer[:500]
    assert json.loads(got)["results"][0]["market_id"] == m
    assert b"from-trailer" not in answer


def test_an_http_1_0_client_gets_no_100_continue() -> None:
    head = b"POST /p HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
    written = answers_written([head, b"hello"])
    assert written.startswith(b"HTTP/1.1 200 ") and b"100 Continue" not in written, written
    assert b"100 Continue" in answers_written([head.replace(b"HTTP/1.0", b"HTTP/1.1\r\nHost: x"), b"hello"])


def answers_written(reads: list[bytes]) -> bytes:
    """Everything written for ``reads`` (each a socket read) to :func:`echo`."""

    async def run() -> bytes:
        protocol, transport = connected(echo)
        await feed(protocol, reads)
        protocol.connection_lost(None)
        return transport.written

    return asyncio.run(run())


def test_a_websocket_handshake_in_http_1_0_is_refused() -> None:
    handshake = (b"GET /neural/stream HTTP/1.0\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    got = answers([handshake])
    assert [status for status, _ in got] == [400], got
    assert "must be an HTTP/1.1 request" in json.loads(got[0][1])["error"]["message"]


def raw_exchange(live: LiveServer, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` (one request that asks to close), read the answer: status, headers (last of each), body."""
    host, port = live.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        raw, closed = read_until_closed(sock, 10)
    assert closed, raw
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def test_options_asterisk_says_what_the_server_supports(live: LiveServer, client: httpx.Client) -> None:
    """``OPTIONS *`` (RFC 9110, section 9.3.7: the server as a whole; a proxy's or monitor's ping) was a 404 naming
    the path '*'. It is a 200 with Allow and no content; '*' with another method is a 400 (RFC 9112, 3.2.4)."""
    status, headers, body = raw_exchange(live, b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 200 and body == b"", (status, body)
    assert headers["allow"] == "DELETE, GET, HEAD, OPTIONS, POST, PUT"
    assert headers["content-length"] == "0" and "content-type" not in headers and headers["x-request-id"]
    status, headers, body = raw_exchange(live, b"OPTIONS * HTTP/1.0\r\n\r\n")  # as a load balancer's check may send it
    assert status == 200 and headers["allow"].startswith("DELETE, GET")
    for method in (b"GET", b"POST", b"HEAD"):
        status, headers, body = raw_exchange(live, method + b" * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert status == 400, (method, status)
        if method != b"HEAD":
            error = ErrorOut.model_validate_json(body).error
            assert error.type == "bad_request" and "for OPTIONS only" in error.message, body
            assert error.request_id == headers["x-request-id"]
    assert client.options("/health").status_code == 405  # a path's OPTIONS is still refused with its Allow
    text = client.get("/metrics").text
    assert 'route="*"' in text and 'kind="bad_request"' in text
