"""WS /neural/stream at a stop, in process: the tick being answered gets its answer before the 1012 close.

uvicorn closed every stream at once when the server stopped; a tick the app had taken was stepped (applied) and its
answer lost, so the client counted it as not applied. Messages read but not yet taken are dropped (never applied);
an app that does not answer in time is closed all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from live_helpers import BASE_TS, NO_BOOTSTRAP, tick
from test_protocol_framing import Transport as FakeTransport
from test_stream_backpressure import frame, handshake
from uvicorn.config import Config
from uvicorn.server import ServerState

from cerebellar_norse.api import protocol as protocol_module
from cerebellar_norse.api.protocol import DenialAwareWebSocketProtocol


class Transport(FakeTransport):
    """The protocol tests' fake socket, which refuses a write after its close (the stream's answer must come first)."""

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        super().write(data)

    def get_write_buffer_size(self) -> int:
        return 0


def server_frames(data: bytes) -> list[tuple[int, bytes]]:
    """(opcode, payload) of the unmasked frames the server wrote (after the handshake's answer)."""
    data = data.split(b"\r\n\r\n", 1)[1]
    out = []
    while data:
        opcode, n = data[0] & 0x0F, data[1] & 0x7F
        at = 2
        if n == 126:
            n, at = struct.unpack("!H", data[2:4])[0], 4
        out.append((opcode, data[at:at + n]))
        data = data[at + n:]
    return out


class Stream:
    """The stream's shape: each message answered ``answer:<message>`` once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.taken: list[str] = []
        self.ended = False

    async def app(self, scope: dict, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                self.ended = True
                return
            self.taken.append(message["text"])
            await self.release.wait()
            await send({"type": "websocket.send", "text": "answer:" + message["text"]})


async def opened(stream: Stream) -> tuple[DenialAwareWebSocketProtocol, Transport]:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await stream.app(scope, receive, send)

    config = Config(app=app, lifespan="off", log_level="error", ws_ping_interval=None)
    config.load()
    protocol = DenialAwareWebSocketProtocol(config=config, server_state=ServerState(), app_state={},
                                            _loop=asyncio.get_running_loop())
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(handshake())
    for _ in range(10):
        await asyncio.sleep(0)
    assert protocol.handshake_complete
    return protocol, transport


async def spin(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_tick_being_answered_is_answered_before_the_close() -> None:
    async def run() -> tuple[Stream, Transport, bool]:
        stream = Stream()
        protocol, transport = await opened(stream)
        protocol.data_received(frame(b"t1", 0x1) + frame(b"t2", 0x1))  # t1 taken, t2 read and waiting
        await spin()
        protocol.shutdown()  # the server stops while t1 is being answered
        await spin()
        closed_before = transport.closed
        stream.release.set()
        await spin()
        return stream, transport, closed_before

    stream, transport, closed_before = asyncio.run(run())
    assert not closed_before  # the stop waited for the answer
    frames = server_frames(transport.written)
    assert frames[0] == (0x1, b"answer:t1")
    assert frames[1][0] == 0x8 and struct.unpack("!H", frames[1][1][:2])[0] == 1012
    assert len(frames) == 2 and stream.taken == ["t1"]  # t2 never reached the app
    assert transport.closed and stream.ended


def test_an_idle_stream_closes_at_once() -> None:
    async def run() -> Transport:
        stream = Stream()
        protocol, transport = await opened(stream)
        protocol.shutdown()
        return transport

    transport = asyncio.run(run())
    assert transport.closed
    frames = server_frames(transport.written)
    assert frames[-1][0] == 0x8 and struct.unpack("!H", frames[-1][1][:2])[0] == 1012


def test_an_answer_that_does_not_come_in_time_does_not_hold_the_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol_module, "STOP_ANSWER_S", 0.05)

    async def run() -> Transport:
        stream = Stream()
        protocol, transport = await opened(stream)
        protocol.data_received(frame(b"t1", 0x1))
        await spin()
        protocol.shutdown()
        await asyncio.sleep(0.2)  # never released
        return transport

    transport = asyncio.run(run())
    assert transport.closed
    frames = server_frames(transport.written)
    assert [op for op, _ in frames] == [0x8]


@pytest.mark.slow
def test_after_a_stop_under_load_every_stream_holds_exactly_its_answered_ticks(start_server: Any, tmp_path: Path) -> None:
    """Six streams send ticks back to back (one in flight each) when SIGTERM comes; after the restart each market's
    last tick is the last one answered (closed at once, the tick being stepped was applied unanswered: most streams
    were one tick ahead of their client at every stop)."""
    token = "stop-token"
    env = {**NO_BOOTSTRAP, "CEREBELLAR_NORSE_SERVER__API_TOKEN": token}
    state = tmp_path / "state"
    for round_no in range(2):
        srv = start_server(state, env=env)
        answered: dict[str, int] = {}
        base = BASE_TS + round_no * 10_000_000

        async def stream(market: str, srv: Any = srv, answered: dict[str, int] = answered, base: int = base) -> None:
            with contextlib.suppress(websockets.ConnectionClosed, OSError):
                async with websockets.connect(f"{srv.ws_url}/neural/stream") as ws:
                    for k in range(1, 10**9):
                        await ws.send(json.dumps(tick(market, 0) | {"timestamp": base + k}))
                        if "error" in json.loads(await ws.recv()):
                            return
                        answered[market] = base + k

        async def load(srv: Any = srv) -> None:
            clients = [asyncio.create_task(stream(f"stop-{j}")) for j in range(6)]
            await asyncio.sleep(0.7)
            srv.proc.send_signal(signal.SIGTERM)
            await asyncio.gather(*clients)

        asyncio.run(load())
        assert srv.stop() == 0
        assert len(answered) == 6
        again = start_server(state, env=env)
        for market, ts in answered.items():
            got = httpx.get(f"{again.url}/debug/markets/{market}/state", headers={"Authorization": f"Bearer {token}"})
            assert got.json()["last_tick"]["timestamp"] == ts, (round_no, market)
        again.stop()
