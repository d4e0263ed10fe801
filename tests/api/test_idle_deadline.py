"""The keep-alive deadline of an idle connection (``server.keep_alive_timeout``), in process.

A connection with no request under way (none begun, or every answer written) is closed once it has
stayed so for the limit; requests, and an answer still pending, keep it open, and the limit runs
from the last answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from test_direct_route import FakeRoute, post, server_state
from test_protocol_framing import PausingTransport
from uvicorn.config import Config

from cerebellar_norse.api.protocol import guarded_protocol

LIMIT_S = 0.3


async def echo(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class Connection:
    def __init__(self, route: FakeRoute) -> None:
        self.protocol = guarded_protocol(30.0, direct=route)(
            config=Config(app=echo, lifespan="off", log_level="error", timeout_keep_alive=LIMIT_S),  # type: ignore[arg-type]
            server_state=server_state(), app_state={}, _loop=asyncio.get_running_loop())
        self.transport = PausingTransport()
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]
        self.opened = time.monotonic()

    async def closed_after(self, timeout: float = 3.0) -> float:
        """Seconds from now until the connection is closed (fails after ``timeout``)."""
        t0 = time.monotonic()
        while not self.transport.closed:
            assert time.monotonic() - t0 < timeout, "not closed"
            await asyncio.sleep(0.01)
        return time.monotonic() - t0


def run(check: Any) -> Any:
    return asyncio.run(check())


def test_a_connection_that_sends_nothing_is_closed_after_the_limit() -> None:
    async def check() -> float:
        conn = Connection(FakeRoute())
        return await conn.closed_after()

    assert LIMIT_S * 0.9 <= run(check) < LIMIT_S + 0.5


def test_the_limit_runs_from_the_last_answer_not_from_the_first() -> None:
    """Requests every 0.4 of the limit keep the connection open past several limits; then it closes one limit after
    the last answer."""

    async def check() -> tuple[float, bool, int]:
        conn = Connection(FakeRoute())
        for _ in range(6):
            await asyncio.sleep(LIMIT_S * 0.4)
            conn.protocol.data_received(post(body=b"tick"))
        open_meanwhile = not conn.transport.closed
        return await conn.closed_after(), open_meanwhile, conn.transport.written.count(b"HTTP/1.1 200")

    after_last, open_meanwhile, answered = run(check)
    assert open_meanwhile and answered == 6
    assert LIMIT_S * 0.9 <= after_last < LIMIT_S + 0.5


def test_a_connection_busy_when_the_timer_fires_is_not_closed_until_idle_for_the_limit() -> None:
    """An answer pending past the limit (the route answers later): the connection stays open, and closes one limit
    after that answer is written."""

    async def check() -> tuple[bool, float]:
        route = FakeRoute(deferred=True)
        conn = Connection(route)
        conn.protocol.data_received(post(body=b"tick"))
        await asyncio.sleep(LIMIT_S * 2)
        open_while_busy = not conn.transport.closed
        route.release.set()
        await asyncio.sleep(0)
        return open_while_busy, await conn.closed_after()

    open_while_busy, after_answer = run(check)
    assert open_while_busy
    assert LIMIT_S * 0.9 <= after_answer < LIMIT_S + 0.5


def test_no_idle_timer_is_left_once_the_connection_is_lost() -> None:
    async def check() -> Any:
        conn = Connection(FakeRoute())
        conn.protocol.data_received(post(body=b"tick"))
        await asyncio.sleep(0)
        conn.protocol.connection_lost(None)
        return conn.protocol.timeout_keep_alive_task

    assert run(check) is None
