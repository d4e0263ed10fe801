"""Accepting connections (api/accepting.py): an accept that fails for want of a file descriptor stops accepting for a
second instead of being tried again at every turn of the loop (the service spun a core while it lasted), says so in
one WARNING per run of failures, and accepting goes on afterwards: the connections that waited are served."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket

import pytest

from cerebellar_norse.api import accepting
from cerebellar_norse.api.accepting import Acceptor

pytestmark = pytest.mark.asyncio


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert isinstance(self.transport, asyncio.Transport)
        self.transport.write(b"ok:" + data)


class Failing(Acceptor):
    """An acceptor whose accepts fail with ``code`` while ``failing``, each try counted."""

    def __init__(self, *a: object, code: int = errno.EMFILE) -> None:
        super().__init__(*a)  # type: ignore[arg-type]
        self.code = code
        self.failing = True
        self.tries = 0

    def _accept(self) -> tuple[socket.socket, object]:
        self.tries += 1
        if self.failing:
            raise OSError(self.code, "Too many open files")
        return super()._accept()


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.EIO])
async def test_a_failed_accept_backs_off_says_so_once_and_accepting_goes_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int) -> None:
    monkeypatch.setattr(accepting, "ACCEPT_RETRY_S", 0.2)
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    acceptor = Failing(loop, listener, Echo, code=code).start()
    caplog.clear()
    try:
        with caplog.at_level(logging.INFO, logger="cerebellar_norse.server"):
            reader, writer = await asyncio.open_connection(*listener.getsockname())
            while acceptor.pauses < 3:  # three failed accepts: one per pause, not one per turn of the loop
                await asyncio.sleep(0.01)
            assert acceptor.tries == acceptor.pauses
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1, warnings
            assert f"errno {code} {errno.errorcode[code]}" in warnings[0] and "tried again every 0.2 s" in warnings[0]
            acceptor.failing = False  # a descriptor is free again: the connection that waited is served
            writer.write(b"hi")
            assert await asyncio.wait_for(reader.readexactly(5), 10) == b"ok:hi"
            assert any("accepting connections again" in r.getMessage() for r in caplog.records)
            writer.close()
            reader2, writer2 = await asyncio.open_connection(*listener.getsockname())
            writer2.write(b"yo")
            assert await asyncio.wait_for(reader2.readexactly(5), 10) == b"ok:yo"
            writer2.close()
    finally:
        acceptor.close()
        await acceptor.wait_closed()
        listener.close()


class FailsOnce(Acceptor):
    """An acceptor whose first accept fails with ``code``, as Linux's accept() reports a network error pending on the
    connection it was about to return (that connection is gone; the next ones are not)."""

    def __init__(self, *a: object, code: int) -> None:
        super().__init__(*a)  # type: ignore[arg-type]
        self.code = code
        self.tries = 0

    def _accept(self) -> tuple[socket.socket, object]:
        self.tries += 1
        if self.tries == 1:
            raise OSError(self.code, "connection's own error")
        return super()._accept()


@pytest.mark.parametrize("code", [errno.EPROTO, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EPERM])
async def test_an_error_of_the_connection_being_accepted_passes_it_over_without_pausing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int) -> None:
    """One client's network error (accept(2): pending errors are returned by accept and are to be treated as EAGAIN)
    does not stop accepting for the others for a second, nor say that the service cannot accept connections."""
    monkeypatch.setattr(accepting, "ACCEPT_RETRY_S", 30.0)  # a pause would hold the connection below past the test
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    acceptor = FailsOnce(loop, listener, Echo, code=code).start()
    try:
        with caplog.at_level(logging.INFO, logger="cerebellar_norse.server"):
            reader, writer = await asyncio.open_connection(*listener.getsockname())
            writer.write(b"hi")
            assert await asyncio.wait_for(reader.readexactly(5), 10) == b"ok:hi"
            writer.close()
        assert acceptor.tries >= 2 and acceptor.pauses == 0
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        acceptor.close()
        await acceptor.wait_closed()
        listener.close()
