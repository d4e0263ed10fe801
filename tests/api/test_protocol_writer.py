"""The response writer of the server's protocol: a head leaves with its body, and is never held past one loop pass."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import uvloop

from cerebellar_norse.api.protocol import CoalescingWriter


def read(peer: socket.socket) -> bytes:
    """What the peer has received so far (b"" when nothing)."""
    try:
        return peer.recv(65536)
    except BlockingIOError:
        return b""


def _run(body: Callable[[CoalescingWriter, socket.socket, asyncio.AbstractEventLoop], Awaitable[None]]) -> None:
    async def main() -> None:
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_unix_connection(asyncio.Protocol, sock=ours)
        try:
            await body(CoalescingWriter(transport, loop), peer, loop)  # type: ignore[arg-type]
        finally:
            transport.close()
            peer.close()
    uvloop.run(main())


def test_head_is_sent_with_the_body_in_one_write() -> None:
    async def body(w: CoalescingWriter, peer: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        assert read(peer) == b""  # held: nothing sent yet
        w.write(b"{}")  # sent at once, with the head, before the loop runs again
        assert read(peer) == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
        await asyncio.sleep(0)
        assert read(peer) == b""  # nothing sent twice
    _run(body)


def test_a_lone_write_leaves_on_the_next_loop_pass() -> None:
    async def body(w: CoalescingWriter, peer: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        assert read(peer) == b""
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert read(peer) == b"HTTP/1.1 100 Continue\r\n\r\n"
        w.write(b"a")  # nothing held now: this one is held in turn, then joined with the next
        w.write(memoryview(b"b"))
        assert read(peer) == b"ab"
    _run(body)


def test_flush_close_and_discard() -> None:
    async def body(w: CoalescingWriter, peer: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        w.write(b"")  # an empty write holds nothing
        await asyncio.sleep(0)
        assert read(peer) == b""
        w.write(b"head")
        w.flush()
        assert read(peer) == b"head"
        w.write(b"dropped")
        w.discard()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert read(peer) == b""
        assert w.get_extra_info("socket") is not None  # everything else is the transport's
        w.write(b"last")
        assert not w.is_closing()
        w.close()  # what is held goes out before the close
        assert w.is_closing()
        await asyncio.sleep(0.01)
        assert read(peer) == b"last"
    _run(body)
