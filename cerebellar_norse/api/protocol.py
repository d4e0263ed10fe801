"""uvicorn's httptools protocol with a deadline on reading each request (slow clients are cut off).

uvicorn times out idle keep-alive connections only after a first response: a socket that
connects and never sends, or sends part of a request's headers or body and stalls,
holds its connection (and a slot of ``server.max_connections``) forever, and so does one
that stops reading answers larger than the socket buffers. This protocol adds three deadlines:

* a connection with no request begun is closed after ``server.keep_alive_timeout``, as
  an idle keep-alive connection is;
* once a request's first byte arrives, its headers and body must be complete within
  ``server.request_timeout``; otherwise it is answered ``408`` with the JSON error
  shape (``request_timeout``, with ``X-Request-ID``) and the connection is closed;
* while answers wait to be written, the peer must take a byte of them within
  ``server.request_timeout``; otherwise the connection is cut off.

A request that asks to switch to another protocol than WebSocket (``Upgrade: h2c``, which
``curl --http2`` sends with every request), or to WebSocket with another method than GET
(RFC 6455 handshakes are GET requests), is served as the HTTP/1.1 request it also is
(RFC 9110 §7.8: a server may ignore ``Upgrade``); httptools would stop reading it at the
end of its head, and uvicorn would answer it as if it had no body (or hand it to the
WebSocket handshake, which refused it ``405`` or, with a body, never answered).

An answer given before the request's body came (413 by ``Content-Length``, 415, the final answer to ``Expect:
100-continue``) ends the connection, and a client that half-closes its socket after whole requests gets their
answers (:class:`_EarlyAnswerCycle`, ``eof_received``).

It also answers what uvicorn would answer in plain text, or not at all, with the JSON
error shape: a request httptools cannot parse gets ``400 bad_request`` (uvicorn: plain
text), and a request line and headers (or a chunked body's trailers) over
:data:`MAX_HEADER_BYTES` get ``431 headers_too_large`` (httptools has no limit: it would
buffer them all), each with ``X-Request-ID`` and the connection closed.
"""

from __future__ import annotations

import asyncio
import collections
import json
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import httptools
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from ..observability.context import accept_request_id, new_request_id
from .deps import SCOPE_REQUEST_ID, SCOPE_TIMED_OUT
from .plainhead import HOST_VALUE, read_plain_request
from .schemas import error_payload

MAX_HEADER_BYTES = 65_536  # request line and headers of one request (nginx allows 32 KiB, uvicorn's h11 16 KiB)
STOP_ANSWER_S = 1.0  # at a stop, the longest a stream's close waits for the answer to the tick being stepped
STALLED_PEER_S = 20.0  # a stream peer past its pong deadline that reads nothing for this long is cut off (no ping_timeout)
HEAD_PART, TRAILERS_PART = "the request line and headers", "the trailers of the chunked body"  # (431 messages)
FRAMING_PART = "a chunk-size line or the trailers of the chunked body"  # bytes the parser buffers, not yet either
BAD_VERSION = "the request line's HTTP version is not HTTP/1.1 or HTTP/1.0 (the versions served)"
PARSER_SAYS = "the server could not parse it: "  # before the HTTP parser's own reason in a 400's message
SHOWN_PARSER_ERROR = 120  # characters of the parser's reason shown
TARGET_FORMS = "send a path (/health), an absolute URL with one (http://host/health), or * with OPTIONS"
LINGER_S = 2.0  # how long a refused client may go on sending (discarded) before its connection is closed
# Connections beyond the open-file limit's room whose request is read all the same, to answer GET/HEAD /metrics (then
# closed) and refuse anything else: two descriptors of server.FD_RESERVE, for a pair of Prometheus servers.
SCRAPE_ROOM = 2
SCRAPE_WAIT_S = 2.0  # such a connection that sends no byte within this is closed: an idle client cannot keep the room
SCRAPE_TARGETS = frozenset({(b"GET", b"/metrics"), (b"HEAD", b"/metrics")})


Reply = Callable[[int, list[tuple[bytes, bytes]], bytes], None]  # writes an answer: status, headers, body


class DirectRoute(Protocol):
    """A route the protocol answers without an ASGI request cycle (:class:`.direct.DirectTickRoute`).

    ``target``: the route's path as sent; a whole ``POST`` to it written plainly in one read is read without the
    HTTP parser (:mod:`.plainhead`)."""

    target: bytes

    def eligible(self, scope: Any) -> bool:
        """Whether :meth:`answer` takes this request (called when its cycle would start)."""

    def answer(self, scope: Any, body: bytes, reply: Reply) -> None:
        """Answer the request, whose whole body has come, through ``reply`` (now or later, once)."""


def framing_problem(version: str, headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """What makes a request's head one that is refused although the HTTP parser reads it (RFC 9112), or None.

    * ``Host``: an HTTP/1.1 request without one, any request with more than one, or one whose value is not a host
      and optional port (section 3.2: a server must answer 400; ``a b``, ``user@host``, ``host/path``): which host
      was meant is unknown, and a proxy before the service may have read another;
    * ``Transfer-Encoding``: a coding other than ``chunked`` (``gzip, chunked``: the parser would read the chunks
      and hand the body on still gzipped, where a proxy before the service may have decoded it), or in an
      HTTP/1.0 request, whose framing is then faulty (section 6.1)."""
    hosts: list[bytes] = []
    coded = False
    for name, value in headers:  # one plain pass: run for every request (the tick route's too)
        if name == b"host":
            hosts.append(value)
        elif name == b"transfer-encoding":
            coded = True
    if len(hosts) > 1:
        return f"the request has {len(hosts)} Host headers: one is required"
    if not hosts:
        if version == "1.1":
            return "an HTTP/1.1 request must have a Host header"
    elif HOST_VALUE.fullmatch(hosts[0]) is None:
        shown = hosts[0].decode("latin-1")[:SHOWN_PARSER_ERROR]
        return f"the Host header {shown!r} is not a host with an optional port (such as example.com:8080 or [::1])"
    if not coded:
        return None
    codings = [c.strip().lower() for name, value in headers if name == b"transfer-encoding" for c in value.split(b",")]
    codings = [c for c in codings if c]
    if codings and version == "1.0":
        return "an HTTP/1.0 request cannot have a Transfer-Encoding (its framing would be faulty)"
    if codings and codings != [b"chunked"]:
        shown = ", ".join(c.decode("latin-1") for c in codings)[:SHOWN_PARSER_ERROR]
        return f"Transfer-Encoding {shown!r}: chunked (once) is the only transfer coding read"
    return None


def closing_headers(content_type: bytes, body: bytes, request_id: str,
                    extra: Sequence[tuple[bytes, bytes]] = ()) -> list[tuple[bytes, bytes]]:
    """Headers (``extra`` last) of an answer of ``body`` that closes the connection."""
    return [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"), (b"x-request-id", request_id.encode("latin-1")), *extra]


def json_answer(payload: dict[str, Any], request_id: str,
                extra: Sequence[tuple[bytes, bytes]] = ()) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers (``extra`` last) and body of a JSON answer that closes the connection."""
    body = json.dumps(payload).encode()
    return closing_headers(b"application/json", body, request_id, extra), body


def error_answer(kind: str, message: str, request_id: str,
                 extra: Sequence[tuple[bytes, bytes]] = ()) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers (``extra`` last) and body of an answer in the JSON error shape that closes the connection."""
    return json_answer(error_payload(kind, message, request_id), request_id, extra)


def timeout_response(request_id: str, timeout_s: float) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and body of the 408 answer."""
    return error_answer("request_timeout",
                        f"the request did not arrive completely within server.request_timeout ({timeout_s:g} s)", request_id)


def raw_answer(status_line: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    """An HTTP/1.1 answer written straight to the socket (no request cycle to answer through)."""
    return status_line + b"\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n" + body


def refusal(status_line: bytes, kind: str, message: str, extra: Sequence[tuple[bytes, bytes]] = (),
            request_id: str | None = None) -> bytes:
    """The whole answer to a request refused below the app: the JSON error shape with ``request_id`` (a fresh one
    for none) and the headers ``extra``."""
    headers, body = error_answer(kind, message, request_id or new_request_id(), extra)
    return raw_answer(status_line, headers, body)


def over_budget_message(max_open: int | None) -> str:
    """The 503's message for a connection beyond the ``max_open`` connections the open-file limit leaves room for."""
    return f"too many open connections ({max_open}, what the open-file limit leaves room for); retry later"


class _PipelineFlow(FlowControl):
    """uvicorn's reading and writing control of one connection, whose reading is not resumed while requests read
    already wait for their turn (``waiting()``): neither by an answer nor by the running request reading its body
    (its whole body is read already when a request behind it is)."""

    def __init__(self, transport: asyncio.Transport, waiting: Callable[[], bool]) -> None:
        super().__init__(transport)
        self._waiting = waiting

    def resume_reading(self) -> None:
        if not self._waiting():
            super().resume_reading()


class _EndingTransport:
    """The transport as a request's cycle sees it once it answered before the request's body came: its ``close``
    ends the connection gracefully (``ending``) instead of at once."""

    def __init__(self, transport: asyncio.Transport, ending: Callable[[], None]) -> None:
        self._transport = transport
        self.close = ending

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


CUT_OFF = ("the service shut down before this request was answered (server.connection_timeout passed, or a second "
           "signal forced the quit): whether it was applied is unknown")  # (the 500's message)


class _Cycle(RequestResponseCycle):
    """uvicorn's request cycle, whose own ``500`` (a request cut off at shutdown, or an error that no layer of the app
    answered) is the JSON error shape with the request's id: uvicorn's is plain text without ``X-Request-ID``."""

    async def send_500_response(self) -> None:
        task = asyncio.current_task()
        cut_off = task is not None and task.cancelling() > 0  # (cancelled by the shutdown: see GracefulServer)
        rid = str(self.scope.get(SCOPE_REQUEST_ID) or new_request_id())
        headers, body = error_answer("internal", CUT_OFF if cut_off else "internal error (logged with this request id)",
                                     rid)
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})

    # closing(cycle): True when the answer of ``cycle`` about to start ends the connection (a stop's drain); the
    # protocol's bound method, not a closure over the cycle: a cycle referring to itself would be garbage only the
    # cyclic collector frees, a dozen objects per request (docs/http.md, "Garbage per request")
    closing: Callable[[Any], bool] | None = None

    async def send(self, message: Any) -> None:
        if (not self.response_started and self.keep_alive and self.closing is not None
                and message["type"] == "http.response.start" and self.closing(self)):
            self.keep_alive = False  # the answer says Connection: close, and the socket closes once it is written
        await super().send(message)


class _EarlyAnswerCycle(_Cycle):
    """uvicorn's request cycle, whose answer given before the request's body has come (413 by ``Content-Length``,
    415, 401, the final answer to ``Expect: 100-continue`` instead of ``100 Continue``) ends the connection: it says
    ``Connection: close``, and what the client still sends of the body is read and dropped for up to
    :data:`LINGER_S` before the socket closes (it gets the answer rather than a reset).

    uvicorn kept such a connection open to read the rest of the body: a client that, as the answer told it, sent no
    body (``Expect: 100-continue``) and its next request on the same connection had that request read as the
    old one's body, never answered, until ``server.request_timeout`` closed the connection."""

    ending: Callable[[], None]  # the protocol's graceful end of the connection

    async def send(self, message: Any) -> None:
        if not self.response_started and self.more_body and not self.disconnected:
            self.keep_alive = False
            self.transport = _EndingTransport(self.transport, self.ending)  # type: ignore[assignment]
        await super().send(message)


def guarded_protocol(request_timeout: float, on_timeout: Callable[[str], None] | None = None,
                     on_refused: Callable[[str], None] | None = None,
                     max_open: int | None = None,
                     draining: Callable[[], bool] | None = None,
                     direct: DirectRoute | None = None) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``; ``on_timeout(phase)`` is called per cut-off request
    (``phase`` is ``"headers"`` or ``"body"``), ``on_refused(kind)`` per request refused here (``"bad_request"``,
    ``"headers_too_large"``, ``"capacity"``).

    ``draining``: True while a stop's drain (``server.drain_s``) runs: every answer begun then, unless a later request
    on its connection has been read already (it is answered, and closes the connection, in its turn), says
    ``Connection: close`` and closes its connection once written, so that a proxy's kept connection is never closed
    by the stop with a request on its way.

    ``max_open``: the most connections the open-file limit leaves room for (see :func:`.server.connection_budget`).
    A connection beyond it is answered 503 (``capacity``, ``Retry-After``) as soon as it is accepted and closed, so
    that idle clients cannot take the descriptors the journal and checkpoints need; the first :data:`SCRAPE_ROOM`
    beyond it have their request read instead (closed when no byte of it comes within :data:`SCRAPE_WAIT_S`):
    ``GET``/``HEAD /metrics`` is answered (and the connection closed), so that Prometheus still scrapes the gauges
    that say why (a refused scrape reads as the service down), and any other request gets that 503.

    ``direct``: a route answered without a request cycle's task (see :mod:`.direct`): a request it takes when its cycle
    would start is answered by it once its body is complete; one whose body does not come (the request timeout, the
    connection lost) is handed to the app after all, as every other request is. A read that holds exactly one whole
    ``POST`` to its ``target``, written plainly, on a connection with nothing else under way, is read in one pass
    without the parser (:mod:`.plainhead`; what the parser would have given the route, and no request deadline: the
    whole request is here)."""

    plain_target = direct.target if direct is not None else b""
    plain_line = b"POST " + plain_target + b" HTTP/1.1\r\n"
    plain_path = urllib.parse.unquote(plain_target.decode("ascii"))

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._deadline: asyncio.TimerHandle | None = None
            self._header_bytes = 0  # bytes of the head so far (request line and headers not yet complete)
            self._head_begun = False  # a byte other than CR or LF of the head has come (empty lines before it count)
            self._head_tail = b""  # the last 3 bytes of the head so far: its end may be split across reads
            self._too_large: str | None = None  # the part over MAX_HEADER_BYTES that stopped the parser
            self._bad_reason: str | None = None  # what is wrong with the request that stopped the parser (the 400's)
            self._headers_seen = 0  # requests whose headers were complete
            self._trailer_bytes = 0
            self._framing_bytes = 0  # bytes of reads in a body that carried no body, chunk or message event (trailers)
            self._body_progress = False  # a body, chunk or message event came in the read being parsed
            self._in_headers = True
            self._message_open = False  # the parser has begun a request (its first byte) and not completed it
            self._refused = False
            self._pending_refusal: tuple[bytes, str, str, str] | None = None  # written once the answers before it are
            self._running: Any = None  # the cycle whose app runs (self.cycle is the one read last, maybe queued)
            self._ignored_upgrade = False  # the head parsed last asks for a protocol switch that is not made
            self._write_stall: asyncio.TimerHandle | None = None  # the deadline of a peer that takes no answer byte
            self._scrape_only = False  # beyond the open-file limit's room: only a scrape is answered (SCRAPE_ROOM)
            self._over_budget = False  # the request read on such a connection is not a scrape: refused 503
            self._direct: Any = None  # the cycle ``direct`` took, its body still coming
            self._unwritten: tuple[Any, int, list[tuple[bytes, bytes]], bytes] | None = None  # (see _write_direct)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # the answer is out; what the client still sends is dropped
            if (direct is not None and self._in_headers and not self._message_open and not self._head_begun
                    and self._answer_plain(data)):
                return  # one whole plain request of the direct route, answered without the parser
            in_headers, seen = self._in_headers, self._headers_seen
            if in_headers and not self.transport.is_closing():  # the head's bytes up to its end, before the parser
                size = self._header_bytes + self._head_part(data)
                if size > MAX_HEADER_BYTES:
                    self._refuse_too_large(HEAD_PART)
                    return
            self._body_progress = False
            self._feed(data)
            if self._refused:
                return  # refused by the parser's callbacks (431, 400) in this read
            if not self._in_headers and not self.transport.is_closing():
                # Trailers are counted field by field as the parser completes them (on_header), before the request
                # completes; a trailer (or chunk-size line) that goes on over many reads is not yet a field, and the
                # parser buffers it: the bytes of reads that brought no body and no chunk are counted as its bytes.
                self._framing_bytes = 0 if self._body_progress else self._framing_bytes + len(data)
                if self._framing_bytes > MAX_HEADER_BYTES:
                    self._refuse_too_large(FRAMING_PART)
                    return
            if self._headers_seen != seen:
                # a head begun in this read behind the request completed in it goes on in the next read: its end may
                # be split across the two (its bytes here are not counted: on_headers_complete holds it to its least)
                begun = self._in_headers and self._message_open
                self._header_bytes, self._head_begun, self._head_tail = 0, begun, data[-3:] if begun else b""
            elif in_headers and not self.transport.is_closing():  # every byte of it was request line or headers
                # the last 3 bytes of the head so far, also when this read holds fewer
                self._header_bytes, self._head_tail = size, (self._head_tail + data)[-3:]

        def _feed(self, data: bytes) -> None:
            """uvicorn's ``data_received``, serving a request with an ``Upgrade`` other than a WebSocket handshake as HTTP/1.1.

            httptools ends such a request at the end of its head, whatever its framing says, and stops: its
            body would be read as the next request. Its head is parsed again without ``Upgrade`` (so that the
            parser reads the body it announces), followed by the bytes after it.
            """
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as exc:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                if self._bad_reason is None and str(exc) in ("Invalid HTTP version", "Pause on PRI/Upgrade"):  # (h2's preface)
                    self._bad_reason = BAD_VERSION
                elif self._bad_reason is None and not isinstance(exc, httptools.HttpParserCallbackError) and str(exc):
                    self._bad_reason = f"{PARSER_SAYS}{str(exc)[:SHOWN_PARSER_ERROR]}"  # llhttp's reason, always short
                elif self._bad_reason is None and self.url[:1] not in (b"/", b"*"):
                    # uvicorn could not take a path from the target (an absolute URL without one, CONNECT's host:port)
                    shown = self.url.decode("latin-1")[:SHOWN_PARSER_ERROR]
                    self._bad_reason = f"the request target {shown!r} names no path that can be read: {TARGET_FORMS}"
                self.send_400_response(msg)
            except httptools.HttpParserUpgrade as exc:
                if not self._ignored_upgrade:
                    if self._should_upgrade():
                        self.handle_websocket_upgrade()
                    else:
                        self._unsupported_upgrade_warning()  # CONNECT: no tunnel; what follows is not read
                    return
                self._ignored_upgrade = False
                version = self.parser.get_http_version()
                head = [self.parser.get_method(), b" ", self.url, f" HTTP/{version}\r\n".encode()]
                for name, value in self.headers:
                    if name != b"upgrade":
                        head += [name, b": ", value, b"\r\n"]
                head.append(b"\r\n")
                self.parser = httptools.HttpRequestParser(self)
                self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn sets it
                self._feed(b"".join(head) + data[int(exc.args[0]):])

        def on_header(self, name: bytes, value: bytes) -> None:
            # llhttp keeps the whitespace after a field value, which is not part of it (RFC 9110 §5.5): without it,
            # "X-Market-ID: BTC " names the market BTC, and "X-Request-ID: ord-1 " is kept as ord-1
            if self._in_headers:  # (called per header of every request: the base method directly, no super())
                HttpToolsProtocol.on_header(self, name, value.rstrip(b" \t"))
                return
            self._trailer_bytes += len(name) + len(value) + 3  # a trailer: counted before the request can complete
            if self._trailer_bytes > MAX_HEADER_BYTES:
                self._too_large = TRAILERS_PART
                raise ValueError("trailers over the limit")  # the parser stops: send_400_response
            # A trailer is not a header (RFC 9110 §6.5.1: kept apart, or dropped): uvicorn appended it to the request's
            # headers, so a trailer Authorization passed the token check, and X-Market-ID or X-Request-ID were taken as
            # the request's, none of which a proxy before the service sees as headers. The service reads no trailer:
            # each is counted (the limit above) and dropped.

        def on_body(self, body: bytes) -> None:
            self._body_progress = True
            HttpToolsProtocol.on_body(self, body)

        def on_chunk_header(self) -> None:
            self._body_progress = True

        def on_chunk_complete(self) -> None:
            self._body_progress = True

        def _head_part(self, data: bytes) -> int:
            """Bytes of ``data`` that belong to the current head: up to its first empty line, or all of them."""
            start = 0
            if not self._head_begun:
                if data[:1] in (b"\r", b"\n"):  # empty lines before the request line: the parser skips them
                    start = len(data) - len(data.lstrip(b"\r\n"))
                self._head_begun = start < len(data)
                if not self._head_begun:
                    return len(data)
            elif self._head_tail:
                j = (self._head_tail + data[:3]).find(b"\r\n\r\n")
                if j >= 0:
                    return j + 4 - len(self._head_tail)
            j = data.find(b"\r\n\r\n", start)
            return len(data) if j < 0 else j + 4

        def _refuse_too_large(self, part: str) -> None:
            self._refuse(b"HTTP/1.1 431 Request Header Fields Too Large", "headers_too_large",
                         f"{part} exceed {MAX_HEADER_BYTES} bytes")

        def on_headers_complete(self) -> None:
            # Heads counted exactly in data_received are those that begin a read or go on from the last one; a head
            # that begins inside a read after another request is checked here, against the least it can have been:
            # the request line ("METHOD ", " HTTP/1.1" and CRLF), each field with ":" and CRLF, the final CRLF.
            size = (len(self.parser.get_method()) + 14 + len(self.url)
                    + sum(len(name) + len(value) + 3 for name, value in self.headers))
            if size > MAX_HEADER_BYTES:
                self._too_large = HEAD_PART
                raise ValueError("request line and headers over the limit")  # the parser stops: send_400_response
            # HTTP/2's version on HTTP/1's framing is neither protocol; a request line without a version is HTTP/0.9's
            # (llhttp reads it as 0.9), whose answer would be the bare body: neither is served as HTTP/1.1
            version = self.parser.get_http_version()
            if version in ("2.0", "0.9"):
                self._bad_reason = BAD_VERSION
                raise ValueError(BAD_VERSION)  # the parser stops: send_400_response
            framing = framing_problem(version, self.headers)
            if framing is not None:
                self._bad_reason = framing
                raise ValueError(framing)  # the parser stops: send_400_response
            if self._scrape_only and (self.parser.get_method(), self.url.split(b"?", 1)[0]) not in SCRAPE_TARGETS:
                self._over_budget = True
                raise ValueError("over the open-file limit's room")  # the parser stops: send_400_response refuses 503
            if version == "1.0" and self.parser.should_upgrade() and self._should_upgrade():
                self._bad_reason = "a WebSocket handshake must be an HTTP/1.1 request (RFC 6455)"
                raise ValueError(self._bad_reason)  # (uvicorn answered it 101, a 1xx an HTTP/1.0 client cannot read)
            if version == "1.0":
                # RFC 9110: an HTTP/1.0 request's Expect: 100-continue is ignored, and an HTTP/1.0 client is sent no
                # 1xx answer (it would read uvicorn's "100 Continue" as the answer, and the real one after it as junk)
                self.expect_100_continue = False
            if (self.parser.should_upgrade() and any(name == b"upgrade" for name, _ in self.headers)
                    and not (self._should_upgrade() and self.parser.get_method() == b"GET")):
                self._ignored_upgrade = True  # parsed again without Upgrade (see _feed): no request cycle for this one
                return
            self._in_headers = False
            self._headers_seen += 1
            self._trailer_bytes, self._framing_bytes = 0, 0
            self._body_progress = True  # the bytes of this read so far were the head's
            HttpToolsProtocol.on_headers_complete(self)
            cycle = self.cycle
            if self._scrape_only and cycle is not None:
                cycle.keep_alive = False  # the scrape's descriptor is given back once it is answered
            if cycle is not None and type(cycle) is RequestResponseCycle:  # (uvicorn makes the cycle; this adds to it)
                if cycle.more_body:  # its early answer's end
                    cycle.__class__ = _EarlyAnswerCycle
                    cycle.ending = self._end_unread  # type: ignore[attr-defined]
                else:
                    cycle.__class__ = _Cycle
                if draining is not None:
                    cycle.closing = self._drain_closes  # type: ignore[attr-defined]

        def _drain_closes(self, cycle: Any) -> bool:
            """Whether the answer of ``cycle`` about to start ends the connection: a stop's drain runs and no request
            read after it waits (that one's answer closes the connection, in its turn)."""
            return draining is not None and draining() and self.cycle is cycle

        def _end_unread(self) -> None:
            """End the connection after an answer given before the request's body came (see _EarlyAnswerCycle)."""
            if self.transport.is_closing():
                return
            self._refused = True  # what still comes is dropped
            self._disarm()
            self.flow.resume_reading()
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

        def send_400_response(self, msg: str) -> None:
            if self._over_budget:
                self._refuse(b"HTTP/1.1 503 Service Unavailable", "capacity", over_budget_message(max_open))
                return
            if self._too_large is not None:
                self._refuse_too_large(self._too_large)
                return
            reason = self._bad_reason or "the server could not parse it"
            self._refuse(b"HTTP/1.1 400 Bad Request", "bad_request", f"malformed HTTP request: {reason}")

        def _refused_request_id(self) -> str:
            """The id of the request being refused: the caller's ``X-Request-ID`` (the first, when valid) where the
            parser has begun this request and read that header of it, else a fresh one (``self.headers`` are the
            last request's until the next one begins)."""
            if self._message_open:
                for name, value in self.headers:
                    if name == b"x-request-id":
                        return accept_request_id(value.decode("latin-1"))
            return new_request_id()

        def _refuse(self, status_line: bytes, kind: str, message: str) -> None:
            """Answer a request refused before it has a request cycle, then close the connection."""
            rid = self._refused_request_id()
            if on_refused is not None:
                on_refused(kind)
            self._refused = True
            self._disarm()
            cycle = self.cycle
            if cycle is not None and cycle.more_body and any(c is cycle for c, _ in self.pipeline):
                # the refused bytes are the body of a request still queued behind others: it is never run
                self.pipeline = collections.deque(p for p in self.pipeline if p[0] is not cycle)
                self._pending_refusal = (status_line, kind, message, rid)
                return
            in_flight = cycle is not None and not cycle.response_complete
            if self.pipeline or (in_flight and cycle is not None and not cycle.more_body):
                # whole requests before it are still being answered: answer them first, in order, then this one
                self._pending_refusal = (status_line, kind, message, rid)
                return
            if in_flight and cycle is not None:  # the bad bytes are this request's own body: its app may still write
                if not cycle.response_started:
                    self.transport.write(refusal(status_line, kind, message, request_id=rid))
                self.transport.close()
                return
            self._write_refusal(status_line, kind, message, rid)

        def _write_refusal(self, status_line: bytes, kind: str, message: str, rid: str) -> None:
            retry = [(b"retry-after", b"1")] if kind == "capacity" else []
            self.transport.write(refusal(status_line, kind, message, retry, request_id=rid))
            # Closing now, with the client's bytes unread, would reset the connection and could lose the answer:
            # end our side, drop what still comes, and close when the client does (or after LINGER_S).
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

        def on_response_complete(self) -> None:
            pending = self._pending_refusal
            if pending is None or self.pipeline:
                # Requests read already wait their turn: read no more until they are answered (see _PipelineFlow), so
                # that a client that pipelines without reading its answers cannot queue requests without bound.
                super().on_response_complete()  # (starts the next one: reading resumes once none waits)
                if not self.transport.is_closing():
                    self.flow.resume_reading()
                return
            self._pending_refusal = None
            self.server_state.total_requests += 1
            if not self.transport.is_closing():
                self.flow.resume_reading()  # what the client still sends is read and dropped until it closes
                self._write_refusal(*pending)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.flow = _PipelineFlow(transport, lambda: bool(self.pipeline))
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
            if max_open is not None and max_open < len(self.connections) <= max_open + SCRAPE_ROOM:
                self._scrape_only = True  # its request is read: a scrape is answered, anything else refused
                self._unset_keepalive_if_required()
                self.timeout_keep_alive_task = self.loop.call_later(SCRAPE_WAIT_S, self.timeout_keep_alive_handler)
            elif max_open is not None and len(self.connections) > max_open:
                if on_refused is not None:
                    on_refused("capacity")
                self._refused = True
                # closed at once (no linger as for a refused request): the descriptor is what is short
                self.transport.write(refusal(b"HTTP/1.1 503 Service Unavailable", "capacity",
                                             over_budget_message(max_open), [(b"retry-after", b"1")]))
                self.transport.close()

        def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio.Protocol allows a bool
            """A client that shuts down its sending side (TCP half-close) after whole requests gets their answers, the
            last with ``Connection: close``, then the socket closes. uvicorn closed it at once: a tick read in full
            was applied and its answer lost. A request still incomplete can no longer complete: it is not run (a
            body being read by its app ends in a disconnect, as before); nothing left to answer closes at once."""
            if self.transport.is_closing():
                return None
            if self._refused:  # a refusal waiting for the answers before it is written after them
                return True if self._pending_refusal is not None else None
            cycle = self.cycle
            last = cycle
            if cycle is not None and cycle.more_body and not cycle.response_complete:
                if not any(c is cycle for c, _ in self.pipeline):
                    return None  # its app reads the body that will not come: it sees a disconnect
                self.pipeline = collections.deque(p for p in self.pipeline if p[0] is not cycle)  # never run
                last = self.pipeline[0][0] if self.pipeline else self._running
            if last is None or (last.response_complete and not self.pipeline):
                return None
            self._disarm()  # a head begun after the last whole request never completes: no 408 for it
            last.keep_alive = False  # its answer says Connection: close, and closes the socket once written
            return True

        def pause_writing(self) -> None:
            """The peer does not take its answers as fast as they are written: it gets ``server.request_timeout`` to
            take a byte of them, else the connection is cut off (see :meth:`_write_stalled`)."""
            super().pause_writing()
            self._arm_write_stall(self.transport.get_write_buffer_size())

        def resume_writing(self) -> None:
            self._disarm_write_stall()
            super().resume_writing()
            unwritten, self._unwritten = self._unwritten, None
            if unwritten is not None:
                self._write_direct(*unwritten)

        def _arm_write_stall(self, queued: int) -> None:
            self._disarm_write_stall()
            self._write_stall = self.loop.call_later(request_timeout, self._write_stalled, queued)

        def _disarm_write_stall(self) -> None:
            if self._write_stall is not None:
                self._write_stall.cancel()
                self._write_stall = None

        def _write_stalled(self, queued: int) -> None:
            """No byte of the answers waiting to be written was taken by the peer for ``server.request_timeout``: cut
            the connection off. Its answer would wait forever (neither deadline runs while an answer is written, and
            a graceful close waits for the buffer to drain), holding its slot of ``server.max_connections``, its
            request's task and the buffered answer; a peer that reads, however slowly, is given the time it takes."""
            self._write_stall = None
            left = self.transport.get_write_buffer_size()
            if left and left < queued:
                self._arm_write_stall(left)  # it took some: another deadline from here
                return
            if left:
                self.logger.debug("connection cut off: the peer took no byte of its answer in %g s", request_timeout)
                self.transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            self._undirect()
            self._unwritten = None
            self._disarm()
            self._disarm_write_stall()
            super().connection_lost(exc)  # (marks only self.cycle disconnected)
            running = self._running
            if running is not None and running is not self.cycle and not running.response_complete:
                # a pipelined request being answered: its answer is dropped (uvloop raises on a write to a
                # closed transport, which would be logged as an unexpected error)
                running.disconnected = True
                running.message_event.set()

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            self._running = cycle
            if direct is not None and app is self.app and not cycle.waiting_for_100_continue and direct.eligible(cycle.scope):
                if cycle.more_body:
                    self._direct = cycle  # answered once on_message_complete has come
                else:
                    self._answer_direct(cycle)  # (a pipelined request, read whole while the one before it ran)
                return
            super()._start_asgi_task(cycle, app)

        def _answer_plain(self, data: bytes) -> bool:
            """Have ``direct`` answer ``data`` when it is one whole ``POST`` to its route written plainly
            (:func:`.plainhead.read_plain_request`), nothing else is under way on the connection and the route takes
            it; False, nothing done, otherwise (the parser reads ``data``). The request gets the cycle and scope
            uvicorn would have built, and no request deadline: its bytes are all here."""
            cycle = self.cycle
            if ((cycle is not None and not cycle.response_complete) or self.pipeline or self._scrape_only
                    or self.transport.is_closing()):
                return False
            read = read_plain_request(data, plain_line, MAX_HEADER_BYTES)
            if read is None:
                return False
            if self.limit_concurrency is not None and (len(self.connections) >= self.limit_concurrency
                                                       or len(self.tasks) >= self.limit_concurrency):
                return False  # (uvicorn's own 503)
            headers, start = read
            scope: Any = {"type": "http", "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
                          "http_version": "1.1", "server": self.server, "client": self.client, "scheme": self.scheme,
                          "root_path": self.root_path, "headers": headers, "state": self.app_state.copy(),
                          "method": "POST", "path": self.root_path + plain_path,
                          "raw_path": self.root_path.encode("ascii") + plain_target, "query_string": b""}
            if not direct.eligible(scope):  # type: ignore[union-attr]  # (set: checked by the caller)
                return False
            self._unset_keepalive_if_required()
            cycle = _Cycle(scope=scope, transport=self.transport, flow=self.flow, logger=self.logger,
                           access_logger=self.access_logger, access_log=self.access_log,
                           default_headers=self.server_state.default_headers, message_event=asyncio.Event(),
                           expect_100_continue=False, keep_alive=True, on_response=self.on_response_complete)
            cycle.more_body = False
            if draining is not None:
                cycle.closing = self._drain_closes
            self.cycle = self._running = cycle
            self._hand_to_direct(cycle, data[start:])
            return True

        def _answer_direct(self, cycle: Any) -> None:
            """Have ``direct`` answer ``cycle`` from the loop's next round, as a task would: the requests behind it
            in the bytes being parsed are read (and queued behind it) first, and none is run after an answer that
            closes the connection."""
            self._direct = None
            self.loop.call_soon(self._run_direct, cycle)

        def _run_direct(self, cycle: Any) -> None:
            if cycle.disconnected:  # gone before its turn: the app's way, which reads the disconnect (the tick unapplied)
                HttpToolsProtocol._start_asgi_task(self, cycle, self.app)
                return
            self._hand_to_direct(cycle, bytes(cycle.body))

        def _hand_to_direct(self, cycle: Any, body: bytes) -> None:
            """``direct`` answers ``cycle``'s request, whose whole ``body`` has come, through :meth:`_write_direct`."""
            direct.answer(cycle.scope, body,  # type: ignore[union-attr]  # (set: the cycle was taken by it)
                          lambda status, headers, answer: self._write_direct(cycle, status, headers, answer))

        def _undirect(self) -> None:
            """Hand a request taken by ``direct`` whose body will not come to the app (which sees the timeout or the
            disconnect, and counts it, as for any request)."""
            cycle, self._direct = self._direct, None
            if cycle is not None:
                HttpToolsProtocol._start_asgi_task(self, cycle, self.app)

        def _write_direct(self, cycle: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
            """Write a whole answer of ``direct`` as the cycle's ``send`` would (its default headers first; the
            connection closed after it unless kept alive), then complete the cycle (the next pipelined request)."""
            if cycle.disconnected or cycle.response_started:
                return
            if self.flow.write_paused:  # written once the peer has taken what is queued, as the cycle's send waits
                self._unwritten = (cycle, status, headers, body)  # (the next request starts only after it)
                return
            says_close = (b"connection", b"close") in headers
            if cycle.keep_alive and (says_close or (cycle.closing is not None and cycle.closing(cycle))):
                cycle.keep_alive = False  # (the answer's own Connection: close, or a stop's drain, as _Cycle.send)
            closing = [] if cycle.keep_alive or says_close else [(b"connection", b"close")]
            cycle.response_started = True
            self.transport.write(raw_answer(STATUS_LINE[status][:-2],  # (uvicorn's status line, without its CRLF)
                                            [*cycle.default_headers, *headers, *closing], body))
            cycle.response_complete = True
            cycle.message_event.set()
            if not cycle.keep_alive:
                self.transport.close()
            cycle.on_response()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._message_open = True
            self._arm()

        def on_message_complete(self) -> None:
            if self._ignored_upgrade:
                return  # the end httptools gives a head with Upgrade (see _feed)
            self._body_progress = True
            super().on_message_complete()
            self._disarm()
            self._in_headers = True
            self._message_open = False
            cycle = self._direct
            if cycle is not None and cycle is self.cycle and not cycle.more_body:
                self._answer_direct(cycle)

        def handle_websocket_upgrade(self) -> None:
            self._disarm()
            super().handle_websocket_upgrade()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(request_timeout, self._timed_out)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _timed_out(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            self._undirect()
            cycle = self.cycle
            headers_done = cycle is not None and cycle.scope is self.scope
            if not headers_done and cycle is not None and not cycle.response_complete:
                self._arm()  # a pipelined request behind one still answered: wait for that answer first
                return
            if on_timeout is not None:
                on_timeout("body" if headers_done else "headers")
            if not headers_done:
                headers, body = timeout_response(new_request_id(), request_timeout)
                self.transport.write(raw_answer(b"HTTP/1.1 408 Request Timeout", headers, body))
                self.transport.close()
                return
            assert cycle is not None
            if cycle.response_started or self.pipeline:
                self.transport.close()  # already answered (or not the request being served): just stop reading
                return
            self.scope[SCOPE_TIMED_OUT] = True  # type: ignore[literal-required]
            rid = str(self.scope.get(SCOPE_REQUEST_ID) or new_request_id())
            headers, body = timeout_response(rid, request_timeout)
            self.loop.create_task(self._answer(cycle, headers, body))

        async def _answer(self, cycle: Any, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
            """Answer 408 through the request's own cycle (the app, waiting for the body, then sees a disconnect)."""
            if cycle.response_started or self.transport.is_closing():
                return
            await cycle.send({"type": "http.response.start", "status": 408, "headers": headers})
            await cycle.send({"type": "http.response.body", "body": body, "more_body": False})

    return GuardedHttpToolsProtocol


# Error type of a WebSocket handshake refused by the websockets library, by HTTP status.
HANDSHAKE_REFUSALS = {400: "bad_request", 403: "forbidden", 426: "bad_request", 500: "internal"}
_WEBSOCKETS_PREFIX = "Failed to open a WebSocket connection: "


class JsonRefusingServerProtocol(ServerProtocol):
    """websockets' server handshake, its refusals (a malformed handshake: 400, 426; a socket the app closed before
    accepting it: 403; an app error: 500) answered in the service's JSON error shape with ``X-Request-ID``
    instead of plain text."""

    on_refused: Callable[[str], None] | None = None  # called with the error type of each refusal (the errors metric)
    handshake: Request | None = None  # the handshake request being answered (None until its head is read)

    def accept(self, request: Request) -> Response:
        self.handshake = request
        return super().accept(request)

    def reject(self, status: Any, text: str) -> Response:
        response = super().reject(status, text)
        reason = text.strip().removeprefix(_WEBSOCKETS_PREFIX).strip().rstrip(".") or response.reason_phrase.lower()
        sent = self.handshake.headers.get_all("X-Request-ID") if self.handshake is not None else []
        request_id = accept_request_id(sent[0].strip() if sent else None)  # the caller's, as in every answer
        kind = HANDSHAKE_REFUSALS.get(response.status_code, "bad_request")
        if self.on_refused is not None:
            self.on_refused(kind)
        body = json.dumps(error_payload(kind, f"WebSocket handshake refused: {reason}", request_id)).encode()
        for name in ("Content-Type", "Content-Length"):
            del response.headers[name]
        response.headers["Content-Type"] = "application/json"
        response.headers["Content-Length"] = str(len(body))
        response.headers["X-Request-ID"] = request_id
        response.body = body
        return response


class DenialAwareWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, knowing that a handshake answered with an HTTP response (a denial, such as the
    JSON 503 at ``server.max_connections``) is complete: uvicorn would log every denial as an ERROR ("returned
    without completing handshake"), so anyone could fill the error log by opening sockets. Handshakes the
    websockets library refuses are answered with the JSON error shape (:class:`JsonRefusingServerProtocol`).

    Two things a peer that does not read could do to uvicorn's protocol are bounded here:

    * uvicorn answers every ping with a pong written at once, whether or not the peer reads: a client
      sending pings and never reading grew the server's write buffer without limit (about 150 MB for 190 MB
      of pings in 20 s). While the write buffer is over its high-water mark the peer's frames are not read.
    * a keepalive ping the peer does not answer closes the connection, but gracefully: with unread data in
      the write buffer the socket (and its slot of ``server.max_connections``, and the stream's task) stayed
      open forever. A peer past its pong deadline that then reads nothing for another deadline is cut off; one
      that reads, however slowly, gets every answer queued before the close.

    A peer that half-closes its socket after its last tick gets every answer before the socket closes
    (:meth:`eof_received`). A handshake websockets cannot read gets a JSON ``400`` (:meth:`_refuse_unreadable_handshake`).
    At a stop, a tick being answered is answered before the close (:meth:`shutdown`).
    """

    on_refused: Callable[[str], None] | None = None  # called with the error type of each handshake refused here

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn built the handshake object from its settings (extensions, message size); the subclass adds no
        # state, only its refusals, so the object keeps every setting and changes class.
        self.conn.__class__ = JsonRefusingServerProtocol
        self.conn.on_refused = self.on_refused  # type: ignore[attr-defined]
        self.paused_for_writes = False  # reading stopped because the peer does not read what it is sent
        self.app_reading = False  # the app waits in receive() (else, after the handshake, it answers a message)
        self.stop_pending: asyncio.TimerHandle | None = None  # a stop waits for the answer being written (shutdown)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.handshake_initiated and self.conn.handshake_exc is not None and not self.transport.is_closing():
            self._refuse_unreadable_handshake(self.conn.handshake_exc)
            return
        if not self.writable.is_set() and not self.paused_for_writes and not self.transport.is_closing():
            self.paused_for_writes = True
            if not self.read_paused:
                self.transport.pause_reading()

    def _refuse_unreadable_handshake(self, exc: BaseException) -> None:
        """Answer ``400 bad_request`` to a handshake request websockets cannot read (one with a body or a
        ``Transfer-Encoding``): websockets only ends its side, and uvicorn wrote nothing, so the client waited for an
        answer, and the socket held its slot of ``server.max_connections``, until the client gave up."""
        self.handshake_complete = self.close_sent = True  # answered: nothing more to send on shutdown
        if self.on_refused is not None:
            self.on_refused("bad_request")
        reason = str(exc.__cause__ or exc) or type(exc).__name__
        self.transport.write(refusal(b"HTTP/1.1 400 Bad Request", "bad_request", f"WebSocket handshake refused: {reason}"))
        if self.transport.can_write_eof():  # as for HTTP refusals: the body still coming is dropped, not reset
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.paused_for_writes:
            self.paused_for_writes = False
            if not self.read_paused and not self.transport.is_closing():
                self.transport.resume_reading()

    async def receive(self) -> Any:
        if self.stop_pending is not None:  # the answer the stop waited for is written: close now
            if not self.disconnected and not self.transport.is_closing():
                return self._stop_after_answer()
            self.stop_pending.cancel()  # (gone meanwhile: its disconnect is queued)
            self.stop_pending = None
        self.app_reading = True
        try:
            message = await self.queue.get()
        finally:
            self.app_reading = False
        if self.read_paused and self.queue.empty():
            self.read_paused = False
            if not self.paused_for_writes:
                self.transport.resume_reading()
        return message

    def shutdown(self) -> None:
        """The server stops: uvicorn closes every stream at once with 1012. A stream whose app is answering a message
        it took (a tick being stepped) closes with 1012 once that answer is written instead, at the latest after
        :data:`STOP_ANSWER_S`: closed at once, the tick was applied and its answer lost. Messages read but not yet
        taken by the app are dropped then (never applied), as at once."""
        if (self.handshake_complete and not self.close_sent and not self.disconnected and not self.app_reading
                and self.stop_pending is None and not self.transport.is_closing()):
            self.stop_keepalive()
            self.stop_pending = self.loop.call_later(STOP_ANSWER_S, self._stop_anyway)
            return
        super().shutdown()

    def _stop_anyway(self) -> None:
        self.stop_pending = None
        if not self.transport.is_closing():
            super().shutdown()

    def _stop_after_answer(self) -> Any:
        handle, self.stop_pending = self.stop_pending, None
        if handle is not None:
            handle.cancel()
        while not self.queue.empty():  # read but not taken: never applied
            self.queue.get_nowait()
        super().shutdown()  # close 1012, queue the disconnect, close the socket
        return self.queue.get_nowait()

    def keepalive_timeout(self) -> None:
        """The pong deadline passed: uvicorn's close (1011), queued behind the answers already written, so a peer
        that reads slowly still gets them; a peer that then reads nothing at all for another deadline is cut off
        (the graceful close would wait for it forever)."""
        super().keepalive_timeout()
        self._cut_off_unless_read(self.transport.get_write_buffer_size())

    def _cut_off_unless_read(self, queued: int) -> None:
        def check() -> None:
            if self.disconnected:
                return
            left = self.transport.get_write_buffer_size()
            if left and left >= queued:  # not one byte read by the peer meanwhile
                self.transport.abort()
            elif left:
                self._cut_off_unless_read(left)

        self.loop.call_later(self.ping_timeout or STALLED_PEER_S, check)

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio.Protocol allows a bool
        """A peer that shuts down its sending side (TCP half-close, no close frame) still gets the answers to the
        messages it sent, then the socket is closed: uvicorn closed it at once, and ticks already read were applied
        with their answers lost."""
        if self.handshake_complete and not self.close_sent and not self.disconnected:
            self.queue.put_nowait({"type": "websocket.disconnect", "code": 1006})  # after the messages already read
            return True  # keep the socket open for the answers; the app's end closes it
        return None

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True

    def send_receive_event_to_app(self) -> None:
        """A text message that is not UTF-8 closes the socket with 1007, as uvicorn does, without its ERROR line and
        traceback per message (any client could fill the error log with them)."""
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                b"".join(self.frames).decode()
            except UnicodeDecodeError as exc:
                self.frames = []
                self.logger.info("WebSocket text message is not UTF-8 (byte %d): closed with 1007", exc.start)
                self.conn.send_close(1007, "text message is not UTF-8")
                self.handle_parser_exception()
                return
        super().send_receive_event_to_app()


def websocket_protocol(on_refused: Callable[[str], None] | None = None) -> type[DenialAwareWebSocketProtocol]:
    """The WebSocket protocol class for ``uvicorn.Config(ws=...)``; ``on_refused(kind)`` is called per handshake
    refused below the app (``"bad_request"`` and the like, as the answer's ``error.type``)."""

    class CountingWebSocketProtocol(DenialAwareWebSocketProtocol):
        pass

    CountingWebSocketProtocol.on_refused = staticmethod(on_refused) if on_refused is not None else None
    return CountingWebSocketProtocol
