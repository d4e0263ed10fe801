"""uvicorn's httptools protocol with a deadline on reading each request (slow clients are cut off).

uvicorn times out idle keep-alive connections only after a first response: a socket that
connects and never sends, or sends part of a request's headers or body and stalls,
holds its connection (and a slot of ``server.max_connections``) forever. This protocol
adds two deadlines:

* a connection with no request begun is closed after ``server.keep_alive_timeout``, as
  an idle keep-alive connection is;
* once a request's first byte arrives, its headers and body must be complete within
  ``server.request_timeout``; otherwise it is answered ``408`` with the JSON error
  shape (``request_timeout``, with ``X-Request-ID``) and the connection is closed.

It also sends each response's head and body in one write (:class:`CoalescingWriter`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..observability.context import new_request_id
from .deps import SCOPE_REQUEST_ID, SCOPE_TIMED_OUT
from .schemas import error_payload


def timeout_response(request_id: str, timeout_s: float) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and body of the 408 answer."""
    body = json.dumps(error_payload(
        "request_timeout", f"the request did not arrive completely within server.request_timeout ({timeout_s:g} s)",
        request_id)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), (b"x-request-id", request_id.encode("latin-1"))]
    return headers, body


class CoalescingWriter:
    """The transport as uvicorn's response cycles see it: a response's head goes out with its body.

    uvicorn writes the head at ``http.response.start`` and the body at the first
    ``http.response.body``: two ``send(2)`` calls and, with ``TCP_NODELAY``, two segments
    that can wake the client twice. Here a write finding nothing held is held until the
    next write (sent with it, as one) or the loop's next pass, whichever comes first, so a
    head is never held back longer than one pass (a 100 Continue, a streamed chunk or a
    ``HEAD`` answer still leaves at once). Everything else is the transport's.
    """

    __slots__ = ("_handle", "_held", "_loop", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._handle: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is None:
            if data:
                self._held = bytes(data)
                self._handle = self._loop.call_soon(self.flush)
            return
        held, self._held = self._held, None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.transport.write(b"".join((held, data)))

    def flush(self) -> None:
        """Send what is held now."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._held is not None:
            held, self._held = self._held, None
            if not self.transport.is_closing():
                self.transport.write(held)

    def discard(self) -> None:
        """Drop what is held (the connection is gone)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._held = None

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def guarded_protocol(request_timeout: float, on_timeout: Callable[[str], None] | None = None) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``; ``on_timeout(phase)`` is called per cut-off request
    (``phase`` is ``"headers"`` or ``"body"``)."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._deadline: asyncio.TimerHandle | None = None
            self._writer: CoalescingWriter | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._writer = CoalescingWriter(transport, self.loop)
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._writer is not None:
                self._writer.discard()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            if self.cycle is not None and self._writer is not None:
                self.cycle.transport = self._writer  # type: ignore[assignment]

        def on_response_complete(self) -> None:
            if self._writer is not None:
                self._writer.flush()
            super().on_response_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()

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
            cycle = self.cycle
            headers_done = cycle is not None and cycle.scope is self.scope
            if not headers_done and cycle is not None and not cycle.response_complete:
                self._arm()  # a pipelined request behind one still answered: wait for that answer first
                return
            if on_timeout is not None:
                on_timeout("body" if headers_done else "headers")
            if not headers_done:
                headers, body = timeout_response(new_request_id(), request_timeout)
                head = b"HTTP/1.1 408 Request Timeout\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
                self.transport.write(head + b"\r\n" + body)
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
