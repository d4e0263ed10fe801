"""WS /neural/stream's protocol against peers that do not read, in process: a fake transport with a write buffer.

A client that floods pings and never reads the pongs must not grow the server's write buffer without limit (the
protocol stops reading it while the buffer is over its high-water mark), and a client that misses its keepalive
pong deadline with unread data queued must be cut off once it reads nothing more, not left open forever, but not
while it still reads.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct

from uvicorn.config import Config
from uvicorn.server import ServerState

from cerebellar_norse.api.protocol import DenialAwareWebSocketProtocol

HIGH_WATER = 64 * 1024


class BufferedTransport:
    """A socket whose peer reads nothing until :meth:`drain`: writes pile up, the protocol is told past high water."""

    def __init__(self) -> None:
        self.protocol: DenialAwareWebSocketProtocol | None = None
        self.buffered = 0
        self.paused = False  # writes paused (pause_writing called)
        self.reading = True
        self.closed = False
        self.aborted = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.buffered += len(data)
        if self.buffered > HIGH_WATER and not self.paused and self.protocol is not None:
            self.paused = True
            self.protocol.pause_writing()

    def drain(self) -> None:
        self.buffered = 0
        if self.paused and self.protocol is not None:
            self.paused = False
            self.protocol.resume_writing()

    def close(self) -> None:
        self.closed = True  # graceful: the buffer would still have to go out first

    def abort(self) -> None:
        self.closed = self.aborted = True
        if self.protocol is not None:
            self.protocol.connection_lost(None)

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_write_buffer_limits(self, *args: object, **kwargs: object) -> None:
        pass


async def stream_app(scope: dict, receive, send) -> None:
    """Accepts, then answers each message with 300 bytes, as the stream answers each tick."""
    assert scope["type"] == "websocket"
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "text": "r" * 300})


def frame(payload: bytes, opcode: int) -> bytes:
    """A masked client frame."""
    mask = os.urandom(4)
    n = len(payload)
    head = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def handshake() -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET /neural/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()


async def opened() -> tuple[DenialAwareWebSocketProtocol, BufferedTransport]:
    config = Config(app=stream_app, lifespan="off", log_level="error", ws_ping_interval=None)
    config.load()
    protocol = DenialAwareWebSocketProtocol(config=config, server_state=ServerState(), app_state={},
                                            _loop=asyncio.get_running_loop())
    transport = BufferedTransport()
    transport.protocol = protocol
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(handshake())
    for _ in range(10):
        await asyncio.sleep(0)
    assert protocol.handshake_complete
    transport.drain()
    return protocol, transport


def test_a_ping_flood_that_is_never_read_stops_being_read_at_the_high_water_mark() -> None:
    async def run() -> None:
        protocol, transport = await opened()
        ping = frame(b"x" * 125, 0x9)
        fed = 0
        for _ in range(20_000):  # 2.6 MB of pings, in reads of 16 frames, only while the protocol reads
            if not transport.reading:
                break
            protocol.data_received(ping * 16)
            fed += 16
        assert not transport.reading, f"{fed} pings read, {transport.buffered} bytes of pongs queued"
        assert transport.buffered < HIGH_WATER + 16 * 130
        transport.drain()  # the peer reads its pongs: reading resumes
        assert transport.reading
        protocol.connection_lost(None)
        for _ in range(10):
            await asyncio.sleep(0)

    asyncio.run(run())


def test_ticks_still_flow_and_the_app_read_pause_is_kept() -> None:
    async def run() -> None:
        protocol, transport = await opened()
        answered = 0
        for _ in range(1_000):  # a reading peer: every answer drained
            protocol.data_received(frame(b'{"t": 1}', 0x1))
            for _ in range(5):
                await asyncio.sleep(0)
            answered = transport.buffered // 300 + answered
            transport.drain()
            assert transport.reading
        assert answered >= 990
        for _ in range(400):  # a peer that stops reading: answers fill the buffer, then its frames are not read
            if not transport.reading:
                break
            protocol.data_received(frame(b'{"t": 1}', 0x1))
            for _ in range(5):
                await asyncio.sleep(0)
        assert not transport.reading and transport.buffered < HIGH_WATER + 4096
        transport.drain()
        for _ in range(10):
            await asyncio.sleep(0)
        assert transport.reading
        protocol.connection_lost(None)
        for _ in range(10):
            await asyncio.sleep(0)

    asyncio.run(run())


async def fill(protocol: DenialAwareWebSocketProtocol, transport: BufferedTransport) -> None:
    """Ticks in until the app waits to send: the peer has read nothing."""
    for _ in range(300):
        if not transport.reading:
            break
        protocol.data_received(frame(b'{"t": 1}', 0x1))
        for _ in range(5):
            await asyncio.sleep(0)
    assert transport.paused  # the app waits to send; the peer reads nothing


def test_a_missed_keepalive_pong_cuts_off_a_peer_that_does_not_read() -> None:
    async def run() -> None:
        protocol, transport = await opened()
        await fill(protocol, transport)
        protocol.ping_timeout = 0.02
        protocol.pending_ping_payload = b"abcd"
        protocol.keepalive_timeout()  # the pong deadline passed: a graceful close, behind the queued answers
        assert transport.closed and not transport.aborted
        await asyncio.sleep(0.1)  # another deadline, and the peer read nothing
        assert transport.aborted and protocol.disconnected
        for _ in range(10):
            await asyncio.sleep(0)
        assert not protocol.tasks  # the app's task ended (its send raised, the connection is gone)

    asyncio.run(run())


def test_a_peer_past_its_pong_deadline_that_reads_slowly_gets_its_answers() -> None:
    """The pong of a client that reads slowly waits behind the answers it has not read yet: it is late, but the
    answers queued before the close must still reach it, so it is not cut off while it keeps reading."""

    async def run() -> None:
        protocol, transport = await opened()
        await fill(protocol, transport)
        protocol.ping_timeout = 0.2
        protocol.pending_ping_payload = b"abcd"
        protocol.keepalive_timeout()
        for _ in range(20):  # the peer reads a little, many times per deadline
            transport.buffered -= 1_000
            await asyncio.sleep(0.02)
            assert not transport.aborted
        await asyncio.sleep(0.6)  # then it stops reading
        assert transport.aborted

    asyncio.run(run())


def test_a_half_closed_peer_gets_every_answer_before_the_socket_closes() -> None:
    """Ticks sent before the peer's FIN are processed (applied); their answers must go out, not be dropped."""

    async def run() -> None:
        protocol, transport = await opened()
        protocol.data_received(b"".join(frame(b'{"t": %d}' % k, 0x1) for k in range(5)))
        keep_open = protocol.eof_received()
        assert keep_open and not transport.closed
        for _ in range(50):
            await asyncio.sleep(0)
        assert transport.buffered == 5 * 304  # five answers of 300 bytes, each with its 4-byte frame head
        assert transport.closed and not protocol.tasks  # then the app ended and the socket was closed

    asyncio.run(run())
