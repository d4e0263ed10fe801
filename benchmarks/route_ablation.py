#!/usr/bin/env python3
"""Where the server's CPU per ``POST /neural/process`` goes through HTTP: the route with its parts taken away.

Four service processes run side by side, each the real service (``cerebellar-norse``
on the built-in default config, the untrained network of the seed, a fresh temporary
state dir) with one change made in the process before it serves:

* ``full``: none, the service as operators run it;
* ``no-engine``: the tick is still read, validated and answered through the request
  context, but :func:`~cerebellar_norse.api.tickpath.answer_tick` returns a fixed
  answer (no checks, engine, batch, network, journal, live scoring or answer JSON);
* ``no-parse``: the fast path reads the body and returns the fixed answer at once
  (no content-type check, validation or engine); the request context still runs;
* ``bare``: the hot route is a bare ASGI answer (no request context either): what
  uvicorn with the service's settings costs per request.

The same load, ``--concurrency`` raw keep-alive connections (``http_bench.py``'s minimal
asyncio client, each connection its own market in time order), is sent to each in turn,
for ``--rounds`` rounds; the server's CPU time per request (user and system, from
``/proc``) and the throughput are reported per round, then the medians and the
differences between neighbouring variants, i.e. what each part costs per request. The
client shares the host, so throughput is the client's and the server's together; CPU
per request is the server's alone. ``/proc`` counts CPU time in clock ticks (10 ms), so
a figure from N requests is good to about 10 ms / N: 20,000 requests, 0.5 µs.

    .venv/bin/python benchmarks/route_ablation.py [--requests 20000] [--rounds 3] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

import httpx
from http_bench import (  # benchmarks/ is first on sys.path
    WARM_ROUNDS,
    Server,
    Ticks,
    process_cpu_s,
    raw_concurrent,
    run_async,
    service_env,
    start,
)

VARIANTS = ("full", "no-engine", "no-parse", "bare")
FIXED = (b'{"market_id":"m","prediction":0.0,"probabilities":{"down":0.3,"flat":0.4,"up":0.3},"confidence":0.01,'
         b'"spike_count":0,"processing_time_ns":3000,"warming_up":false,"model_version":"","request_id":"r"}')
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(FIXED)).encode())]


async def _read_body(receive: Any) -> None:
    while (await receive()).get("more_body"):
        pass


def _apply(variant: str) -> None:
    """Make ``variant``'s change in this process (before the service is built)."""
    if variant not in VARIANTS:  # before the service's imports: seconds
        raise SystemExit(f"unknown variant {variant!r}: choose from {', '.join(VARIANTS)}")
    from cerebellar_norse.api import fastpath, server

    if variant == "no-engine":
        async def fixed_answer(*args: Any, **kwargs: Any) -> bytes:
            return FIXED

        fastpath.answer_tick = fixed_answer
    elif variant == "no-parse":
        async def fixed_handle(self: Any, scope: Any, receive: Any, send: Any) -> None:
            await _read_body(receive)
            await self._reply(send, 200, FIXED)

        fastpath.TickFastPath._handle = fixed_handle  # type: ignore[method-assign]
    elif variant == "bare":
        create = server.create_app

        async def bare(scope: Any, receive: Any, send: Any) -> None:
            await _read_body(receive)
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
            await send({"type": "http.response.body", "body": FIXED})

        def create_bare(*args: Any, **kwargs: Any) -> Any:
            app = create(*args, **kwargs)
            app.hot = bare
            return app

        server.create_app = create_bare


def serve(variant: str, port: int) -> NoReturn:
    """Run the service with ``variant``'s change (the child process of a measurement), and exit as the command does."""
    _apply(variant)
    from cerebellar_norse.cli import run

    run(["--port", str(port)])


def mean_batch(metrics: str) -> float:
    """Mean engine batch (ticks) from a ``/metrics`` exposition: the batch-size histogram's sum over its count."""
    found = {}
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        if name in ("cerebellar_norse_batch_size_ticks_sum", "cerebellar_norse_batch_size_ticks_count"):
            found[name.rsplit("_", 1)[1]] = float(value)
    return found["sum"] / found["count"] if found.get("count") else float("nan")


def measure(args: argparse.Namespace) -> tuple[dict[str, list[dict[str, float]]], float]:
    """Per variant, one row per round: req/s and the server's user and system CPU µs per request; and the
    ``full`` service's mean batch over the run (ticks)."""
    out: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="route-ablation-") as tmp:
        work = Path(tmp)
        servers: dict[str, Server] = {}
        try:
            for v in VARIANTS:
                servers[v] = start(v, [__file__, "--serve", v], work, service_env(work / f"state-{v}"))
            for srv in servers.values():
                srv.wait_ready("/health")
            ticks = Ticks()
            for srv in servers.values():  # warm-up: connections, markets, lazy imports
                run_async(raw_concurrent(srv.port, "/neural/process", args.concurrency, args.requests // 10, args.max_seconds, ticks))
            for r in range(args.rounds):
                for v, srv in servers.items():
                    print(f"round {r + 1}: {v} ...", file=sys.stderr)
                    u0, s0 = process_cpu_s(srv.proc.pid)
                    res = run_async(raw_concurrent(srv.port, "/neural/process", args.concurrency, args.requests, args.max_seconds, ticks))
                    u1, s1 = process_cpu_s(srv.proc.pid)
                    if res["errors"]:
                        raise SystemExit(f"{v}: {res['errors']} requests were not answered 200")
                    n = res["requests"] + WARM_ROUNDS * args.concurrency  # the client's warm-up requests are served too
                    out[v].append({"rps": res["throughput_rps"], "user_us": 1e6 * (u1 - u0) / n, "system_us": 1e6 * (s1 - s0) / n})
            batch = mean_batch(httpx.get(servers["full"].url + "/metrics", timeout=10).text)
        finally:
            for srv in servers.values():
                srv.stop()
    return out, batch


def report(res: dict[str, list[dict[str, float]]], batch: float, args: argparse.Namespace) -> str:
    lines = [f"Server CPU per request (µs), concurrency {args.concurrency}, {args.requests} requests per variant and round",
             f"(full: the engine's batches held {batch:.2f} ticks on average)", "", f"{'variant':<10} {'req/s':>9} {'CPU':>7} {'user':>7} {'system':>7}   rounds (CPU)"]
    med: dict[str, float] = {}
    for v, rows in res.items():
        cpu = [r["user_us"] + r["system_us"] for r in rows]
        med[v] = statistics.median(cpu)
        lines.append(f"{v:<10} {statistics.median(r['rps'] for r in rows):9.0f} {med[v]:7.1f} "
                     f"{statistics.median(r['user_us'] for r in rows):7.1f} {statistics.median(r['system_us'] for r in rows):7.1f}"
                     f"   [{', '.join(f'{c:.1f}' for c in cpu)}]")
    parts = (("engine, checks and answer JSON", "full - no-engine", med["full"] - med["no-engine"]),
             ("content-type check and validation", "no-engine - no-parse", med["no-engine"] - med["no-parse"]),
             ("request context", "no-parse - bare", med["no-parse"] - med["bare"]),
             ("uvicorn and the socket", "bare", med["bare"]))
    lines += ["", "What each part costs per request (differences of the medians, µs):"]
    lines += [f"  {name:<36} {how:<22} {us:7.1f}" for name, how, us in parts]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20000, help="requests per variant and round (default 20000)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, variants interleaved (default 3)")
    ap.add_argument("--concurrency", type=int, default=8, help="connections, one market each (default 8)")
    ap.add_argument("--max-seconds", type=float, default=20.0, help="time cap per measurement (default 20)")
    ap.add_argument("--serve", metavar="VARIANT", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        return serve(args.serve, args.port)
    print(report(*measure(args), args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
