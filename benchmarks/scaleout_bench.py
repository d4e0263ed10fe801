"""Throughput of 1 and 2 replicas behind HAProxy on this machine, in one run (ratios, medians).

Starts the replicas (``python -m cerebellar_norse.cli``, one numba thread each) and a
real HAProxy with the shipped configuration (``cerebellar-norse haproxy-config``), then
drives ``POST /neural/process`` through HAProxy from an asyncio client: ``--clients``
concurrent connections, each sending the ticks of its own markets in order (every
request carries ``X-Market-ID``). Each configuration is measured ``--repeats`` times,
alternating, ``--seconds`` each; the median ticks/s and the ratio of medians are
printed (``--json`` for one JSON object).

    .venv/bin/python benchmarks/scaleout_bench.py --seconds 5 --repeats 3

The load generator runs on the same cores as the replicas: on a 2-core machine a
second replica competes with it and with HAProxy, so the ratio here is a lower bound
of what a larger machine gives (see docs/scale-out.md for the arithmetic).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from cerebellar_norse.scaleout.haproxy import Replica, render_config

ROOT = Path(__file__).resolve().parents[1]
BASE_TS = 1_640_995_200_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_replica(root: Path, j: int) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEREBELLAR_NORSE_")}
    env.update({"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(root / f"r{j}"), "CEREBELLAR_NORSE_PERFORMANCE__CPU_THREADS": "1",
                "CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN": "false", "CEREBELLAR_NORSE_LOGGING__LEVEL": "WARNING"})
    log = (root / f"r{j}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "cerebellar_norse.cli", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, port


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} not healthy")


def start_haproxy(root: Path, ports: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
    port, stats = free_port(), free_port()
    cfg = root / f"haproxy-{len(ports)}.cfg"
    cfg.write_text(render_config([Replica(j + 1, "127.0.0.1", p) for j, p in enumerate(ports)], f"127.0.0.1:{port}",
                                 f"127.0.0.1:{stats}", str(root / f"haproxy-{len(ports)}.sock"), "stderr format raw",
                                 maxconn=1000))
    proc = subprocess.Popen([exe, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_healthy(f"http://127.0.0.1:{port}", proc)
    return proc, port


async def drive(url: str, clients: int, markets_per_client: int, seconds: float, start_k: int) -> int:
    """Ticks answered 200 within ``seconds`` by ``clients`` connections (each its own markets, in order)."""
    done = 0
    stop = time.monotonic() + seconds

    async def one(c: int) -> None:
        nonlocal done
        markets = [f"B{c:03d}-{m:03d}" for m in range(markets_per_client)]
        k = start_k
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=1)) as http:
            while time.monotonic() < stop:
                for m in markets:
                    tick = {"price": 100.0 + (k % 7) * 0.1, "volume": 1000.0, "timestamp": BASE_TS + 1000 * k, "market_id": m}
                    r = await http.post("/neural/process", json=tick, headers={"X-Market-ID": m})
                    if r.status_code == 200:
                        done += 1
                k += 1

    await asyncio.gather(*(one(c) for c in range(clients)))
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per repeat (default 5)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each configuration, alternating (default 3)")
    ap.add_argument("--clients", type=int, default=16, help="concurrent client connections (default 16)")
    ap.add_argument("--markets", type=int, default=4, help="markets per client connection (default 4)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="scaleout-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        started = [start_replica(root, j) for j in range(2)]
        procs += [p for p, _ in started]
        for p, port in started:
            wait_healthy(f"http://127.0.0.1:{port}", p)
        ports = [port for _, port in started]
        fronts = {}
        for n in (1, 2):
            hp, hport = start_haproxy(root, ports[:n])
            procs.append(hp)
            fronts[n] = f"http://127.0.0.1:{hport}"
        rates: dict[int, list[float]] = {1: [], 2: []}
        k = 0
        asyncio.run(drive(fronts[2], args.clients, args.markets, 2.0, k))  # warm-up: compile, connections
        k += 10_000
        for _ in range(args.repeats):
            for n in (1, 2):
                ticks = asyncio.run(drive(fronts[n], args.clients, args.markets, args.seconds, k))
                k += 10_000
                rates[n].append(ticks / args.seconds)
        med = {n: statistics.median(v) for n, v in rates.items()}
        out: dict[str, Any] = {"cpus": os.cpu_count(), "clients": args.clients, "markets": args.clients * args.markets,
                               "seconds": args.seconds, "repeats": args.repeats,
                               "ticks_per_s": {str(n): [round(x) for x in v] for n, v in rates.items()},
                               "median_ticks_per_s": {str(n): round(v) for n, v in med.items()},
                               "ratio_2_over_1": round(med[2] / med[1], 3)}
        if args.json:
            print(json.dumps(out, indent=2))
        else:
            print(f"cpus {out['cpus']}, {out['markets']} markets, {args.clients} connections, {args.repeats} x {args.seconds:g} s")
            for n in (1, 2):
                print(f"{n} replica(s): median {med[n]:.0f} ticks/s  (runs: {', '.join(f'{x:.0f}' for x in rates[n])})")
            print(f"ratio 2/1: {out['ratio_2_over_1']:.2f}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
