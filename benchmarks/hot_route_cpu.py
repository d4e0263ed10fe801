#!/usr/bin/env python3
"""CPU time per ``POST /neural/process`` inside the service's app, without a server or a socket.

The app (built as ``cerebellar-norse serve`` builds it: default config, untrained network
of the seed, a temporary state dir) is called directly as an ASGI application by
``--concurrency`` workers on one uvloop loop, each sending its own market's ticks in time
order, so the engine batches them as it does under concurrent HTTP load. What is left
out is the HTTP server itself (uvicorn's parsing, its task per request, the socket), the
part ``benchmarks/http_bench.py`` adds. Reported, as process CPU time per request (µs,
the median of ``--rounds`` rounds; CPU time, unlike wall time, does not count the time
other work on a shared host holds the core):

* ``route``: the whole hot route (request context, parsing, checks, engine, answer);
* ``context``: the request context alone around an app that answers at once (request
  id, metrics, timeline);
* ``engine``: parsing with the route's model and ``Engine.submit`` alone (queue, batch,
  backend step, results, journal, live scoring, sinks).

``CEREBELLAR_NORSE_*`` variables of the environment override the default config as they
do for the service (e.g. ``CEREBELLAR_NORSE_TRAINING__LIVE_EVALUATION=false`` measures the
route without live self-evaluation); the state dir is always a temporary one, first-run
training is off and the log level is WARNING. Warm steps are off
(``performance.warm_step_interval_us = 0`` unless the environment sets it): their timer
runs by wall time, so under callgrind, tens of times slower, it would fire tens of times
more often per request than in service, and back to back they have no gap to warm.

Request bodies are made before the timed part. With ``--instructions``, each scenario
runs once under valgrind's callgrind instead, and the instructions executed per request
are reported: they do not move with the host's load (cache misses are not in them), so
two revisions compare exactly (run the script with ``PYTHONPATH`` set to the other
checkout). Needs valgrind and a C compiler, and takes minutes per scenario.

    .venv/bin/python benchmarks/hot_route_cpu.py [--requests 8000] [--rounds 3] [--concurrency 8]
    .venv/bin/python benchmarks/hot_route_cpu.py --instructions route,context,engine --requests 800
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop
from kernel_instructions import callgrind_count, helper_library

from cerebellar_norse.api.app import RequestContextMiddleware
from cerebellar_norse.api.schemas import TickIn
from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import load_checked_config

BASE_TS = 1_640_995_200_000


class Bodies:
    """Each worker's market's ticks, one second apart."""

    def __init__(self) -> None:
        self.k: dict[int, int] = {}

    def next(self, w: int) -> bytes:
        k = self.k[w] = self.k.get(w, 0) + 1
        return json.dumps({"price": 100.0 + 0.25 * (k % 9), "volume": 1000.0 + k % 13, "timestamp": BASE_TS + 1000 * k,
                           "market_id": f"w{w}"}).encode()


def _scope(body: bytes) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/neural/process", "raw_path": b"/neural/process", "query_string": b"", "root_path": "",
            "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080), "state": {}}


async def _call(app: Any, body: bytes) -> None:
    """One request through ``app``; fails unless it was answered 200."""
    delivered = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect while the answer is pending
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(_scope(body), receive, send)
    if status != 200:
        raise SystemExit(f"request answered {status}")


async def _answer_at_once(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _cpu_per_request(one: Callable[[bytes], Awaitable[None]], bodies: Bodies, requests: int, workers: int,
                           cg: Any = None) -> float:
    """CPU µs per request of ``requests`` calls of ``one`` by ``workers`` workers; with ``cg`` (the callgrind
    helper), instructions are collected during the calls only."""
    per_worker = requests // workers
    todo = [[bodies.next(w) for _ in range(per_worker)] for w in range(workers)]

    async def worker(w: int) -> None:
        for body in todo[w]:
            await one(body)

    if cg is not None:
        cg.cg_toggle()
    t0 = time.process_time()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    t1 = time.process_time()
    if cg is not None:
        cg.cg_toggle()
    return 1e6 * (t1 - t0) / (per_worker * workers)


async def _run(args: argparse.Namespace) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="cn-hot-route-") as tmp:
        overrides = {k: v for k, v in os.environ.items() if k.startswith("CEREBELLAR_NORSE_")}
        cfg = load_checked_config(None, environ={"CEREBELLAR_NORSE_PERFORMANCE__WARM_STEP_INTERVAL_US": "0", **overrides,
                                                 "CEREBELLAR_NORSE_PATHS__STATE_DIR": tmp,
                                                 "CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN": "false",
                                                 "CEREBELLAR_NORSE_LOGGING__LEVEL": "WARNING"})
        state = build_service(cfg)
        app = make_app(state)
        context_only = RequestContextMiddleware(_answer_at_once, state)
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await inbox.put({"type": "lifespan.startup"})
        life = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, outbox.put))
        started = await outbox.get()
        if started["type"] != "lifespan.startup.complete":
            raise SystemExit(f"service did not start: {started}")
        bodies = Bodies()

        async def route(body: bytes) -> None:
            await _call(app, body)

        async def context(body: bytes) -> None:
            await _call(context_only, body)

        async def engine(body: bytes) -> None:
            await state.engine.submit(TickIn.model_validate_json(body).to_tick())

        scenarios = {"route": route, "context": context, "engine": engine}
        await _cpu_per_request(route, bodies, args.requests // 4, args.concurrency)  # warm: markets, caches, lazy imports
        out: dict[str, list[float]] = {name: [] for name in scenarios}
        if args.callgrind_inner:
            cg = ctypes.CDLL(args.callgrind_inner[0])
            cg.cg_start()
            name = args.callgrind_inner[1]
            out[name].append(await _cpu_per_request(scenarios[name], bodies, args.requests, args.concurrency, cg))
        else:
            for _ in range(args.rounds):
                for name, fn in scenarios.items():
                    out[name].append(await _cpu_per_request(fn, bodies, args.requests, args.concurrency))
        await inbox.put({"type": "lifespan.shutdown"})
        await life
        return out


def instructions(args: argparse.Namespace) -> int:
    """Instructions per request of each scenario of ``args.instructions``, one callgrind run each."""
    names = args.instructions.split(",")
    unknown = set(names) - {"route", "context", "engine"}
    if unknown:
        raise SystemExit(f"unknown scenario(s) {sorted(unknown)}: choose from route, context, engine")
    counted = args.requests // args.concurrency * args.concurrency
    print(f"Instructions per request (callgrind), {args.concurrency} workers, {counted} requests per scenario")
    with tempfile.TemporaryDirectory(prefix="cn-route-icount-") as tmp:
        lib = helper_library(Path(tmp))
        for name in names:
            argv = [__file__, "--callgrind-inner", str(lib), name, "--requests", str(args.requests),
                    "--concurrency", str(args.concurrency)]
            print(f"{name:<8} {callgrind_count(argv, Path(tmp) / f'out.{name}') / counted:12,.0f}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=8000, help="requests per scenario and round (default 8000)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, scenarios interleaved (default 3)")
    ap.add_argument("--concurrency", type=int, default=8, help="workers, one market each (default 8)")
    ap.add_argument("--instructions", metavar="SCENARIOS",
                    help="count instructions per request of these scenarios (comma-separated) under callgrind")
    ap.add_argument("--callgrind-inner", nargs=2, metavar=("HELPER", "SCENARIO"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.instructions:
        return instructions(args)
    res = uvloop.run(_run(args))
    if args.callgrind_inner:
        return 0
    print(f"CPU µs per request, {args.concurrency} workers, median of {args.rounds} rounds (each round's figures in brackets)")
    for name, xs in res.items():
        print(f"{name:<8} {statistics.median(xs):8.1f}   [{', '.join(f'{x:.1f}' for x in xs)}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
