"""The protocol's direct route, in process: which requests it takes, and that the connection goes on as before.

A request the direct route takes is answered without the app: at once or from a future (as the
engine answers a tick), with pipelined requests before and after it answered in order; one whose
body does not come (the request deadline, a lost connection) goes to the app after all; a request
it does not take (chunked, ``Expect: 100-continue``, another path) goes to the app. A fake route
stands for the tick route here; tests/api/test_direct_tick_route.py compares the real one with the
ASGI route on live services.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from test_protocol_framing import PausingTransport, in_reads
from uvicorn.config import Config
from uvicorn.server import ServerState

from cerebellar_norse.api.protocol import Reply, guarded_protocol

ROUTE = b"/direct"


class FakeRoute:
    """Takes ``POST /direct`` with a Content-Length; answers ``direct <body>``, at once or when ``release`` is set."""

    target = ROUTE

    def __init__(self, deferred: bool = False, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.deferred = deferred
        self.headers = list(headers)
        self.release = asyncio.Event()
        self.taken: list[bytes] = []

    def eligible(self, scope: Any) -> bool:
        return scope["raw_path"] == ROUTE and scope["method"] == "POST" and any(
            k == b"content-length" for k, _ in scope["headers"])

    def answer(self, scope: Any, body: bytes, reply: Reply) -> None:
        self.taken.append(body)
        out = b"direct " + body

        def write() -> None:
            reply(200, [(b"content-length", str(len(out)).encode()), *self.headers], out)

        if not self.deferred:
            write()
            return

        async def later() -> None:
            await self.release.wait()
            write()

        asyncio.get_running_loop().create_task(later())


def server_state() -> ServerState:
    state = ServerState()
    state.default_headers = [(b"server", b"test")]  # (the server adds its name and the date to every answer)
    return state


class Run:
    """One connection of the guarded protocol with ``route``; apps not taken are echoed (``echo``), and noted."""

    def __init__(self, route: FakeRoute, timeout: float = 30.0, draining: bool = False) -> None:
        self.route = route
        self.app_paths: list[str] = []
        self.app_saw_disconnect = False
        self.timeout = timeout
        self.draining = draining

    async def serve(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.app_paths.append(scope["path"])
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.app_saw_disconnect = True
                return
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = f"{scope['path']} {size}".encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def feed(self, reads: Sequence[bytes], release_after: int | None = None, lose: bool = False,
             wait_s: float = 0.01) -> PausingTransport:
        async def app(scope: dict, receive: Any, send: Any) -> None:
            await self.serve(scope, receive, send)

        async def run() -> PausingTransport:
            protocol = guarded_protocol(self.timeout, draining=lambda: self.draining, direct=self.route)(
                config=Config(app=app, lifespan="off", log_level="error"), server_state=server_state(),
                app_state={}, _loop=asyncio.get_running_loop())
            transport = PausingTransport()
            protocol.connection_made(transport)  # type: ignore[arg-type]
            for k, data in enumerate(reads):
                protocol.data_received(data)
                for _ in range(5):
                    await asyncio.sleep(0)
                if release_after == k:
                    self.route.release.set()
                    for _ in range(5):
                        await asyncio.sleep(0)
            await asyncio.sleep(wait_s)
            if lose:
                protocol.connection_lost(None)
                for _ in range(5):
                    await asyncio.sleep(0)
            self.route.release.set()
            for _ in range(5):
                await asyncio.sleep(0)
            if not lose:
                protocol.connection_lost(None)
            return transport

        return asyncio.run(run())


def post(path: bytes = ROUTE, body: bytes = b"tick", extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    return (b"POST " + path + b" HTTP/" + version + b"\r\nHost: x\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\n" + extra + b"\r\n" + body)


def get(path: bytes = b"/g") -> bytes:
    return b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n"


def answers(written: bytes) -> list[tuple[bytes, bytes]]:
    """(head, body) of each answer written."""
    out = []
    while written:
        head, _, rest = written.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        out.append((head, rest[:length]))
        written = rest[length:]
    return out


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_taken_request_is_answered_by_the_route_however_its_bytes_arrive(size: int) -> None:
    run = Run(FakeRoute())
    t = run.feed(in_reads(post(body=b"tick-1") + post(body=b"tick-2") + get(), size))
    got = answers(t.written)
    assert [b for _, b in got] == [b"direct tick-1", b"direct tick-2", b"/g 0"]
    assert run.route.taken == [b"tick-1", b"tick-2"]
    assert run.app_paths == ["/g"]  # the app saw only the request the route did not take
    head = got[0][0].split(b"\r\n")
    assert head[0] == b"HTTP/1.1 200 OK"
    assert head[1] == b"server: test"  # the server's default headers first, as on every answer
    assert b"connection: close" not in t.written.lower()  # kept alive: the requests behind were answered


def test_requests_the_route_does_not_take_go_to_the_app() -> None:
    run = Run(FakeRoute())
    chunked = b"POST /direct HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ntick\r\n0\r\n\r\n"
    t = run.feed([chunked, post(path=b"/other"), get()])
    assert [b for _, b in answers(t.written)] == [b"/direct 4", b"/other 4", b"/g 0"]
    assert run.route.taken == []
    assert run.app_paths == ["/direct", "/other", "/g"]


def test_a_request_expecting_100_continue_goes_to_the_app() -> None:
    run = Run(FakeRoute())
    t = run.feed([b"POST /direct HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n", b"tick"])
    assert run.route.taken == []
    assert run.app_paths == ["/direct"]
    assert t.written.startswith(b"HTTP/1.1 100 Continue")


def test_a_later_answer_keeps_pipelined_requests_in_order() -> None:
    run = Run(FakeRoute(deferred=True))
    t = run.feed([get(b"/a") + post(body=b"one") + get(b"/b") + post(body=b"two")], wait_s=0.01)
    assert [b for _, b in answers(t.written)] == [b"/a 0", b"direct one", b"/b 0", b"direct two"]
    assert not t.paused  # reading resumed once every queued request was answered


def test_nothing_behind_a_pending_answer_is_written_before_it() -> None:
    route = FakeRoute(deferred=True)
    run = Run(route)

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await run.serve(scope, receive, send)

    async def check() -> tuple[bytes, list[str]]:
        protocol = guarded_protocol(30.0, direct=route)(
            config=Config(app=app, lifespan="off", log_level="error"), server_state=server_state(), app_state={},
            _loop=asyncio.get_running_loop())
        transport = PausingTransport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(post(body=b"one") + get(b"/b"))
        for _ in range(10):
            await asyncio.sleep(0)
        before = transport.written
        route.release.set()
        for _ in range(10):
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return before, [b.decode() for _, b in answers(transport.written)]

    before, after = asyncio.run(check())
    assert before == b""  # /b waits for the answer before it
    assert after == ["direct one", "/b 0"]


def test_a_body_that_does_not_come_is_handed_to_the_app_at_the_deadline() -> None:
    run = Run(FakeRoute(), timeout=0.05)
    t = run.feed([post(body=b"tick")[:-2]], wait_s=0.2)  # two bytes of the body never come
    assert run.route.taken == []
    assert run.app_paths == ["/direct"]  # the app got it, and saw its end
    assert t.written.startswith(b"HTTP/1.1 408 ")
    assert t.closed


def test_a_connection_lost_before_the_body_hands_the_request_to_the_app() -> None:
    run = Run(FakeRoute())
    run.feed([post(body=b"tick")[:-2]], lose=True)
    assert run.route.taken == []
    assert run.app_paths == ["/direct"] and run.app_saw_disconnect


def test_an_answer_after_the_client_left_is_not_written() -> None:
    run = Run(FakeRoute(deferred=True))
    t = run.feed([post(body=b"tick")], lose=True)
    assert run.route.taken == [b"tick"]
    assert t.written == b""


@pytest.mark.parametrize("how", ["answer says close", "http/1.0", "client says close", "draining"])
def test_an_answer_that_ends_the_connection_closes_it_once_written(how: str) -> None:
    route = FakeRoute(headers=[(b"connection", b"close")] if how == "answer says close" else [])
    run = Run(route, draining=how == "draining")
    req = post(body=b"tick", version=b"1.0" if how == "http/1.0" else b"1.1",
               extra=b"Connection: close\r\n" if how == "client says close" else b"")
    t = run.feed([req if how == "draining" else req + get()])  # (draining: a request read behind it would close)
    got = answers(t.written)
    assert [b for _, b in got] == [b"direct tick"]  # nothing behind it is read
    assert got[0][0].lower().count(b"connection: close") == 1
    assert t.closed


@pytest.mark.parametrize("whole", [False, True])
def test_a_request_whose_client_left_before_its_turn_is_not_answered_by_the_route(whole: bool) -> None:
    """Read by the parser (its body in a second read), then the connection lost before the route's turn: the app's
    way (it reads the disconnect and applies nothing), as for a task that had not yet run. A whole plain request in
    one read has no such turn: the route takes it as it is read (what the client then does cannot undo that)."""
    route = FakeRoute()
    run = Run(route)

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await run.serve(scope, receive, send)

    async def check() -> bytes:
        protocol = guarded_protocol(30.0, direct=route)(
            config=Config(app=app, lifespan="off", log_level="error"), server_state=server_state(), app_state={},
            _loop=asyncio.get_running_loop())
        transport = PausingTransport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        data = post(body=b"tick")
        for part in ([data] if whole else [data[:-2], data[-2:]]):
            protocol.data_received(part)
        protocol.connection_lost(None)  # before the loop's next round
        for _ in range(10):
            await asyncio.sleep(0)
        return transport.written

    written = asyncio.run(check())
    if whole:
        assert route.taken == [b"tick"] and run.app_paths == []
        assert b"direct tick" in written  # (the fake route answers at once; a real socket would drop it)
    else:
        assert route.taken == []
        assert run.app_paths == ["/direct"] and run.app_saw_disconnect


@pytest.mark.parametrize("via", ["direct", "app"])
def test_a_peer_that_does_not_read_its_answers_gets_no_more_until_it_does(via: str) -> None:
    """While the socket's write buffer is over its high-water mark (the peer reads nothing), no answer is written and
    no further pipelined request runs, as the cycle's send waits for the buffer to drain: a client that pipelines ticks
    and never reads cannot grow the server's buffer (or have its ticks applied) without bound."""
    route = FakeRoute()
    run = Run(route)
    path = ROUTE if via == "direct" else b"/other"

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await run.serve(scope, receive, send)

    async def check() -> tuple[int, int, list[bytes], int]:
        protocol = guarded_protocol(30.0, direct=route)(
            config=Config(app=app, lifespan="off", log_level="error"), server_state=server_state(), app_state={},
            _loop=asyncio.get_running_loop())
        transport = PausingTransport()
        transport.get_write_buffer_size = lambda: 1 << 20  # type: ignore[attr-defined]  # (for the stall deadline)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.pause_writing()  # the peer reads nothing
        protocol.data_received(b"".join(post(path=path, body=b"t%d" % k) for k in range(5)))
        for _ in range(20):
            await asyncio.sleep(0)
        paused_answers = len(answers(transport.written))
        ran = len(route.taken) + len(run.app_paths)
        protocol.resume_writing()  # it reads again
        for _ in range(40):
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return paused_answers, ran, [b for _, b in answers(transport.written)], len(route.taken) + len(run.app_paths)

    paused_answers, ran, bodies, ran_after = asyncio.run(check())
    assert paused_answers == 0 and ran == 1  # the first request ran; its answer waits, nothing behind it runs
    assert ran_after == 5 and len(bodies) == 5
