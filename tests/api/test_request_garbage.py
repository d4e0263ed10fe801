"""Requests leave no garbage that only the cyclic garbage collector frees.

Every object a request makes must be freed by reference counting once it is answered. Garbage in
reference cycles is freed only by the cyclic collector, whose collections run on the event loop's
thread, in the middle of the requests: at a dozen such objects per request (a request cycle that
referred to itself through a closure) the service spent about 9 µs of CPU per request collecting at
concurrency 8, and a full collection, which this garbage brings about every few tens of thousands of
requests, stopped the loop for 80–180 ms (docs/http.md, "Garbage per request"). The count here is of
what ``gc.collect()`` finds after connections that served one request and connections that served
several, with the collector off meanwhile: the connection's own objects (the protocol and its parser
refer to each other) are garbage of that kind once per connection, and must not grow with requests.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence
from typing import Any

import pytest
from test_direct_route import FakeRoute, Run, get, post, server_state
from test_protocol_framing import PausingTransport
from uvicorn.config import Config

from cerebellar_norse.api.protocol import guarded_protocol

CONNECTIONS = 20
CHUNKED = b"POST /direct HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ntick\r\n0\r\n\r\n"


def cyclic_garbage(reads: Sequence[bytes], draining: bool) -> int:
    """Objects ``gc.collect()`` frees after :data:`CONNECTIONS` connections that each got ``reads`` (each a socket
    read), the route and app answering at once; the collector is off while they run."""
    route = FakeRoute()
    run = Run(route)

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await run.serve(scope, receive, send)

    async def connections() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(CONNECTIONS):
            protocol = guarded_protocol(30.0, draining=(lambda: False) if draining else None, direct=route)(
                config=Config(app=app, lifespan="off", log_level="error"), server_state=server_state(), app_state={},
                _loop=loop)
            transport = PausingTransport()
            protocol.connection_made(transport)  # type: ignore[arg-type]
            for data in reads:
                protocol.data_received(data)
                for _ in range(5):
                    await asyncio.sleep(0)
            protocol.connection_lost(None)
            for _ in range(5):
                await asyncio.sleep(0)

    gc.collect()
    gc.freeze()  # (what exists now is not garbage of these connections: the count below need not visit it)
    gc.disable()
    try:
        asyncio.run(connections())
        return gc.collect()
    finally:
        gc.enable()
        gc.unfreeze()


@pytest.mark.parametrize("draining", [False, True], ids=["serving", "drain-aware"])
@pytest.mark.parametrize(("way", "one"), [
    ("one-pass read", [post()]),
    ("parser, direct route", [post()[:-2], post()[-2:]]),
    ("parser, app", [get()]),
    ("chunked, app", [CHUNKED]),
])
def test_garbage_does_not_grow_with_requests(way: str, one: list[bytes], draining: bool) -> None:
    cyclic_garbage(one * 2, draining)  # (first use: imports and caches)
    few = cyclic_garbage(one, draining)
    many = cyclic_garbage(one * 6, draining)
    assert many == few, f"{way}: {(many - few) / (5 * CONNECTIONS):.1f} objects of cyclic garbage per request"
