#!/usr/bin/env python3
"""Processing time of sequential tick requests served in process, with and without an idle CPU between them.

The service's own HTTP protocol and direct route (what a plain ``POST /neural/process``
runs) are driven in this process through an in-memory transport: one keep-alive
connection, one tick request at a time over 20 markets, the next one handed over once the
answer is written, after a gap: none, the CPU spinning for ``--gap-us`` µs (a Python loop
reading the clock), or sleeping for that long (``time.sleep``: the CPU idles, as the
service's does between a client's requests). There is no socket and no client process.
Each scenario reports the ``processing_time_ns`` of its answers (what
``processing_duration_seconds`` records), p50 and p95, and the ratio of its p50 to the
engine's back to back in the same process (``Engine.process_now`` of the same kind of
ticks, nothing between them): what the request's own work (parsing, checks, the answer,
metrics: rows ``none`` and ``spin``) and an idle CPU (``sleep``) add to the network's
window.

    .venv/bin/python benchmarks/idle_window_bench.py [--requests 4000] [--gap-us 50,300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import uvloop
from http_bench import PROCESSING  # benchmarks/ is the script's directory, first on sys.path
from uvicorn.server import ServerState

from cerebellar_norse.api.server import build_service, make_app, uvicorn_config
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.neurons.bench import cpu_model
from cerebellar_norse.ticks import Tick

MARKETS = 20
SKIP = 500  # first answers of each scenario left out (caches, the markets' first ticks)
BASE_MS = 1_640_995_200_000


class MemoryTransport(asyncio.Transport):
    """A connection's transport that hands every write to ``on_write`` (the answer, whole, in one write)."""

    def __init__(self, on_write: Callable[[bytes], None]) -> None:
        super().__init__()
        self.on_write = on_write
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.on_write(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


class Ticks:
    """Tick requests over ``MARKETS`` markets in turn, each market's in time order."""

    def __init__(self) -> None:
        self.k = 0

    def next(self) -> tuple[float, float, int, str]:
        self.k += 1
        return 100.0 + 0.25 * (self.k % 9), 1000.0, BASE_MS + 1000 * self.k, f"m{self.k % MARKETS}"

    def request(self) -> bytes:
        price, volume, ts, market = self.next()
        body = json.dumps({"price": price, "volume": volume, "timestamp": ts, "market_id": market}).encode()
        return (b"POST /neural/process HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\nContent-Type: application/json\r\n\r\n" + body)


def gap(kind: str, seconds: float) -> None:
    """Nothing, a spin of ``seconds`` or a sleep of ``seconds``."""
    if kind == "sleep":
        time.sleep(seconds)
    elif kind == "spin":
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass


def quantiles(values: list[int]) -> tuple[float, float]:
    """p50 and p95 (µs) of ns values."""
    v = sorted(values)
    return statistics.median(v) / 1e3, v[int(0.95 * (len(v) - 1))] / 1e3


async def run(requests: int, gaps_us: list[int]) -> list[tuple[str, float, float]]:
    with tempfile.TemporaryDirectory(prefix="idle-window-") as tmp:
        cfg = load_checked_config(None, environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": tmp,
                                                 "CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN": "false",
                                                 "CEREBELLAR_NORSE_LOGGING__LEVEL": "WARNING"})
        state = build_service(cfg)
        app = make_app(state)
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await inbox.put({"type": "lifespan.startup"})
        life = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                       inbox.get, outbox.put))
        started = await outbox.get()
        if started["type"] != "lifespan.startup.complete":
            raise SystemExit(f"the service did not start: {started}")
        config = uvicorn_config(app, cfg, draining=lambda: False, direct=app.direct)
        config.load()
        server_state = ServerState()
        loop = asyncio.get_running_loop()
        ticks = Ticks()
        rows: list[tuple[str, float, float]] = []
        scenarios = [("none", 0)] + [(kind, g) for g in gaps_us for kind in ("spin", "sleep")]
        for kind, gap_us in scenarios:
            times: list[int] = []
            done: asyncio.Future[None] = loop.create_future()
            protocol = config.http(config=config, server_state=server_state, app_state={}, _loop=loop)

            def answered(data: bytes, kind: str = kind, gap_us: int = gap_us, times: list[int] = times,
                         done: asyncio.Future[None] = done, protocol: Any = protocol) -> None:
                found = PROCESSING.search(data)
                if found is None:
                    done.set_exception(RuntimeError(f"not a tick's answer: {data[:200]!r}"))
                    return
                times.append(int(found[1]))
                if len(times) >= requests + SKIP:
                    done.set_result(None)
                    return
                gap(kind, gap_us / 1e6)
                loop.call_soon(protocol.data_received, ticks.request())

            protocol.connection_made(MemoryTransport(answered))
            protocol.data_received(ticks.request())
            await done
            protocol.connection_lost(None)
            p50, p95 = quantiles(times[SKIP:])
            rows.append((kind if kind == "none" else f"{kind} {gap_us} µs", p50, p95))
        engine_ns = []
        for _ in range(requests + SKIP):
            price, volume, ts, market = ticks.next()
            engine_ns.append(state.engine.process_now([Tick(price, volume, ts, market)])[0].processing_time_ns)
        p50, p95 = quantiles(engine_ns[SKIP:])
        rows.append(("engine back to back", p50, p95))
        await inbox.put({"type": "lifespan.shutdown"})
        await life
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4000, help="measured requests per scenario (default 4000)")
    ap.add_argument("--gap-us", default="50,300", help="gaps between requests, µs, comma-separated (default 50,300)")
    args = ap.parse_args(argv)
    gaps = [int(g) for g in args.gap_us.split(",") if g.strip()]
    rows = uvloop.run(run(args.requests, gaps))
    engine_p50 = rows[-1][1]
    print(f"host: {cpu_model()}; {args.requests} requests per scenario, {MARKETS} markets")
    print(f"{'between requests':<22} {'p50 µs':>8} {'p95 µs':>8} {'p50/engine':>11}")
    for name, p50, p95 in rows:
        print(f"{name:<22} {p50:>8.2f} {p95:>8.2f} {p50 / engine_p50:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
