"""The one-pass read of a plain request (:mod:`cerebellar_norse.api.plainhead`), alone and in the protocol.

* :func:`read_plain_request` on tables of requests: those it reads (the exact header fields and body offset it
  returns) and those it must leave to the HTTP parser (None), each with the reason.
* The same requests, and a few hundred seeded random ones made by mutating plain requests, sent in one read to a
  connection of the guarded protocol twice: once with a direct route whose target is the request's path (the
  one-pass read may take it), once with a route whose target is another path (the parser reads every request). The
  route's eligibility does not depend on its target, so both connections must offer the route the same scopes, have
  it take the same requests with the same bodies, hand the same requests to the app and write the same bytes
  (fresh request ids aside); the one-pass read must have been used exactly for the requests it accepts. Each is
  sent on a fresh connection, after a plain request answered on the same connection, and during a stop's drain.
* The connection around a request read in one pass: keep-alive goes on, a request read while an answer is pending
  is queued behind it, a stop's drain closes the connection, and the head limit and the route's own refusal send the
  request the parser's way.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from test_direct_route import ROUTE, FakeRoute, answers, post, server_state
from test_protocol_framing import PausingTransport
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cerebellar_norse.api.plainhead import read_plain_request
from cerebellar_norse.api.protocol import MAX_HEADER_BYTES, Reply, guarded_protocol

LINE = b"POST " + ROUTE + b" HTTP/1.1\r\n"
ELSEWHERE = b"/elsewhere"  # a route target no request below names: the parser reads them all
Headers = list[tuple[bytes, bytes]]


def req(*fields: bytes, body: bytes = b"tick", line: bytes = LINE) -> bytes:
    """A request: ``line``, each of ``fields`` on its own CRLF line, the empty line, ``body``."""
    return line + b"".join(f + b"\r\n" for f in fields) + b"\r\n" + body


def big_value(size: int) -> bytes:
    """The value of ``X-Big`` that makes :func:`head_of`'s head ``size`` bytes."""
    return b"b" * (size - len(req(b"Host: x", b"Content-Length: 4", b"X-Big: ", body=b"")))


def head_of(size: int) -> bytes:
    """A plain request whose request line and headers take exactly ``size`` bytes (one header filled), body ``tick``."""
    out = req(b"Host: x", b"Content-Length: 4", b"X-Big: " + big_value(size))
    assert len(out) - 4 == size
    return out


# -- read_plain_request's tables ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plain:
    """A request the one-pass read takes: the header fields it must return, and the body."""

    id: str
    data: bytes
    headers: Headers
    body: bytes = b"tick"


HTTPX = req(b"Host: 127.0.0.1:8000", b"Accept: */*", b"Accept-Encoding: gzip, deflate", b"Connection: keep-alive",
            b"User-Agent: python-httpx/0.28.1", b"Content-Length: 4", b"Content-Type: application/json",
            b"X-Request-ID: ord-1")
VISIBLE_PUNCTUATION = b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"

ACCEPTED = [
    Plain("minimal", req(b"Host: x", b"Content-Length: 4"), [(b"host", b"x"), (b"content-length", b"4")]),
    Plain("several headers (httpx)", HTTPX,
          [(b"host", b"127.0.0.1:8000"), (b"accept", b"*/*"), (b"accept-encoding", b"gzip, deflate"),
           (b"connection", b"keep-alive"), (b"user-agent", b"python-httpx/0.28.1"), (b"content-length", b"4"),
           (b"content-type", b"application/json"), (b"x-request-id", b"ord-1")]),
    Plain("spaces and tabs inside values", req(b"Host: x", b"User-Agent: Mozilla/5.0 (X11; Linux x86_64)",
                                               b"X-A: a  \t b", b"Content-Length: 4"),
          [(b"host", b"x"), (b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64)"), (b"x-a", b"a  \t b"),
           (b"content-length", b"4")]),
    Plain("whitespace around values", req(b"Host:\t x \t", b"Content-Length:   4  ", b"X-A:\tv\t"),
          [(b"host", b"x"), (b"content-length", b"4"), (b"x-a", b"v")]),
    Plain("no space after the colon", req(b"Host:x", b"Content-Length:4"), [(b"host", b"x"), (b"content-length", b"4")]),
    Plain("upper and mixed case names", req(b"HOST: x", b"content-LENGTH: 4", b"X-MiXeD: VaLuE"),
          [(b"host", b"x"), (b"content-length", b"4"), (b"x-mixed", b"VaLuE")]),
    Plain("Connection: Keep-Alive", req(b"Host: x", b"Connection: Keep-Alive", b"Content-Length: 4"),
          [(b"host", b"x"), (b"connection", b"Keep-Alive"), (b"content-length", b"4")]),
    Plain("CONNECTION: KEEP-ALIVE twice", req(b"CONNECTION: KEEP-ALIVE", b"Host: x", b"connection: keep-alive",
                                             b"Content-Length: 4"),
          [(b"connection", b"KEEP-ALIVE"), (b"host", b"x"), (b"connection", b"keep-alive"), (b"content-length", b"4")]),
    Plain("empty header values", req(b"X-Empty:", b"Host: x", b"X-Blank:  \t ", b"Content-Length: 4"),
          [(b"x-empty", b""), (b"host", b"x"), (b"x-blank", b""), (b"content-length", b"4")]),
    Plain("Host [::1]:8080", req(b"Host: [::1]:8080", b"Content-Length: 4"),
          [(b"host", b"[::1]:8080"), (b"content-length", b"4")]),
    Plain("Host example.com", req(b"Host: example.com", b"Content-Length: 4"),
          [(b"host", b"example.com"), (b"content-length", b"4")]),
    Plain("Host with an empty port", req(b"Host: example.com:", b"Content-Length: 4"),
          [(b"host", b"example.com:"), (b"content-length", b"4")]),
    Plain("Host IPv4 and port", req(b"Host: 10.0.0.1:80", b"Content-Length: 4"),
          [(b"host", b"10.0.0.1:80"), (b"content-length", b"4")]),
    Plain("empty Host", req(b"Host:", b"Content-Length: 4"), [(b"host", b""), (b"content-length", b"4")]),
    Plain("Content-Length with leading zeros", req(b"Host: x", b"Content-Length: 0004"),
          [(b"host", b"x"), (b"content-length", b"0004")]),
    Plain("Content-Length of 18 digits", req(b"Host: x", b"Content-Length: 000000000000000004"),
          [(b"host", b"x"), (b"content-length", b"000000000000000004")]),
    Plain("no body", req(b"Host: x", b"Content-Length: 0", body=b""), [(b"host", b"x"), (b"content-length", b"0")],
          b""),
    Plain("a body of any bytes", req(b"Host: x", b"Content-Length: 8", body=b"\r\n\r\n\xff\x00 \n"),
          [(b"host", b"x"), (b"content-length", b"8")], b"\r\n\r\n\xff\x00 \n"),
    Plain("every token character in a name", req(b"Host: x", b"X-!#$%&'*+.^_`|~09az: v", b"Content-Length: 4"),
          [(b"host", b"x"), (b"x-!#$%&'*+.^_`|~09az", b"v"), (b"content-length", b"4")]),
    Plain("every punctuation character in a value", req(b"Host: x", b"X-P: " + VISIBLE_PUNCTUATION, b"Content-Length: 4"),
          [(b"host", b"x"), (b"x-p", VISIBLE_PUNCTUATION), (b"content-length", b"4")]),
    Plain("Proxy-Connection: keep-alive", req(b"Host: x", b"Proxy-Connection: keep-alive", b"Content-Length: 4"),
          [(b"host", b"x"), (b"proxy-connection", b"keep-alive"), (b"content-length", b"4")]),
    Plain("names that only begin like framing fields", req(b"Host: x", b"Content-Length-X: 9", b"Transfer-Encodings: gzip",
                                                           b"Hosts: a b", b"Content-Length: 4"),
          [(b"host", b"x"), (b"content-length-x", b"9"), (b"transfer-encodings", b"gzip"), (b"hosts", b"a b"),
           (b"content-length", b"4")]),
]

REJECTED: list[tuple[str, bytes]] = [
    ("no Host", req(b"Content-Length: 4")),
    ("two Hosts", req(b"Host: x", b"Host: y", b"Content-Length: 4")),
    ("two equal Hosts", req(b"Host: x", b"Content-Length: 4", b"host: x")),
    ("Host 'a b'", req(b"Host: a b", b"Content-Length: 4")),
    ("Host user@host", req(b"Host: user@host", b"Content-Length: 4")),
    ("Host with a path", req(b"Host: host/path", b"Content-Length: 4")),
    ("Host with a port that is not a number", req(b"Host: host:http", b"Content-Length: 4")),
    ("Host with an unclosed bracket", req(b"Host: [::1", b"Content-Length: 4")),
    ("no Content-Length", req(b"Host: x")),
    ("no Content-Length and no body", req(b"Host: x", body=b"")),
    ("two Content-Lengths", req(b"Host: x", b"Content-Length: 4", b"Content-Length: 4")),
    ("Content-Length not a number", req(b"Host: x", b"Content-Length: 4a")),
    ("Content-Length in hex", req(b"Host: x", b"Content-Length: 0x4")),
    ("Content-Length signed +", req(b"Host: x", b"Content-Length: +4")),
    ("Content-Length signed -", req(b"Host: x", b"Content-Length: -4")),
    ("Content-Length with a space inside", req(b"Host: x", b"Content-Length: 4 4")),
    ("Content-Length empty", req(b"Host: x", b"Content-Length:", body=b"")),
    ("Content-Length list", req(b"Host: x", b"Content-Length: 4, 4")),
    ("Content-Length of 19 digits", req(b"Host: x", b"Content-Length: 0000000000000000004")),
    ("Content-Length over 2**64", req(b"Host: x", b"Content-Length: 99999999999999999999")),
    ("body shorter than Content-Length", req(b"Host: x", b"Content-Length: 5")),
    ("no body yet", req(b"Host: x", b"Content-Length: 4", body=b"")),
    ("head not complete", req(b"Host: x", b"Content-Length: 4", body=b"")[:-2]),
    ("head cut inside a field", LINE + b"Host: x\r\nContent-Len"),
    ("request line only", LINE),
    ("bytes after the body: a second request", req(b"Host: x", b"Content-Length: 4") + req(b"Host: x", b"Content-Length: 4")),
    ("bytes after the body: part of a request", req(b"Host: x", b"Content-Length: 4") + LINE + b"Host: x\r\n"),
    ("bytes after the body: CRLF", req(b"Host: x", b"Content-Length: 4") + b"\r\n"),
    ("bytes after the body: one byte", req(b"Host: x", b"Content-Length: 4", body=b"ticks")),
    ("Transfer-Encoding chunked", req(b"Host: x", b"Transfer-Encoding: chunked", body=b"4\r\ntick\r\n0\r\n\r\n")),
    ("Transfer-Encoding and Content-Length", req(b"Host: x", b"Transfer-Encoding: chunked", b"Content-Length: 4")),
    ("Transfer-Encoding identity", req(b"Host: x", b"Transfer-Encoding: identity", b"Content-Length: 4")),
    ("Expect: 100-continue", req(b"Host: x", b"Expect: 100-continue", b"Content-Length: 4")),
    ("Expect of another kind", req(b"Host: x", b"expect: something", b"Content-Length: 4")),
    ("Upgrade h2c", req(b"Host: x", b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c", b"HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA",
                        b"Content-Length: 4")),
    ("Upgrade alone", req(b"Host: x", b"Upgrade: websocket", b"Content-Length: 4")),
    ("TE", req(b"Host: x", b"TE: trailers", b"Content-Length: 4")),
    ("Trailer", req(b"Host: x", b"Trailer: X-Sum", b"Content-Length: 4")),
    ("Keep-Alive header", req(b"Host: x", b"Connection: keep-alive", b"Keep-Alive: timeout=5", b"Content-Length: 4")),
    ("Connection: close", req(b"Host: x", b"Connection: close", b"Content-Length: 4")),
    ("Connection: upgrade", req(b"Host: x", b"Connection: upgrade", b"Content-Length: 4")),
    ("Connection: keep-alive, close", req(b"Host: x", b"Connection: keep-alive, close", b"Content-Length: 4")),
    ("Connection keep-alive then close", req(b"Host: x", b"Connection: keep-alive", b"Connection: close",
                                             b"Content-Length: 4")),
    ("Connection empty", req(b"Host: x", b"Connection:", b"Content-Length: 4")),
    ("Connection: TE", req(b"Host: x", b"Connection: TE", b"Content-Length: 4")),
    ("Proxy-Connection: close", req(b"Host: x", b"Proxy-Connection: close", b"Content-Length: 4")),
    ("Proxy-Connection: keep-alive, close", req(b"Host: x", b"Proxy-Connection: keep-alive, close",
                                               b"Content-Length: 4")),
    ("HTTP/1.0", req(b"Host: x", b"Content-Length: 4", line=b"POST /direct HTTP/1.0\r\n")),
    ("HTTP/1.0 keep-alive", req(b"Host: x", b"Connection: keep-alive", b"Content-Length: 4",
                                line=b"POST /direct HTTP/1.0\r\n")),
    ("HTTP/2.0", req(b"Host: x", b"Content-Length: 4", line=b"POST /direct HTTP/2.0\r\n")),
    ("lowercase method", req(b"Host: x", b"Content-Length: 4", line=b"post /direct HTTP/1.1\r\n")),
    ("another method", req(b"Host: x", b"Content-Length: 4", line=b"PUT /direct HTTP/1.1\r\n")),
    ("another path", req(b"Host: x", b"Content-Length: 4", line=b"POST /other HTTP/1.1\r\n")),
    ("a longer path", req(b"Host: x", b"Content-Length: 4", line=b"POST /directory HTTP/1.1\r\n")),
    ("a trailing slash", req(b"Host: x", b"Content-Length: 4", line=b"POST /direct/ HTTP/1.1\r\n")),
    ("the path percent-encoded", req(b"Host: x", b"Content-Length: 4", line=b"POST /di%72ect HTTP/1.1\r\n")),
    ("query string", req(b"Host: x", b"Content-Length: 4", line=b"POST /direct?x=1 HTTP/1.1\r\n")),
    ("empty query string", req(b"Host: x", b"Content-Length: 4", line=b"POST /direct? HTTP/1.1\r\n")),
    ("absolute form", req(b"Host: x", b"Content-Length: 4", line=b"POST http://x/direct HTTP/1.1\r\n")),
    ("two spaces in the request line", req(b"Host: x", b"Content-Length: 4", line=b"POST  /direct HTTP/1.1\r\n")),
    ("empty line before the request", b"\r\n" + req(b"Host: x", b"Content-Length: 4")),
    ("LF-only line ends", b"POST /direct HTTP/1.1\nHost: x\nContent-Length: 4\n\ntick"),
    ("one LF-only line end", req(b"Host: x\nX-A: v", b"Content-Length: 4")),
    ("LF-only request line", req(b"Host: x", b"Content-Length: 4", line=b"POST /direct HTTP/1.1\n")),
    ("obs-fold continuation line", req(b"Host: x", b"X-A: v", b" folded", b"Content-Length: 4")),
    ("tab continuation line", req(b"Host: x", b"X-A: v", b"\tfolded", b"Content-Length: 4")),
    ("whitespace before the first field", req(b" Host: x", b"Content-Length: 4")),
    ("space before the colon", req(b"Host : x", b"Content-Length: 4")),
    ("tab before the colon", req(b"Host: x", b"Content-Length\t: 4")),
    ("empty name", req(b"Host: x", b": v", b"Content-Length: 4")),
    ("no colon", req(b"Host: x", b"X-A", b"Content-Length: 4")),
    ("byte >= 0x80 in a value", req(b"Host: x", b"X-A: caf\xc3\xa9", b"Content-Length: 4")),
    ("byte 0xff in a value", req(b"Host: x", b"X-A: \xff", b"Content-Length: 4")),
    ("byte >= 0x80 in a name", req(b"Host: x", b"X-\xe9: v", b"Content-Length: 4")),
    ("control byte in a value", req(b"Host: x", b"X-A: a\x01b", b"Content-Length: 4")),
    ("escape in a value", req(b"Host: x", b"X-A: \x1b[31m", b"Content-Length: 4")),
    ("DEL in a value", req(b"Host: x", b"X-A: a\x7f", b"Content-Length: 4")),
    ("NUL in a value", req(b"Host: x", b"X-A: a\x00b", b"Content-Length: 4")),
    ("NUL in a name", req(b"Host: x", b"X-\x00A: v", b"Content-Length: 4")),
    ("bare CR in a value", req(b"Host: x", b"X-A: a\rb", b"Content-Length: 4")),
    ("a separator in a name", req(b"Host: x", b"X(A): v", b"Content-Length: 4")),
    ("a form feed around a value", req(b"Host: x", b"X-A:\x0cv", b"Content-Length: 4")),
]

# over the limit (in the protocol: MAX_HEADER_BYTES; in the unit table: a small max_head)
TOO_LARGE = ("head longer than the limit", head_of(MAX_HEADER_BYTES + 1))
AT_LIMIT = Plain("head exactly at the limit", head_of(MAX_HEADER_BYTES),
                 [(b"host", b"x"), (b"content-length", b"4"), (b"x-big", big_value(MAX_HEADER_BYTES))])


@pytest.mark.parametrize("case", [*ACCEPTED, AT_LIMIT], ids=lambda c: c.id)
def test_a_plain_request_is_read_with_its_fields_and_body(case: Plain) -> None:
    got = read_plain_request(case.data, LINE, MAX_HEADER_BYTES)
    assert got is not None
    headers, offset = got
    assert headers == case.headers
    assert offset == len(case.data) - len(case.body)
    assert case.data[offset:] == case.body


@pytest.mark.parametrize(("reason", "data"), [*REJECTED, TOO_LARGE], ids=[r for r, _ in [*REJECTED, TOO_LARGE]])
def test_anything_else_is_left_to_the_parser(reason: str, data: bytes) -> None:
    assert read_plain_request(data, LINE, MAX_HEADER_BYTES) is None


def test_the_head_limit_counts_the_request_line_and_the_empty_line() -> None:
    data = req(b"Host: x", b"Content-Length: 4")
    head = len(data) - 4
    assert read_plain_request(data, LINE, head) is not None
    assert read_plain_request(data, LINE, head - 1) is None


def test_the_request_line_is_the_one_given() -> None:
    data = req(b"Host: x", b"Content-Length: 4", line=b"POST /a%20b HTTP/1.1\r\n")
    assert read_plain_request(data, b"POST /a%20b HTTP/1.1\r\n", MAX_HEADER_BYTES) == (
        [(b"host", b"x"), (b"content-length", b"4")], len(data) - 4)
    assert read_plain_request(data, LINE, MAX_HEADER_BYTES) is None


# -- the same requests both ways through the protocol ---------------------------------------------------------------

Seen = tuple[str, str, bytes, bytes, str, tuple[tuple[bytes, bytes], ...]]
ROUNDS = 12  # loop rounds after each read and after the connection is lost
FRESH_ID = re.compile(rb"[0-9a-f]{32}")


def seen(scope: Any) -> Seen:
    """What a route or app sees of a request's scope."""
    return (scope["method"], scope["path"], scope["raw_path"], scope["query_string"], scope["http_version"],
            tuple((bytes(k), bytes(v)) for k, v in scope["headers"]))


class RecordingRoute:
    """Takes every ``POST`` to ``path`` (whatever its ``target``, the path the one-pass read looks for); notes every
    scope it is offered and every request it takes, and answers with the request as it saw it."""

    def __init__(self, path: bytes, target: bytes) -> None:
        self.path = path
        self.target = target
        self.offers: list[Seen] = []
        self.calls: list[tuple[Seen, bytes]] = []

    def eligible(self, scope: Any) -> bool:
        self.offers.append(seen(scope))
        return bool(scope["raw_path"] == self.path and scope["method"] == "POST")

    def answer(self, scope: Any, body: bytes, reply: Reply) -> None:
        call = (seen(scope), bytes(body))
        self.calls.append(call)
        out = b"route " + repr(call).encode()
        reply(200, [(b"content-type", b"text/plain"), (b"content-length", str(len(out)).encode())], out)


class EchoApp:
    """The ASGI app for requests the route does not take: answers with the request as it saw it (None for a body
    whose end did not come)."""

    def __init__(self) -> None:
        self.requests: list[tuple[Seen, bytes | None]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body: bytes | None = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                body = None
                break
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.requests.append((seen(scope), body))
        if body is None:
            return
        out = b"app " + repr(self.requests[-1]).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})


def counting(base: type[HttpToolsProtocol]) -> type[HttpToolsProtocol]:
    """``base`` counting the heads the HTTP parser completed (``heads``): none for a request read in one pass."""

    def on_headers_complete(self: Any) -> None:
        self.heads += 1
        base.on_headers_complete(self)

    return type("Counting" + base.__name__, (base,), {"heads": 0, "on_headers_complete": on_headers_complete})


class Connection:
    """One connection of the guarded protocol (a fake transport), driven from a running loop."""

    def __init__(self, route: Any, app: Callable[..., Any], draining: Callable[[], bool] | None = None,
                 root_path: str = "") -> None:
        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            await app(scope, receive, send)

        protocol_class = counting(guarded_protocol(30.0, draining=draining, direct=route))
        self.protocol: Any = cast(Any, protocol_class(
            config=Config(app=asgi, lifespan="off", log_level="error", root_path=root_path),
            server_state=server_state(), app_state={}, _loop=asyncio.get_running_loop()))  # (with ``heads``)
        self.transport = PausingTransport()
        self.protocol.connection_made(self.transport)

    async def read(self, data: bytes) -> None:
        self.protocol.data_received(data)
        for _ in range(ROUNDS):
            await asyncio.sleep(0)

    async def lose(self) -> None:
        self.protocol.connection_lost(None)
        for _ in range(ROUNDS):
            await asyncio.sleep(0)

    @property
    def heads(self) -> int:
        return int(self.protocol.heads)


@dataclass
class Outcome:
    """What one connection did with the read under test: everything but ``heads`` and ``taken`` must be the same both
    ways (``heads``: heads the parser completed in that read; ``taken``: requests the route took in it)."""

    written: bytes  # fresh request ids replaced
    closed: bool  # the transport closed before the connection was lost
    paused: bool  # reading paused before the connection was lost
    offers: list[Seen]
    calls: list[tuple[Seen, bytes]]
    app: list[tuple[Seen, bytes | None]]
    tasks_left: int
    heads: int = field(compare=False)
    taken: int = field(compare=False)


# How the connection stands when the read under test comes: fresh; after a plain request answered on it (kept
# alive); fresh, with a stop's drain under way.
MODES = ["fresh", "after a request", "draining"]


async def one_read(data: bytes, path: bytes, target: bytes, root_path: str = "", mode: str = "fresh") -> Outcome:
    """``data`` in one read on a connection (``mode``) whose route takes ``POST path`` and has ``target``; the loop
    runs a few rounds, the connection is lost, the loop runs a few more."""
    route, app = RecordingRoute(root_path.encode() + path, target), EchoApp()
    conn = Connection(route, app, draining=(lambda: True) if mode == "draining" else None, root_path=root_path)
    if mode == "after a request":
        await conn.read(req(b"Host: x", b"Content-Length: 6", body=b"before", line=b"POST " + path + b" HTTP/1.1\r\n"))
        assert len(route.calls) == 1 and not conn.transport.closed
    heads, calls = conn.heads, len(route.calls)
    await conn.read(data)
    closed, paused = conn.transport.closed, conn.transport.paused
    await conn.lose()
    return Outcome(FRESH_ID.sub(b"<fresh id>", conn.transport.written), closed, paused, route.offers, route.calls,
                   app.requests, len(conn.protocol.tasks), conn.heads - heads, len(route.calls) - calls)


async def both_ways(data: bytes, path: bytes = ROUTE, root_path: str = "",
                    mode: str = "fresh") -> tuple[Outcome, Outcome, bool]:
    """``data`` read with the one-pass read possible and with the parser only; and whether the one-pass read
    accepts it (its route takes every ``POST`` to ``path``)."""
    one_pass = await one_read(data, path, path, root_path, mode)
    parser = await one_read(data, path, ELSEWHERE, root_path, mode)
    plain = read_plain_request(data, b"POST " + path + b" HTTP/1.1\r\n", MAX_HEADER_BYTES) is not None
    return one_pass, parser, plain


def differences(data: bytes, one_pass: Outcome, parser: Outcome, plain: bool) -> list[str]:
    """What is wrong with the two ways' outcomes for ``data`` (nothing: an empty list)."""
    out = []
    if one_pass != parser:
        out.append(f"{data!r}:\n  one pass: {one_pass}\n  parser:   {parser}")
    if one_pass.tasks_left or parser.tasks_left:
        out.append(f"{data!r}: tasks still running after the connection was lost")
    if plain and (one_pass.heads != 0 or one_pass.taken != 1):
        out.append(f"{data!r}: plain, but not read in one pass (heads {one_pass.heads}, taken {one_pass.taken})")
    if not plain and one_pass.heads != parser.heads:
        out.append(f"{data!r}: not plain, but the heads the parser read differ ({one_pass.heads}, {parser.heads})")
    if parser.taken and parser.heads == 0:
        out.append(f"{data!r}: the route took a request that the parser did not read")
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", [*ACCEPTED, AT_LIMIT], ids=lambda c: c.id)
def test_a_request_read_in_one_pass_is_seen_and_answered_as_the_parser_would(case: Plain, mode: str) -> None:
    one_pass, parser, plain = asyncio.run(both_ways(case.data, mode=mode))
    assert plain
    assert differences(case.data, one_pass, parser, plain) == []
    assert one_pass.heads == 0 and parser.heads == 1
    assert one_pass.calls[-1] == (one_pass.offers[-1], case.body)
    assert one_pass.offers[-1][5] == tuple(case.headers)
    assert one_pass.written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert one_pass.closed == (mode == "draining")  # kept alive, but for the drain


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("reason", "data"), [*REJECTED, TOO_LARGE], ids=[r for r, _ in [*REJECTED, TOO_LARGE]])
def test_a_request_left_to_the_parser_is_answered_the_same_either_way(reason: str, data: bytes, mode: str) -> None:
    one_pass, parser, plain = asyncio.run(both_ways(data, mode=mode))
    assert not plain
    assert differences(data, one_pass, parser, plain) == []


@pytest.mark.parametrize(("path", "root_path"), [(b"/a%20b", ""), (b"/%E2%82%AC", ""), (ROUTE, "/svc"), (b"/a%2Fb", "/svc")])
def test_a_route_with_an_encoded_path_or_under_a_root_path_sees_the_same_scope(path: bytes, root_path: str) -> None:
    data = req(b"Host: x", b"X-A: v", b"Content-Length: 4", line=b"POST " + path + b" HTTP/1.1\r\n")
    one_pass, parser, plain = asyncio.run(both_ways(data, path, root_path))
    assert plain
    assert differences(data, one_pass, parser, plain) == []
    assert one_pass.heads == 0 and one_pass.taken == 1


# -- random requests: plain ones, and plain ones with something changed --------------------------------------------

FUZZ_CASES = 400
FUZZ_SEED = 20_240_611
VISIBLE = bytes(range(0x21, 0x7F))
TOKEN_CHARS = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
HOSTS = [b"x", b"example.com", b"example.com:8080", b"127.0.0.1:8000", b"[::1]", b"[::1]:8080", b"", b"a-b.c_d~e",
         b"h:", b"[v1.x]:1"]
SAFE_NAMES = [b"Accept", b"Accept-Encoding", b"User-Agent", b"Content-Type", b"X-Request-ID", b"X-Market-ID",
              b"Authorization", b"Cookie", b"Via", b"Content-Encoding", b"Date", b"Connectionx"]
BODIES = [b"", b"tick", b'{"market": "BTC", "ticks": 1}', b"\r\n\r\n", b"POST /direct HTTP/1.1\r\n\r\n"]
WHITESPACE = [b"", b"", b" ", b" ", b"  ", b"\t", b" \t", b"\t "]
# bytes that no field name or value may hold (CR and LF end a line: they break it instead)
BAD_VALUE_BYTES = [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F, *range(0x80, 0x100), 0x0D, 0x0A]
BAD_NAME_BYTES = [*BAD_VALUE_BYTES, 0x20, 0x09, *b"\"(),/;<=>?@[\\]{}"]


@dataclass
class Field:
    name: bytes
    value: bytes
    before: bytes = b" "  # whitespace between the colon and the value
    after: bytes = b""  # whitespace after the value
    colon: bytes = b":"
    eol: bytes = b"\r\n"

    def render(self) -> bytes:
        return self.name + self.colon + self.before + self.value + self.after + self.eol


@dataclass
class Shape:
    """A request to build: its request line's parts, fields, body, and what is done to its bytes."""

    fields: list[Field]
    body: bytes
    method: bytes = b"POST"
    target: bytes = ROUTE
    version: bytes = b"HTTP/1.1"
    line_end: bytes = b"\r\n"
    lead: bytes = b""  # before the request line
    tail: bytes = b""  # after the body
    cut: int | None = None  # the bytes kept

    def render(self) -> bytes:
        out = (self.lead + self.method + b" " + self.target + b" " + self.version + self.line_end
               + b"".join(f.render() for f in self.fields) + b"\r\n" + self.body + self.tail)
        return out if self.cut is None else out[:self.cut]


def words(rng: random.Random) -> bytes:
    """A field value: up to three words of visible ASCII, with spaces or tabs between them."""
    out = b""
    for k in range(rng.randint(0, 3)):
        out += rng.choice([b" ", b"\t", b"  ", b" \t "]) if k else b""
        out += bytes(rng.choice(VISIBLE) for _ in range(rng.randint(1, 8)))
    return out


def any_case(rng: random.Random, name: bytes) -> bytes:
    return bytes(c ^ 0x20 if 0x61 <= (c | 0x20) <= 0x7A and rng.random() < 0.3 else c for c in name)


def plain_shape(rng: random.Random) -> Shape:
    """A plain request: Host, Content-Length (maybe zero-padded), up to five other fields, maybe Connection:
    keep-alive, all shuffled, in any case and with any whitespace around their values."""
    body = rng.choice([*BODIES, bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))])
    length = str(len(body)).encode()
    if rng.random() < 0.2:
        length = length.rjust(rng.randint(len(length), 18), b"0")
    fields = [Field(b"Host", rng.choice(HOSTS)), Field(b"Content-Length", length)]
    for _ in range(rng.randint(0, 5)):
        name = rng.choice(SAFE_NAMES) if rng.random() < 0.5 else b"X-" + bytes(
            rng.choice(TOKEN_CHARS) for _ in range(rng.randint(1, 10)))
        fields.append(Field(name, words(rng)))
    if rng.random() < 0.3:
        fields.append(Field(b"Connection", rng.choice([b"keep-alive", b"Keep-Alive", b"KEEP-ALIVE"])))
    rng.shuffle(fields)
    for f in fields:
        f.name = any_case(rng, f.name)
        f.before, f.after = rng.choice(WHITESPACE), rng.choice(WHITESPACE)
    return Shape(fields, body)


def named(rng: random.Random, shape: Shape, name: bytes) -> Field:
    """The field ``name`` of ``shape`` (added where a change before dropped it)."""
    found = [f for f in shape.fields if f.name.lower() == name]
    if found:
        return found[0]
    added = Field(name, b"")
    shape.fields.insert(rng.randint(0, len(shape.fields)), added)
    return added


def drop(name: bytes) -> Callable[[random.Random, Shape], None]:
    def change(rng: random.Random, shape: Shape) -> None:
        shape.fields = [f for f in shape.fields if f.name.lower() != name]
    return change


def twice(name: bytes) -> Callable[[random.Random, Shape], None]:
    def change(rng: random.Random, shape: Shape) -> None:
        f = named(rng, shape, name)
        value = rng.choice(HOSTS) if name == b"host" else f.value
        shape.fields.insert(rng.randint(0, len(shape.fields)), Field(any_case(rng, name), value))
    return change


def bad_host(rng: random.Random, shape: Shape) -> None:
    named(rng, shape, b"host").value = rng.choice([b"a b", b"user@host", b"host/path", b"h:p", b"[::1", b"a\tb", b"h?q"])


def bad_length(rng: random.Random, shape: Shape) -> None:
    f = named(rng, shape, b"content-length")
    n = len(shape.body)
    f.value = rng.choice([str(n + 1).encode(), str(n - 1).encode(), b"+%d" % n, b"-%d" % n, b"0x%x" % n,
                          b"%d %d" % (n, n), b"%d,%d" % (n, n), b"", b"%019d" % n, b"%de0" % n, b"1" * 20])


def framing_field(rng: random.Random, shape: Shape) -> None:
    name, value = rng.choice([(b"Transfer-Encoding", b"chunked"), (b"Transfer-Encoding", b"gzip"),
                              (b"Transfer-Encoding", b"identity"), (b"Expect", b"100-continue"), (b"Expect", b"x"),
                              (b"Upgrade", b"h2c"), (b"Upgrade", b"websocket"), (b"TE", b"trailers"),
                              (b"Trailer", b"X-Sum"), (b"Keep-Alive", b"timeout=5")])
    shape.fields.insert(rng.randint(0, len(shape.fields)), Field(any_case(rng, name), value))


def other_connection(rng: random.Random, shape: Shape) -> None:
    value = rng.choice([b"close", b"Close", b"upgrade", b"keep-alive, close", b"Keep-Alive,Upgrade", b"", b"foo",
                        b"keep-alive x", b"TE"])
    shape.fields.insert(rng.randint(0, len(shape.fields)), Field(any_case(rng, b"Connection"), value))


def bad_value_byte(rng: random.Random, shape: Shape) -> None:
    f = rng.choice(shape.fields)
    k = rng.randint(0, len(f.value))
    f.value = f.value[:k] + bytes([rng.choice(BAD_VALUE_BYTES)]) + f.value[k:]


def bad_name_byte(rng: random.Random, shape: Shape) -> None:
    named_fields = [f for f in shape.fields if f.name]  # (a continuation line added before has none)
    if not named_fields:
        return
    f = rng.choice(named_fields)
    k = rng.randint(1, len(f.name))  # (not first: whitespace there is a continuation line, tested on its own)
    f.name = f.name[:k] + bytes([rng.choice(BAD_NAME_BYTES)]) + f.name[k:]


def space_before_colon(rng: random.Random, shape: Shape) -> None:
    rng.choice(shape.fields).colon = rng.choice([b" :", b"\t:", b"  :"])


def continuation(rng: random.Random, shape: Shape) -> None:
    line = Field(b"", rng.choice([b"more", b"a b", b""]), before=rng.choice([b" ", b"\t", b"  "]), colon=b"")
    shape.fields.insert(rng.randint(0, len(shape.fields)), line)


def lf_only(rng: random.Random, shape: Shape) -> None:
    if rng.random() < 0.3:
        shape.line_end = b"\n"
    for f in shape.fields:
        if rng.random() < 0.5 or f is shape.fields[-1]:
            f.eol = b"\n"


def request_line(rng: random.Random, shape: Shape) -> None:
    part = rng.randrange(3)
    if part == 0:
        shape.method = rng.choice([b"post", b"Post", b"PUT", b"PATCH", b"POST ", b"DELETE"])
    elif part == 1:
        shape.target = rng.choice([b"/other", b"/direct?x=1", b"/direct?", b"/direct/", b"/directory", b"/Direct",
                                   b"http://x/direct", b"/direct#f", b"/di%72ect", b"*", b"//direct", b"/direct%20"])
    else:
        shape.version = rng.choice([b"HTTP/1.0", b"HTTP/1.2", b"HTTP/2.0", b"http/1.1", b"HTTP/1.1 ", b"HTTP/11"])


def lead(rng: random.Random, shape: Shape) -> None:
    shape.lead = rng.choice([b"\r\n", b"\n", b"\r\n\r\n", b" "])


def cut(rng: random.Random, shape: Shape) -> None:
    shape.cut = rng.randrange(len(shape.render()))


def tail(rng: random.Random, shape: Shape) -> None:
    other = plain_shape(rng).render()
    shape.tail = rng.choice([other, other[:rng.randint(1, len(other))], b"\r\n", b"x",
                             bytes(rng.randrange(256) for _ in range(rng.randint(1, 10)))])


CHANGES: list[Callable[[random.Random, Shape], None]] = [
    drop(b"host"), drop(b"content-length"), twice(b"host"), twice(b"content-length"), bad_host, bad_length,
    framing_field, other_connection, bad_value_byte, bad_name_byte, space_before_colon, continuation, lf_only,
    request_line, lead, cut, tail]


def fuzz_corpus(seed: int, size: int) -> list[tuple[bytes, int]]:
    """``size`` requests, each with the number of changes made to a plain request (none: plain; one: not plain;
    more: either)."""
    rng = random.Random(seed)
    out = []
    for _ in range(size):
        shape = plain_shape(rng)
        roll = rng.random()
        n = 0 if roll < 0.45 else 1 if roll < 0.85 else rng.randint(2, 3)
        for change in rng.sample(CHANGES, n):
            change(rng, shape)
        out.append((shape.render(), n))
    return out


@pytest.mark.parametrize("mode", MODES)
def test_random_requests_are_read_in_one_pass_exactly_when_plain_and_answered_the_same_either_way(mode: str) -> None:
    corpus = fuzz_corpus(FUZZ_SEED + MODES.index(mode), FUZZ_CASES)

    async def run() -> tuple[list[str], int, int, int]:
        problems: list[str] = []
        one_pass_count = taken_by_parser = app_count = 0
        for data, changes in corpus:
            one_pass, parser, plain = await both_ways(data, mode=mode)
            if changes == 0 and not plain:
                problems.append(f"{data!r}: plain, but the one-pass read left it to the parser")
            if changes == 1 and plain:
                problems.append(f"{data!r}: changed, but the one-pass read took it")
            problems += differences(data, one_pass, parser, plain)
            one_pass_count += plain
            taken_by_parser += not plain and bool(parser.taken)
            app_count += bool(parser.app)
        return problems, one_pass_count, taken_by_parser, app_count

    problems, one_pass_count, taken_by_parser, app_count = asyncio.run(run())
    assert problems == [], "\n".join(problems[:10])
    # neither way vacuous: many read in one pass, many left to the parser (and taken by the route or the app there)
    assert 0.3 * FUZZ_CASES < one_pass_count < 0.7 * FUZZ_CASES
    assert taken_by_parser > 0.05 * FUZZ_CASES and app_count >= 0.01 * FUZZ_CASES


# -- the connection around a request read in one pass ---------------------------------------------------------------


def test_keep_alive_goes_on_after_a_request_read_in_one_pass() -> None:
    route = FakeRoute()

    async def run() -> Connection:
        conn = Connection(route, EchoApp())
        await conn.read(post(body=b"one"))
        await conn.read(post(body=b"two"))
        await conn.read(post(body=b"three", extra=b"Connection: keep-alive\r\n"))
        assert not conn.transport.closed
        await conn.lose()
        return conn

    conn = asyncio.run(run())
    assert conn.heads == 0  # all three in one pass
    assert [b for _, b in answers(conn.transport.written)] == [b"direct one", b"direct two", b"direct three"]
    assert b"connection: close" not in conn.transport.written.lower()


def test_a_request_read_while_an_answer_is_pending_is_queued_behind_it() -> None:
    route = FakeRoute(deferred=True)

    async def run() -> tuple[bytes, int, Connection]:
        conn = Connection(route, EchoApp())
        await conn.read(post(body=b"one"))  # read in one pass; its answer waits for release
        await conn.read(post(body=b"two"))  # the parser's way: queued behind it
        before, heads = conn.transport.written, conn.heads
        route.release.set()
        for _ in range(ROUNDS):
            await asyncio.sleep(0)
        await conn.lose()
        return before, heads, conn

    before, heads, conn = asyncio.run(run())
    assert before == b"" and heads == 1
    assert route.taken == [b"one", b"two"]
    assert [b for _, b in answers(conn.transport.written)] == [b"direct one", b"direct two"]
    assert not conn.transport.paused  # reading resumed once the queued request was answered


def test_a_request_read_in_one_pass_while_draining_closes_the_connection() -> None:
    route = FakeRoute()

    async def run() -> Connection:
        conn = Connection(route, EchoApp(), draining=lambda: True)
        await conn.read(post(body=b"tick"))
        return conn

    conn = asyncio.run(run())
    assert conn.heads == 0
    got = answers(conn.transport.written)
    assert [b for _, b in got] == [b"direct tick"]
    assert got[0][0].lower().count(b"connection: close") == 1
    assert conn.transport.closed


def test_a_head_over_the_limit_goes_the_parser_way() -> None:
    route = FakeRoute()

    async def run(data: bytes) -> Connection:
        conn = Connection(route, EchoApp())
        await conn.read(data)
        await conn.lose()
        return conn

    at = asyncio.run(run(head_of(MAX_HEADER_BYTES)))
    assert at.heads == 0 and [b for _, b in answers(at.transport.written)] == [b"direct tick"]
    over = asyncio.run(run(head_of(MAX_HEADER_BYTES + 1)))
    assert over.transport.written.startswith(b"HTTP/1.1 431 ")  # refused by the protocol's limit, as before
    assert route.taken == [b"tick"]


class RefusingRoute(FakeRoute):
    """A route that takes nothing; notes what it was offered."""

    def __init__(self) -> None:
        super().__init__()
        self.offered: list[Seen] = []

    def eligible(self, scope: Any) -> bool:
        self.offered.append(seen(scope))
        return False


def test_a_plain_request_the_route_refuses_goes_to_the_app() -> None:
    route = RefusingRoute()
    app = EchoApp()

    async def run() -> Connection:
        conn = Connection(route, app)
        await conn.read(post(body=b"tick", extra=b"X-A: v\r\n"))
        await conn.read(post(body=b"again"))
        await conn.lose()
        return conn

    conn = asyncio.run(run())
    assert conn.heads == 2 and route.taken == []
    assert [body for _, body in app.requests] == [b"tick", b"again"]
    assert [b for _, b in answers(conn.transport.written)] == [b"app " + repr(r).encode() for r in app.requests]
    # offered twice each (the one-pass read, then the parser's), the same scope both times
    assert route.offered == [app.requests[0][0]] * 2 + [app.requests[1][0]] * 2


def test_a_request_left_to_the_parser_is_offered_to_the_route_once() -> None:
    """A request the one-pass read leaves to the parser is offered to the route only once (by the parser)."""
    route = RefusingRoute()

    async def run() -> Connection:
        conn = Connection(route, EchoApp())
        await conn.read(post(body=b"tick", extra=b"Connection: close\r\n"))
        await conn.lose()
        return conn

    conn = asyncio.run(run())
    assert conn.heads == 1 and len(route.offered) == 1


def test_fuzz_corpus_is_reproducible() -> None:
    assert fuzz_corpus(FUZZ_SEED, 20) == fuzz_corpus(FUZZ_SEED, 20)
