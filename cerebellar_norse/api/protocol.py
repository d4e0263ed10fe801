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


def guarded_protocol(request_timeout: float, on_timeout: Callable[[str], None] | None = None) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``; ``on_timeout(phase)`` is called per cut-off request
    (``phase`` is ``"headers"`` or ``"body"``)."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

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
