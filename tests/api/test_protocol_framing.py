"""The protocol's header limit and framing, in process: a fake transport, the bytes fed in any split.

The limit counts every byte of a request line and headers (empty lines before the request line,
whitespace around header values included), however the bytes arrive (a head that begins inside a
read behind another request: the least its fields can have been); the trailers of a chunked body
have the same limit; pipelined requests behind bodies of every kind are answered as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from cerebellar_norse.api.protocol import MAX_HEADER_BYTES, guarded_protocol
from cerebellar_norse.api.schemas import ErrorOut


async def echo(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
    """Answers ``<path> <body length>``."""
    if scope["type"] != "http":
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = f"{scope['path']} {size}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, *args: object, **kwargs: object) -> None:
        pass


def answers(reads: Sequence[bytes]) -> list[tuple[int, bytes]]:
    """Status and body of every answer to ``reads`` fed as separate socket reads."""
    return [(status, body) for status, _, body in answers_with_heads(reads)]


def answers_with_heads(reads: Sequence[bytes]) -> list[tuple[int, bytes, bytes]]:
    """Status, head and body of every answer to ``reads`` fed as separate socket reads."""

    async def run() -> bytes:
        protocol_class = guarded_protocol(30.0)
        protocol = protocol_class(config=Config(app=echo, lifespan="off", log_level="error"),
                                  server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
        transport = Transport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        for data in reads:
            protocol.data_received(data)
            for _ in range(5):
                await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        protocol.connection_lost(None)
        return transport.written

    raw = asyncio.run(run())
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
        out.append((int(lines[0].split()[1]), head, rest[:length]))
        raw = rest[length:]
    return out


def in_reads(data: bytes, size: int) -> list[bytes]:
    return [data[k:k + size] for k in range(0, len(data), size)]


def request(path: str = "/h", extra: bytes = b"", lead: bytes = b"") -> bytes:
    return lead + b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n"


def padded(size: int, lead: bytes = b"", ows: bool = False) -> bytes:
    """A request of exactly ``size`` bytes: ``lead`` before it, one header filled with ``b`` (or spaces before a v)."""
    bare = request(extra=b"X-Big: \r\n", lead=lead)
    fill = size - len(bare)
    value = (b" " * (fill - 1) + b"v") if ows else b"b" * fill
    out = request(extra=b"X-Big: " + value + b"\r\n", lead=lead)
    assert len(out) == size
    return out


def refused_431(got: list[tuple[int, bytes]]) -> None:
    assert [status for status, _ in got] == [431], got
    err = json.loads(got[0][1])["error"]
    ErrorOut.model_validate(json.loads(got[0][1]))
    assert err["type"] == "headers_too_large" and str(MAX_HEADER_BYTES) in err["message"]


@pytest.mark.parametrize("shape", [{}, {"lead": b"\r\n" * 20}, {"ows": True}, {"lead": b"\n\r", "ows": True}],
                         ids=["plain", "leading empty lines", "whitespace in a value", "both"])
@pytest.mark.parametrize("read", [1_000_000, 65_536, 8_192, 1_000, 7], ids=lambda n: f"reads of {n}")
def test_the_limit_is_exact_whatever_the_head_contains_and_however_it_is_read(shape: dict, read: int) -> None:
    ok = padded(MAX_HEADER_BYTES, **shape)
    assert answers(in_reads(ok, read)) == [(200, b"/h 0")]
    refused_431(answers(in_reads(padded(MAX_HEADER_BYTES + 1, **shape), read)))


@pytest.mark.parametrize("head", [
    b"\r\n" * 100_000 + request(),  # empty lines before the request line
    request(extra=b"X-A: " + b" " * 200_000 + b"v\r\n"),  # whitespace before a value
    request(extra=b"X-A: v" + b"\t" * 200_000 + b"\r\n"),  # whitespace after a value
    b"GET " + b"/" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # a long target
], ids=["leading CRLF", "leading OWS", "trailing OWS", "long target"])
def test_a_head_over_the_limit_in_one_read_is_refused(head: bytes) -> None:
    refused_431(answers([head]))
    refused_431(answers(in_reads(head, 100_000)))


def test_short_header_lines_under_the_limit_are_served() -> None:
    """``Name:v`` lines (no space, 6 bytes): 60 KB of them is under the limit."""
    head = request(extra=b"".join(b"X%d:v\r\n" % (k % 10) for k in range(10_000)))
    assert len(head) < MAX_HEADER_BYTES
    assert answers([head]) == [(200, b"/h 0")]


def test_a_head_behind_a_body_in_the_same_read_is_held_to_the_least_it_can_be() -> None:
    """A head that begins inside a read, behind another request, is checked against the least its fields can have
    been (``Name:value`` lines): at the limit it is served, over it by its separators' spaces it is refused. (Spaces
    the parser drops, around values, go uncounted there: such a head is bounded by one socket read instead.)"""
    body = b"x" * 50_000
    post = b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    assert answers([post + padded(MAX_HEADER_BYTES)]) == [(200, b"/p 50000"), (200, b"/h 0")]
    got = answers([post + padded(MAX_HEADER_BYTES + 3)])  # two fields: each ": " is one byte more than the least
    assert got[:1] == [(200, b"/p 50000")]
    refused_431(got[1:])


def test_pipelined_requests_with_every_framing_in_any_split() -> None:
    chunked = (b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=\"a b\"\r\nhello\r\n00a\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n")
    length = b"POST /l HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
    empty = b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    stream = chunked + b"\r\n" + length + request("/g") + empty + chunked
    expect = [(200, b"/c 15"), (200, b"/l 3"), (200, b"/g 0"), (200, b"/e 0"), (200, b"/c 15")]
    assert answers([stream]) == expect
    for size in (1, 2, 3, 5, 17, 64):
        assert answers(in_reads(stream, size)) == expect, size


def test_trailers_over_the_limit_are_refused() -> None:
    head = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n"
    fits = b"X-T: " + b"t" * (MAX_HEADER_BYTES - 9) + b"\r\n" + b"\r\n"
    assert len(fits) == MAX_HEADER_BYTES
    assert answers([head + fits]) == [(200, b"/c 5")]
    over = [b"X-T%d: " % k + b"t" * 8_000 + b"\r\n" for k in range(1_000)]  # 8 MB of trailers
    refused_431(answers([head, *over]))


def test_malformed_requests_are_still_400() -> None:
    for raw in (b"GET / HTTP/9.9\r\n\r\n", b"GET / HTTP/1.1\nHost: x\n\n",
                b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n\r\n",
                b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"):
        ((status, body),) = answers([raw])
        assert status == 400 and json.loads(body)["error"]["type"] == "bad_request", raw


RID = b"ord-7f3a"


def refused_ids(reads: Sequence[bytes]) -> list[tuple[int, bytes, str]]:
    """Status, ``X-Request-ID`` header and body ``request_id`` of every answer."""
    out = []
    for status, head, body in answers_with_heads(reads):
        header = next((line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                       if line.lower().startswith(b"x-request-id:")), b"")  # (the echo app sets none)
        out.append((status, header, json.loads(body)["error"]["request_id"] if status >= 400 else ""))
    return out


@pytest.mark.parametrize("reads", [
    [b"GET /h HTTP/1.1\r\nX-Request-ID: ord-7f3a\r\nHost: a b\r\n\r\n"],
    [b"GET /h HTTP/1.1\r\nX-Request-ID: ord-7f3a\r\n\r\n"],
    [b"GET /h HTTP/1.1\r\nHost: a\r\nHost: b\r\nX-Request-ID: ord-7f3a\r\n\r\n"],
    [b"POST /c HTTP/1.1\r\nHost: x\r\nX-Request-ID: ord-7f3a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"],
    [b"POST /c HTTP/1.1\r\nHost: x\r\nX-Request-ID: ord-7f3a\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n\r\n"],
    [b"GET /h HTTP/1.1\r\nHost: x\r\nX-Request-ID: ord-7f3a\r\nX-Big: b", b"b" * MAX_HEADER_BYTES + b"\r\n\r\n"],
], ids=["host not a host", "no host", "two hosts", "gzip coding", "bad chunk", "head over the limit"])
def test_a_request_refused_below_the_app_keeps_the_callers_request_id(reads: list[bytes]) -> None:
    """The 400 of a request whose headers were read (a Host that is not one, a coding) and the 431 of a head read in
    part carry the caller's X-Request-ID, as every other answer does: it named a fresh id of its own."""
    ((status, header, body_id),) = refused_ids(reads)
    assert status in (400, 431)
    assert header == RID and body_id == RID.decode()


def test_a_refused_request_never_takes_the_id_of_the_request_before_it() -> None:
    """Behind an answered request with an id, a request without one, or one the parser cannot read from its first
    line, gets a fresh id (the headers read last were the other request's)."""
    first = b"GET /h HTTP/1.1\r\nHost: x\r\nX-Request-ID: ord-7f3a\r\n\r\n"
    for bad in (b"GET /h HTTP/1.1\r\nHost: a b\r\n\r\n", b"GET /h HTTP/9.9\r\nX-Request-ID: ord-7f3a\r\n\r\n",
                b"GET /h HTTP/1.1\r\nX-Big: " + b"b" * MAX_HEADER_BYTES + b"\r\n\r\n"):
        for reads in ([first + bad], [first, bad]):
            got = refused_ids(reads)
            assert got[0][0] == 200, got
            status, header, body_id = got[1]
            assert status in (400, 431) and header != RID and header.decode() == body_id, got


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/3.0", b"HTTP/1.2", b"HTTP/9.9", b"PRI", b"", b"+headers"])
def test_a_request_line_of_another_http_version_is_refused_naming_it(version: bytes) -> None:
    """HTTP/2.0 and HTTP/0.9 (a request line without a version, with or without headers after it) parse and were
    served as HTTP/1.1; the others (PRI: HTTP/2's connection preface) did not, and the 400 said only "could not
    parse"."""
    if version == b"PRI":
        head = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    elif version == b"":
        head = b"GET /h\r\n\r\n"
    elif version == b"+headers":
        head = b"GET /h\r\nHost: x\r\n\r\n"
    else:
        head = b"GET /h " + version + b"\r\nHost: x\r\n\r\n"
    ((status, body),) = answers([head])
    assert status == 400 and json.loads(body)["error"]["type"] == "bad_request"
    assert "HTTP version is not HTTP/1.1 or HTTP/1.0" in json.loads(body)["error"]["message"]
    assert [s for s, _ in answers([b"GET /h HTTP/1.0\r\n\r\n"])] == [200]


def test_http_1_0_closes_after_its_answer_and_ignores_what_follows() -> None:
    """uvicorn keeps no HTTP/1.0 connection alive (it answers ``Connection: close``, even to
    ``Connection: keep-alive``): a request behind one is never read, so it gets no answer, no 400."""
    for first in (b"GET /a HTTP/1.0\r\n\r\n", b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"):
        assert answers([first + b"GARBAGE\r\n\r\n"]) == [(200, b"/a 0")]
        assert answers([first, b"\r\n" * 100_000]) == [(200, b"/a 0")]


class PausingTransport(Transport):
    paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def pipelined(data: bytes, slow: Callable[[Any, Any, asyncio.Event], Awaitable[None]]) -> tuple[bool, int, bool, bytes]:
    """``data`` (pipelined requests) sent at once to a connection whose ``/slow`` route is ``slow(receive, send,
    release)`` (it waits for ``release``), the others echoed: (reading paused, requests queued) while ``/slow``
    waits, then whether reading is paused once it is released and everything answered, and what was written."""

    async def run() -> tuple[bool, int, bool, bytes]:
        release = asyncio.Event()

        async def app(scope: dict, receive: Any, send: Any) -> None:
            if scope["path"] == "/slow":
                await slow(receive, send, release)
                return
            await echo(scope, receive, send)

        protocol = guarded_protocol(30.0)(config=Config(app=app, lifespan="off", log_level="error"),
                                          server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
        transport = PausingTransport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(data)
        for _ in range(20):
            await asyncio.sleep(0)
        waiting = (transport.paused, len(protocol.pipeline))
        release.set()
        for _ in range(20):
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return (*waiting, transport.paused, transport.written)

    return asyncio.run(run())


def bodies(written: bytes) -> list[bytes]:
    return [answer.split(b"\r\n")[-1] for answer in written.split(b"HTTP/1.1 ")[1:]]


def test_reading_stays_paused_while_pipelined_requests_wait_for_their_turn() -> None:
    """A client that pipelines requests without reading the answers: requests already read wait for their turn
    with reading paused, so the service does not read (and queue) what the client goes on sending."""

    async def slow(receive: Any, send: Any, release: asyncio.Event) -> None:
        await release.wait()
        await echo({"type": "http", "path": "/slow"}, receive, send)

    paused, queued, paused_after, written = pipelined(request("/a") + request("/slow") + request("/c") + request("/d"),
                                                      slow)
    assert (paused, queued) == (True, 2)  # /a answered, /slow running, /c and /d queued
    assert not paused_after  # every queued request answered: reading again
    assert bodies(written) == [b"/a 0", b"/slow 0", b"/c 0", b"/d 0"]


def test_a_request_reading_its_body_does_not_resume_reading_while_others_wait() -> None:
    """The request being answered reads its body (a POST's, its app's receive()) while pipelined requests wait:
    reading stays paused (each answer would otherwise let one more read's worth of requests be queued)."""

    async def slow(receive: Any, send: Any, release: asyncio.Event) -> None:
        await receive()  # its whole body, read already
        await release.wait()
        body = b"/slow read"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    paused, queued, paused_after, written = pipelined(request("/slow") + request("/b") + request("/c"), slow)
    assert (paused, queued) == (True, 2)
    assert not paused_after
    assert bodies(written) == [b"/slow read", b"/b 0", b"/c 0"]


def test_a_pipelined_request_whose_client_left_is_not_answered_into_the_closed_socket() -> None:
    """The client of a pipelined request being answered goes away: the answer is dropped, as for the request
    read last, and nothing is written to the closed transport (uvloop raises, logged as an unexpected error)."""

    class ClosingTransport(Transport):
        def write(self, data: bytes) -> None:
            if self.closed:
                raise RuntimeError("unable to perform operation on a closed transport")
            super().write(data)

    failures: list[BaseException] = []

    async def run() -> bytes:
        release = asyncio.Event()

        async def app(scope: dict, receive: Any, send: Any) -> None:
            if scope["path"] == "/slow":
                await release.wait()
            try:
                await echo(scope, receive, send)
            except Exception as exc:  # what the service would log as an unexpected error
                failures.append(exc)

        protocol = guarded_protocol(30.0)(config=Config(app=app, lifespan="off", log_level="error"),
                                          server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
        transport = ClosingTransport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(request("/a") + request("/slow") + request("/c"))  # /slow runs from the queue
        for _ in range(20):
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        release.set()
        for _ in range(20):
            await asyncio.sleep(0)
        return transport.written

    assert asyncio.run(run()).endswith(b"/a 0")
    assert failures == []


# -- the OpenAPI document --------------------------------------------------------------------------


def document(state_dir: Path) -> dict[str, Any]:
    from live_helpers import NO_BOOTSTRAP

    from cerebellar_norse.api.app import create_app
    from cerebellar_norse.api.server import build_service
    from cerebellar_norse.config import load_checked_config

    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(state_dir), **NO_BOOTSTRAP}
    return create_app(build_service(load_checked_config(None, environ=environ))).openapi()


def conforms(value: Any, schema: dict[str, Any], components: dict[str, Any]) -> bool:
    """Enough of JSON Schema for the error shape: $ref, anyOf, type, required, properties, additionalProperties."""
    if "$ref" in schema:
        return conforms(value, components[schema["$ref"].rsplit("/", 1)[1]], components)
    if "anyOf" in schema:
        return any(conforms(value, s, components) for s in schema["anyOf"])
    kind = schema.get("type")
    types = {"string": str, "object": dict, "null": type(None), "integer": int, "number": (int, float)}
    if kind is not None and not isinstance(value, types[kind]):
        return False
    if kind == "object":
        props = schema.get("properties", {})
        if not set(schema.get("required", [])) <= set(value):
            return False
        if schema.get("additionalProperties") is False and not set(value) <= set(props):
            return False
        return all(conforms(v, props[k], components) for k, v in value.items() if k in props)
    return True


def test_every_operation_documents_the_protocol_refusals_with_the_body_sent(tmp_path: Path) -> None:
    doc = document(tmp_path / "state")
    components = doc["components"]["schemas"]
    bodies = {"400": json.loads(answers([b"GET / HTTP/9.9\r\n\r\n"])[0][1]),
              "431": json.loads(answers([padded(MAX_HEADER_BYTES + 1)])[0][1])}
    assert bodies["400"]["error"]["type"] == "bad_request" and bodies["431"]["error"]["type"] == "headers_too_large"
    operations = [(method, path, op) for path, item in doc["paths"].items() for method, op in item.items()]
    assert len(operations) > 20
    for method, path, op in operations:
        for status, body in bodies.items():
            documented = op["responses"].get(status)
            assert documented is not None, (method, path, status)
            if method == "head":  # no content is read after a HEAD, whatever the server writes
                assert "content" not in documented, (method, path, status)
                continue
            schema = documented["content"]["application/json"]["schema"]
            assert conforms(body, schema, components), (method, path, status, schema)
            assert body["error"]["type"] in documented["description"], (method, path, status)
    assert "malformed_json" in doc["paths"]["/neural/process"]["post"]["responses"]["400"]["description"]
    assert "malformed_json" not in doc["paths"]["/health"]["get"]["responses"]["400"]["description"]


def test_error_answers_are_documented_as_json_on_every_route(tmp_path: Path) -> None:
    """/metrics answers text/plain, its errors (the protocol's 400 and 431, 408, 413, 500, 503) are JSON."""
    doc = document(tmp_path / "state")
    for path, item in doc["paths"].items():
        for method, op in item.items():
            for status, response in op["responses"].items():
                if status[0] in "45" and method != "head":  # (an answer to HEAD has no content)
                    assert list(response["content"]) == ["application/json"], (method, path, status)
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]


@pytest.mark.parametrize("cut", [(-2, -1), (-3, -1), (-1, -1)], ids=["..CRLF|CR|LF+body", "..CR|LFCR|LF+body",
                                                                    "..CRLFCR|LF+body"])
def test_a_head_whose_end_comes_in_short_reads_does_not_count_the_body_behind_it(cut: tuple[int, int]) -> None:
    """The end of a head split over reads shorter than 3 bytes is still found: the body in the read that ends the
    head is no head byte (it was counted as one: a false 431 for a head near the limit, or a body over it)."""
    a, b = cut
    for head_fill, body_size in ((0, 70_000), (MAX_HEADER_BYTES - 2_000, 2_000)):
        body = b"x" * body_size
        head = (b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nX-Big: " % body_size + b"b" * head_fill
                + b"\r\n\r\n")
        assert len(head) <= MAX_HEADER_BYTES
        reads = [head[:a], head[a:b], head[b:] + body] if a != b else [head[:a], head[a:] + body]
        assert answers(reads) == [(200, b"/p %d" % body_size)], (cut, head_fill)


@pytest.mark.parametrize("cut", [1, 2, 3, 4, 20])
def test_a_pipelined_head_split_near_its_end_does_not_count_the_body_behind_it(cut: int) -> None:
    """A head that begins in a read behind a whole request and ends in the next read, followed by its body there:
    the body is no head byte (it was counted as one when the next read began with the head's last CR/LF)."""
    body = b"x" * 70_000
    head = b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    first = request("/a")
    assert answers([first + head[:-cut], head[-cut:] + body]) == [(200, b"/a 0"), (200, b"/p 70000")]


def test_the_head_of_a_request_behind_one_with_trailers_is_not_counted_as_its_trailers() -> None:
    """A request that begins in the read that ends the trailers of the one before it: its header fields are its own
    head, not more trailers of the request before (35 KB of trailers and a 36 KB head were refused as trailers over
    64 KiB)."""
    first = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
    trailers = b"".join(b"X-T%02d: " % k + b"t" * 1_000 + b"\r\n" for k in range(35))
    head = request("/g", extra=b"".join(b"X-H%04d: hhhhhhhhh\r\n" % k for k in range(1_800)))
    assert len(trailers) < MAX_HEADER_BYTES and len(head) < MAX_HEADER_BYTES
    expect = [(200, b"/c 5"), (200, b"/g 0")]
    assert answers([first + b"0\r\n" + trailers + b"\r\n" + head]) == expect
    assert answers([first, b"0\r\n" + trailers, b"\r\n" + head[:-2], head[-2:]]) == expect


def test_trailers_over_the_limit_are_refused_before_the_request_runs() -> None:
    """100 KB of trailers: in the read of the head, in a read of their own, or in the read that begins the next
    request, the request is refused 431 and never answered 200 (the app must not run it)."""
    head = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    trailers = b"".join(b"X-T%d: " % k + b"t" * 1_000 + b"\r\n" for k in range(100))
    body = b"5\r\nhello\r\n0\r\n" + trailers + b"\r\n"
    half = len(head) + 11 + len(trailers) // 2
    raw = head + body
    for reads in ([raw], [head, body], [raw[:half], raw[half:] + request("/next")]):
        refused_431(answers(reads))


def test_one_endless_chunk_size_line_is_refused_naming_it() -> None:
    """A chunk-size line that never ends (its extensions, read by the parser as one line): 431 once its bytes pass the
    limit, the message naming a chunk-size line (not only trailers, which the request has none of)."""
    head = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext="
    got = answers([head, *[b"e" * 8_000] * 20])
    refused_431(got)
    assert "chunk-size line" in json.loads(got[0][1])["error"]["message"]


def test_one_endless_trailer_is_refused_not_buffered() -> None:
    """A single trailer line over many reads (never a complete field) is refused once its bytes pass the limit."""
    head = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: "
    refused_431(answers([head, *[b"t" * 8_000] * 20]))
    fits = head + b"t" * (MAX_HEADER_BYTES - 9) + b"\r\n\r\n"
    assert answers(in_reads(fits, 4_096)) == [(200, b"/c 5")]


H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"


def test_an_upgrade_to_another_protocol_than_websocket_is_served_with_its_body() -> None:
    """``curl --http2`` asks every request to switch to h2c: the switch is not made, and the request is served
    as HTTP/1.1, body and all (httptools would end it at its head, and read its body as the next request)."""
    length = b"POST /l HTTP/1.1\r\nHost: x\r\n" + H2C + b"Content-Length: 5\r\n\r\nhello"
    chunked = b"POST /c HTTP/1.1\r\nHost: x\r\n" + H2C + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    get = request("/g", extra=H2C)
    old = b"POST /o HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: foo\r\nContent-Length: 3\r\n\r\nabc"
    stream = length + chunked + get + length
    expect = [(200, b"/l 5"), (200, b"/c 5"), (200, b"/g 0"), (200, b"/l 5")]
    assert answers([stream]) == expect
    for size in (1, 2, 7, 64):
        assert answers(in_reads(stream, size)) == expect, size
    assert answers([old]) == [(200, b"/o 3")]


def test_a_websocket_upgrade_of_another_method_than_get_is_served_as_http() -> None:
    """A WebSocket handshake is a GET (RFC 6455): a POST asking for one is the POST it is, body and all."""
    ws = b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" \
         b"Sec-WebSocket-Version: 13\r\n"
    post = b"POST /p HTTP/1.1\r\nHost: x\r\n" + ws + b"Content-Length: 5\r\n\r\nhello"
    empty = b"POST /e HTTP/1.1\r\nHost: x\r\n" + ws + b"Content-Length: 0\r\n\r\n"
    assert answers([post + empty]) == [(200, b"/p 5"), (200, b"/e 0")]
    assert answers(in_reads(post + empty, 3)) == [(200, b"/p 5"), (200, b"/e 0")]
