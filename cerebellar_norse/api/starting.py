"""The service's port while it starts: bound at once, every request answered ``503`` until the app serves it.

Starting can take a while (loading and verifying the model, training one on generated data
on a fresh state dir, restoring market states and replaying the journal, warming the
kernels up). The port is bound first, and until uvicorn serves it, :class:`StartingResponder`
answers on it, from a thread of its own: ``GET``/``HEAD /health`` with the health body's
``"status": "unavailable"`` and a ``reason`` naming the stage (``starting: …``), every other
request with the ``capacity`` error shape and ``Retry-After``, each on a connection it then
closes. So a probe, a load balancer or ``curl -f`` sees ``503`` rather than a refused
connection, and a second service on the same port fails at once naming the port.

:meth:`StartingResponder.stop` hands the socket over: connections that arrive between its
stop and uvicorn's first accept wait in the socket's backlog.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
import time

from prometheus_client import CONTENT_TYPE_LATEST

from .. import __version__
from ..config import listen_address
from ..errors import StartupError
from ..observability import systemd
from ..observability.context import accept_request_id
from ..observability.metrics import starting_exposition
from .protocol import closing_headers, json_answer, raw_answer
from .schemas import error_payload

MAX_HEAD = 65_536  # request line and headers (bytes) read before answering anyway
MAX_BODY = 1 << 20  # a body up to this is read before the answer, so that closing does not reset the connection
LINGER_S = 2.0  # a connection is closed this long after its answer, when the client has not closed it first
HEAD_TIMEOUT_S = 10.0  # a request not complete this long after its connection is answered all the same
RETRY_AFTER_S = 2
BACKLOG = 2048  # connections the kernel completes and queues before they are accepted (uvicorn's --backlog default)


def shown_address(host: str, port: int) -> str:
    """``host:port`` as a URL writes it (``[::1]:8080``)."""
    name = listen_address(host)
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


def bind_listener(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """A TCP socket listening on ``host``:``port`` (an IPv4 or IPv6 address, with or without brackets, or a name's IPv4
    address; ``::`` takes IPv4 connections too); StartupError naming the address when it cannot be bound (in use, not
    an address of this host, a privileged port, a name that does not resolve)."""
    name = listen_address(host)
    family = socket.AF_INET6 if ":" in name else socket.AF_INET  # (a name listens on its IPv4 address)
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:  # an IPv6 address on a kernel without IPv6, no descriptor left
        raise StartupError(f"cannot listen on {shown_address(host, port)}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # dual stack on "::" whatever net.ipv6.bindv6only says
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((name, port))
        sock.listen(backlog)
    except socket.gaierror as exc:
        sock.close()
        raise StartupError(f"cannot listen on {shown_address(host, port)}: {exc.strerror or exc} (server.host is neither "
                           "an address nor a name with an IPv4 address on this host)") from None
    except OSError as exc:
        sock.close()
        why = exc.strerror or str(exc)
        hint = {errno.EADDRINUSE: f" (another process listens on it: `ss -ltnp | grep :{port}`)",
                errno.EACCES: " (ports below 1024 need privileges)",
                errno.EADDRNOTAVAIL: " (not an address of this host: check server.host)"}.get(exc.errno or 0, "")
        raise StartupError(f"cannot listen on {shown_address(host, port)}: {why}{hint}") from None
    return sock


class StartingResponder:
    """Answers ``503`` on ``sock`` from its own thread until :meth:`stop`; :attr:`reason` names the stage.

    Each stage set is also the status line of ``systemctl status`` (sd_notify ``STATUS=starting: …``): a start that
    trains its first model or compiles its kernels takes a minute or more, shown as ``activating (start)`` with no line
    saying why.
    """

    def __init__(self, sock: socket.socket, backlog: int = BACKLOG) -> None:
        self.sock = sock
        self.backlog = backlog  # the listening socket's, kept: serving it listens on it again
        self._reason = "starting"
        self.started = time.monotonic()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self.open: set[_Answer] = set()  # connections accepted and not yet closed (on the responder's loop)
        self._thread = threading.Thread(target=self._run, name="starting-503", daemon=True)

    @property
    def reason(self) -> str:
        """The stage of the start, as ``/health`` and the status line name it (``starting: <reason>``)."""
        return self._reason

    @reason.setter
    def reason(self, text: str) -> None:
        self._reason = text
        systemd.status(f"starting: {text}")

    def start(self) -> StartingResponder:
        """Start answering (returns once the socket is served)."""
        self._thread.start()
        self._ready.wait(10.0)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve() -> None:
            # a duplicate descriptor: closing this server leaves the socket itself listening for uvicorn. The server
            # calls listen() on it again, with its own backlog unless told (asyncio's 100): the socket's backlog would
            # stay 100 for the life of the service, and a burst of connects beyond it waited for SYN retransmits
            self._server = await self._loop.create_server(lambda: _Answer(self), sock=self.sock.dup(),
                                                          backlog=self.backlog)
            self._ready.set()

        self._loop.run_until_complete(serve())
        self._loop.run_forever()
        self._loop.close()

    def stop(self) -> None:
        """Stop answering (idempotent); the socket stays open and listening."""
        if not self._thread.is_alive():
            return

        def stop_accepting() -> None:
            # Accept no more (uvicorn takes the backlog over), but let the connections accepted already get their
            # transports: closing the server first would drop those without an answer.
            if self._server is not None:
                for listener in self._server.sockets:
                    self._loop.remove_reader(listener.fileno())
            self._loop.call_later(0.05, finish)

        def finish() -> None:
            for conn in list(self.open):  # answered now, or closed: none is left open and unanswered
                conn.finish()
            if self._server is not None:
                self._server.close()
            self._loop.call_later(0.05, self._loop.stop)  # the closed connections' sockets are closed first

        self._loop.call_soon_threadsafe(stop_accepting)
        self._thread.join(10.0)

    def answer(self, method: bytes, path: bytes, request_id: str | None = None) -> bytes:
        """The whole HTTP response to a request line's ``method`` and ``path``; ``request_id``: the request's
        ``X-Request-ID`` header (kept when valid, as the service does: a client's error names its own id)."""
        rid = accept_request_id(request_id)
        reason = f"starting: {self.reason}" if self.reason != "starting" else "starting"
        route = path.split(b"?", 1)[0]
        if route == b"/metrics" and method in (b"GET", b"HEAD"):  # up, not ready: a start is not an outage
            body = starting_exposition(time.monotonic() - self.started)
            headers = closing_headers(CONTENT_TYPE_LATEST.encode(), body, rid)
            return raw_answer(b"HTTP/1.1 200 OK", headers, b"" if method == b"HEAD" else body)
        if route == b"/health" and method in (b"GET", b"HEAD"):
            headers, body = json_answer({"status": "unavailable", "reason": reason, "version": __version__,
                                         "uptime_s": round(time.monotonic() - self.started, 3)}, rid)
        else:
            headers, body = json_answer(error_payload("capacity", f"the service is {reason}; retry later", rid), rid,
                                        [(b"retry-after", str(RETRY_AFTER_S).encode())])
        return raw_answer(b"HTTP/1.1 503 Service Unavailable", headers, b"" if method == b"HEAD" else body)


def _request_id(header_lines: list[bytes]) -> str | None:
    """The value of the first ``X-Request-ID`` among a request's header lines, or None."""
    for line in header_lines:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"x-request-id":
            return value.strip().decode("latin-1")
    return None


class _Answer(asyncio.Protocol):
    """One connection: read the request's head (and a small body), answer 503, close."""

    def __init__(self, responder: StartingResponder) -> None:
        self.responder = responder
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.responder.open.add(self)
        asyncio.get_running_loop().call_later(HEAD_TIMEOUT_S, self._deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        self.responder.open.discard(self)

    def _deadline(self) -> None:
        if not self.answered and self.transport is not None and not self.transport.is_closing():
            self._reply()

    def finish(self) -> None:
        """Answer (when not yet answered) and close now: the responder stops."""
        if self.transport is None or self.transport.is_closing():
            return
        if not self.answered:
            self._reply()
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.answered or self.transport is None:
            return
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD:
                self._reply()
            return
        length = 0
        for line in self.buf[:end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length" and value.strip().isdigit():
                length = int(value.strip())
            elif name == b"expect" and value.strip().lower() == b"100-continue":
                length = 0  # the client sends its body after a 100 Continue, never sent here: the 503 is the answer
                break
        if len(self.buf) - end - 4 >= min(length, MAX_BODY):
            self._reply()

    def _reply(self) -> None:
        assert self.transport is not None
        self.answered = True
        lines = self.buf.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
        parts = lines[0].split(b" ")
        self.transport.write(self.responder.answer(parts[0], parts[1] if len(parts) > 1 else b"", _request_id(lines[1:])))
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client reads the answer, then closes
        asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)

    def eof_received(self) -> bool | None:
        if not self.answered:
            self._reply()
        return None
