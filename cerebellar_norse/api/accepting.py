"""Accepting the service's connections: a failed accept for want of a descriptor backs off instead of spinning.

uvloop's own server (libuv) answers an ``accept`` that fails for want of a file descriptor
(EMFILE, ENFILE) by trying again at the next turn of the loop: the listening socket stays
readable, so while the shortage lasted the service spun a whole core on failed accepts,
and said nothing. :class:`Acceptor` accepts on the socket itself, as asyncio's own accept
loop does: such a failure (or ENOBUFS, ENOMEM, or an error the socket should not have)
stops accepting for :data:`ACCEPT_RETRY_S` (the connections wait in the socket's backlog),
one WARNING says so per run of failures, and one INFO line when a connection is accepted
again. An error of the one connection being accepted (a network error pending on it, a
firewall's EPERM: :data:`CONNECTION_GONE`) passes that connection over and goes on. Each accepted socket is handed to
the loop (``connect_accepted_socket``) with uvicorn's protocol, as its server would.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Callable

log = logging.getLogger("cerebellar_norse.server")

ACCEPT_RETRY_S = 1.0  # asyncio's constants.ACCEPT_RETRY_DELAY
SHORTAGE = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)  # passes once the host frees something
# What Linux's accept() returns for one connection's own network error, pending on it before it was accepted
# (accept(2): "treat them like EAGAIN by retrying"), and EPERM for one a firewall rule refuses: that connection is
# gone, the next ones are accepted at once
CONNECTION_GONE = (errno.ENETDOWN, errno.EPROTO, errno.ENOPROTOOPT, errno.EHOSTDOWN, errno.ENONET, errno.EHOSTUNREACH,
                   errno.EOPNOTSUPP, errno.ENETUNREACH, errno.EPERM)


class Acceptor:
    """Accepts connections on a listening ``sock`` for the running loop (an ``asyncio.Server`` to uvicorn: ``close``,
    ``wait_closed``); ``protocol_factory`` makes each connection's protocol."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 protocol_factory: Callable[[], asyncio.BaseProtocol]) -> None:
        self._loop = loop
        self.sock = sock
        self._factory = protocol_factory
        self._closed = False
        self._reading = False
        self._failing_since: float | None = None  # the first failed accept of the current run of failures
        self._failures = 0
        self.pauses = 0  # how often accepting stopped for ACCEPT_RETRY_S (a counter for tests)
        self._retry: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> Acceptor:
        self.sock.setblocking(False)
        self._resume()
        return self

    def _resume(self) -> None:
        self._retry = None
        if not self._closed and not self._reading:
            self._loop.add_reader(self.sock.fileno(), self._on_readable)
            self._reading = True

    def _pause(self) -> None:
        self._stop_reading()
        self.pauses += 1
        self._retry = self._loop.call_later(ACCEPT_RETRY_S, self._resume)

    def _accept(self) -> tuple[socket.socket, object]:
        """One ``accept`` (a seam for tests)."""
        return self.sock.accept()

    def _on_readable(self) -> None:
        try:
            conn, _addr = self._accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):  # (aborted: the client gave up first)
            return
        except OSError as exc:
            if exc.errno in CONNECTION_GONE:  # (the socket stays readable while more connections wait)
                log.debug("a connection failed before it was accepted: %s (errno %s)", exc.strerror, exc.errno)
                return
            self._failed(exc)
            self._pause()
            return
        if self._failing_since is not None:
            log.info("accepting connections again (accept failed %d times in %.1f s)", self._failures,
                     time.monotonic() - self._failing_since, extra={"fields": {"failures": self._failures}})
            self._failing_since, self._failures = None, 0
        # One connection at a time: the next is accepted once this one's protocol holds it, and has refused it if it
        # is over the connection budget (server.max_connections, or fewer that the open-file limit leaves room for).
        # Accepting a burst first would hold a descriptor for each before any of them could be refused, and run the
        # process out of descriptors below the budget that is there to prevent it.
        self._stop_reading()
        conn.setblocking(False)
        task = self._loop.create_task(self._connect(conn))
        self._tasks.add(task)
        task.add_done_callback(self._connected)

    def _stop_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self.sock.fileno())
            self._reading = False

    def _connected(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._retry is None:
            self._resume()

    def _failed(self, exc: OSError) -> None:
        """A failed accept: the first of a run says so at WARNING; the connections wait in the backlog meanwhile."""
        self._failures += 1
        if self._failing_since is not None:
            return
        self._failing_since = time.monotonic()
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        if exc.errno in SHORTAGE:
            why = ("close files or connections of the process, or raise its open-file limit (LimitNOFILE=)"
                   if exc.errno in (errno.EMFILE, errno.ENFILE) else "free memory")
        else:
            why = "an unexpected error of the listening socket"
        log.warning("cannot accept connections: %s (errno %s %s); new connections wait in the socket's backlog, "
                    "accept tried again every %g s (%s; said once until a connection is accepted again)",
                    exc.strerror, exc.errno, name, ACCEPT_RETRY_S, why,
                    extra={"fields": {"errno": exc.errno, "retry_s": ACCEPT_RETRY_S}})

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError:  # (reset before its transport was made)
            conn.close()

    def close(self) -> None:
        """Accept no more (the socket itself is closed by its owner)."""
        self._closed = True
        self._stop_reading()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    async def wait_closed(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
