#!/usr/bin/env python3
"""In-service processing time against the kernel's hot loop, and what idle gaps alone do, in one run.

The operations guide alerts on ``processing_duration_seconds`` (the network's time per
tick inside the service). This benchmark compares that time, as the service reports it
(``processing_time_ns`` of each answer), with the same kernel called back to back in a
hot loop in this process, on the same host and in the same run, so the figure that
matters is the ratio, not the absolute time of a noisy machine.

Service scenarios (a fresh service process on a free loopback port, built-in default
config, untrained network of the seed):

* ``sequential``: one keep-alive connection, one tick after another, 20 markets in turn;
* ``paced``: the same at ``--rate`` ticks/s (default 300) over 20 markets, the load under
  which the guide's alert was seen firing;
* ``batch256``: ``POST /neural/process/batch`` of 256 ticks (one per market), the
  per-tick cost reported by the service.

They run on a service of the built-in default config (``service``: the event loop polls
for 250 µs after a batch that came within 250 µs of the one before, and sleeps
otherwise; a warm step every ``performance.warm_step_interval_us`` = 1 ms while ticks
keep coming), on one without warm steps (``service-cold``: ``warm_step_interval_us =
0``); with ``--busy-poll-us`` on one with ``performance.busy_poll_us`` set to it
(``service+poll``; ``--busy-poll-us 0``: a service that sleeps at once after each batch,
as the default did before 2026-11-28); with ``--wakeup-us`` on one with
``performance.cpu_wakeup_latency_us`` set (``service+wake``: the host's idle CPUs kept
polling, or this quick to wake, while that service runs); with both options, also on
one with both keys set (``service+both``).

Each service scenario also gives the service process's CPU time over it as a share of
one core (``cores``): what polling costs.

Engine scenarios (this process, no HTTP, no I/O: ``Engine.process_now`` of one tick at a
time over 20 markets), to tell the service's own overhead from the host's:

* ``gap_none``: back to back;
* ``gap_spin_1ms`` / ``gap_spin_3ms``: the thread spins (no system call, no sleep) for 1 or
  3 ms between ticks, as a service idles between ticks at a few hundred ticks/s;
* ``gap_regs_3ms``: 3 ms of a compiled loop that touches no memory at all (registers
  only), so nothing of this process can evict the kernel's data or code meanwhile;
* ``gap_sleep_3ms``: the thread sleeps 3 ms (the CPU is idle, as the service's event loop
  is while it waits for the next request).

If the gaps alone inflate the engine's time as much as the paced service's, the caches are
being emptied by other work on the host between ticks, not by the service; if
``gap_regs_3ms`` does too, not by anything this process does.

    .venv/bin/python benchmarks/service_latency_bench.py [--ticks 3000] [--busy-poll-us 0] [--wakeup-us 0] [--no-cold] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numba as nb
import numpy as np
from http_bench import (  # benchmarks/ is the script's directory, first on sys.path
    RawConnection,
    process_cpu_s,
    service_env,
    start,
)

from cerebellar_norse.neurons.bench import cpu_model

MARKETS = 20
STARTUP_S = 90.0


class Service:
    """A service process on a free port with a temporary state dir, and a keep-alive raw connection to it."""

    def __init__(self, busy_poll_us: int | None = None, warm_step_interval_us: int | None = None,
                 cpu_wakeup_latency_us: int | None = None) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="cn-latency-")
        work = Path(self.tmp.name)
        env = service_env(work / "state", extra={"CEREBELLAR_NORSE_LOGGING__LEVEL": "WARNING"})
        if busy_poll_us is not None:
            env["CEREBELLAR_NORSE_PERFORMANCE__BUSY_POLL_US"] = str(busy_poll_us)
        if warm_step_interval_us is not None:
            env["CEREBELLAR_NORSE_PERFORMANCE__WARM_STEP_INTERVAL_US"] = str(warm_step_interval_us)
        if cpu_wakeup_latency_us is not None:
            env["CEREBELLAR_NORSE_PERFORMANCE__CPU_WAKEUP_LATENCY_US"] = str(cpu_wakeup_latency_us)
        self.server = start("service", ["-m", "cerebellar_norse.cli"], work, env)
        self.server.wait_ready("/health", STARTUP_S)
        self.conn = RawConnection(self.server.port)
        self.t0 = int(time.time() * 1000) - 3_600_000  # tick times: an hour ago on, 10 ms apart, never repeating
        self.k = 0
        if cpu_wakeup_latency_us is not None:
            self._check_wakeup_held()

    def _check_wakeup_held(self) -> None:
        """Stop the run unless the service holds its wake-up limit (a refusal would be measured as if it held it)."""
        scrape = httpx.get(self.server.url + "/metrics", timeout=10.0).text
        if "cerebellar_norse_cpu_wakeup_limit_held 1.0" not in scrape.splitlines():
            self.close()
            raise SystemExit("--wakeup-us: the service could not hold performance.cpu_wakeup_latency_us (write access to "
                             "/dev/cpu_dma_latency is needed: docs/install.md, \"CPU wake-up latency\")")

    def next_k(self) -> int:
        """A fresh tick index (times keep increasing across scenarios)."""
        self.k += 1
        return self.k

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` to ``path``; the status and the answer's body."""
        return self.conn.roundtrip(self.conn.request(path, body))

    def close(self) -> None:
        self.conn.close()
        self.server.stop()
        self.tmp.cleanup()


def _tick(market: int, k: int, t0: int) -> bytes:
    price = 100.0 * (1.0 + 0.001 * np.sin(k / 7.0 + market))
    return json.dumps({"price": price, "volume": 1000.0 + k % 17, "timestamp": t0 + 10 * k,
                       "market_id": f"M{market:02d}"}).encode()


def _quantiles(ns: list[int]) -> dict[str, float]:
    a = np.asarray(ns, dtype=np.float64) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p95_us": float(np.percentile(a, 95)),
            "p99_us": float(np.percentile(a, 99)), "n": int(a.size)}


def _cpu_now(svc: Service) -> tuple[float, float]:
    """The service process's CPU time so far and the wall clock (s)."""
    return sum(process_cpu_s(svc.server.proc.pid)), time.perf_counter()


def _cpu_share(svc: Service, since: tuple[float, float]) -> float:
    """The service process's CPU time since ``since`` (a :func:`_cpu_now`), as a share of one core."""
    (cpu0, wall0), (cpu1, wall1) = since, _cpu_now(svc)
    return (cpu1 - cpu0) / (wall1 - wall0)


def run_ticks(svc: Service, ticks: int, rate: float | None) -> dict[str, float]:
    """Send ``ticks`` single ticks round-robin over the markets (paced at ``rate``/s if given)."""
    out = []
    gap = 1.0 / rate if rate else 0.0
    since = _cpu_now(svc)
    nxt = time.perf_counter()
    for k in range(ticks + 200):
        if gap:
            nxt += gap
            pause = nxt - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        status, body = svc.post("/neural/process", _tick(k % MARKETS, svc.next_k(), svc.t0))
        if status != 200:
            raise SystemExit(f"tick answered {status}: {body[:200]!r}")
        if k >= 200:  # the first ticks load pages and warm the markets
            out.append(int(json.loads(body)["processing_time_ns"]))
    return {**_quantiles(out), "cpu_share": _cpu_share(svc, since)}


def run_batches(svc: Service, batches: int) -> dict[str, float]:
    """Batches of 256 ticks (one per market); the per-tick time the service reports."""
    out = []
    since = _cpu_now(svc)
    for k in range(batches + 5):
        kk = svc.next_k()
        body = b'{"ticks": [' + b",".join(_tick(m, kk, svc.t0).replace(b'"M', b'"B') for m in range(256)) + b"]}"
        status, answer = svc.post("/neural/process/batch", body)
        if status != 200:
            raise SystemExit(f"batch answered {status}: {answer[:200]!r}")
        if k >= 5:
            out.append(int(json.loads(answer)["results"][0]["processing_time_ns"]))
    return {**_quantiles(out), "cpu_share": _cpu_share(svc, since)}


def hot_loop(ticks: int) -> dict[str, float]:
    """The fused kernel of the default network called back to back (batch 1), as ``cerebellar-norse bench`` does."""
    from cerebellar_norse.config import load_checked_config
    from cerebellar_norse.neurons.bench import _prepared_batches, time_backend
    from cerebellar_norse.neurons.network import CerebellarNetwork

    net = CerebellarNetwork(load_checked_config(None), max_markets=MARKETS, max_batch=1)
    batches = _prepared_batches(net, 1, ticks + 200, 7)
    r = time_backend(net.backend, batches, 200)
    return {"p50_us": r["p50_us"], "p99_us": r["p99_us"], "n": r["calls"]}


@nb.njit(cache=False, nogil=True)
def _registers_loop(n: int) -> int:
    """``n`` rounds of a linear congruential step: registers only, no memory access."""
    x = 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
    return x


def _calibrate_registers_loop() -> int:
    """Rounds of :func:`_registers_loop` per ms on this host (compiled first)."""
    _registers_loop(10)
    n = 5_000_000
    t0 = time.perf_counter()
    _registers_loop(n)
    return max(1, int(n / ((time.perf_counter() - t0) * 1000)))


def engine_gaps(ticks: int) -> dict[str, dict[str, float]]:
    """The engine alone, one tick at a time over 20 markets, back to back and with idle gaps (spinning)."""
    from cerebellar_norse.config import load_checked_config
    from cerebellar_norse.engine.engine import Engine
    from cerebellar_norse.ticks import Tick

    eng = Engine(load_checked_config(None))
    eng.warm_up()
    k = 0

    def spin(s: float) -> None:
        end = time.perf_counter() + s
        while time.perf_counter() < end:
            pass

    regs_per_ms = _calibrate_registers_loop()

    def no_gap() -> None:
        pass

    gaps: list[tuple[str, Callable[[], None], int]] = [
        ("gap_none", no_gap, ticks), ("gap_spin_1ms", lambda: spin(0.001), ticks // 3),
        ("gap_spin_3ms", lambda: spin(0.003), ticks // 6), ("gap_regs_3ms", lambda: _registers_loop(3 * regs_per_ms), ticks // 6),
        ("gap_sleep_3ms", lambda: time.sleep(0.003), ticks // 6)]
    out = {}
    for label, gap, n in gaps:
        ns = []
        for i in range(n + 50):
            k += 1
            gap()
            t = Tick(100.0 * (1.0 + 0.001 * np.sin(k / 7.0)), 1000.0, 1_700_000_000_000 + 10 * k, f"M{k % MARKETS:02d}")
            r = eng.process_now([t])[0]
            if i >= 50:
                ns.append(r.processing_time_ns)
        out[label] = _quantiles(ns)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ticks", type=int, default=3000, help="ticks per single-tick scenario (default 3000)")
    ap.add_argument("--rate", type=float, default=300.0, help="ticks/s of the paced scenario (default 300)")
    ap.add_argument("--batches", type=int, default=60, help="batch requests of 256 ticks (default 60)")
    ap.add_argument("--busy-poll-us", type=int, default=None, metavar="US",
                    help="also run the service scenarios with performance.busy_poll_us = US (0: a service that "
                         "sleeps at once after each batch; the built-in default polls 250 us)")
    ap.add_argument("--wakeup-us", type=int, default=None, metavar="US",
                    help="also run the service scenarios with performance.cpu_wakeup_latency_us = US (the host's idle "
                         "CPUs kept this quick to wake while that service runs; needs write access to "
                         "/dev/cpu_dma_latency: the run stops when the service cannot hold it)")
    ap.add_argument("--no-cold", action="store_true", help="skip the service without warm steps (service-cold)")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()

    results: dict[str, Any] = {"host": {"cpu": cpu_model(), "cpus": os.cpu_count()}}
    before = hot_loop(args.ticks)
    services: list[tuple[str, int | None, int | None, int | None]] = [("service", None, None, None)]
    if not args.no_cold:
        services.append(("service-cold", None, 0, None))
    if args.busy_poll_us is not None:
        services.append(("service+poll", args.busy_poll_us, None, None))
    if args.wakeup_us is not None:
        services.append(("service+wake", None, None, args.wakeup_us))
        if args.busy_poll_us is not None:
            services.append(("service+both", args.busy_poll_us, None, args.wakeup_us))
    for where, poll, warm, wakeup in services:
        svc = Service(poll, warm, wakeup)
        try:
            results[where] = {"sequential": run_ticks(svc, args.ticks, None), "paced": run_ticks(svc, args.ticks, args.rate),
                              "batch256": run_batches(svc, args.batches)}
        finally:
            svc.close()
    results["engine"] = engine_gaps(args.ticks)
    after = hot_loop(args.ticks)
    base = (before["p50_us"] + after["p50_us"]) / 2
    results["hot_loop"] = {"before": before, "after": after, "p50_us": base}
    print(f"host: {results['host']['cpu']} ({results['host']['cpus']} cpus)")
    print(f"hot loop (kernel, batch 1, back to back): p50 {base:.2f} µs (before {before['p50_us']:.2f}, after {after['p50_us']:.2f})")
    print(f"{'where':<12} {'scenario':<13} {'p50 µs':>8} {'p95 µs':>8} {'p99 µs':>8} {'p50/hot':>8} {'p95/hot':>8} "
          f"{'cores':>6}")
    for where in [s[0] for s in services] + ["engine"]:
        for scen, q in results[where].items():
            q["p50_ratio"] = q["p50_us"] / base
            q["p95_ratio"] = q["p95_us"] / base
            print(f"{where:<12} {scen:<13} {q['p50_us']:>8.2f} {q['p95_us']:>8.2f} {q['p99_us']:>8.2f} "
                  f"{q['p50_ratio']:>8.2f} {q['p95_ratio']:>8.2f} " + (f"{q['cpu_share']:>6.2f}" if "cpu_share" in q else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
