#!/usr/bin/env python3
"""Busy polling on a service confined to one CPU, alone there and beside a CPU-bound task.

A replica given a core of its own (``CPUAffinity=`` in a drop-in, a container's cpuset)
should poll between a steady client's ticks while nothing else wants that core, and stop
polling while something does (``engine/runqueue.py``). This benchmark confines a service
of the built-in default config to one CPU (``--service-cpu``) and itself, the sequential
client, to another (``--client-cpu``), then alternates two phases of ``--ticks`` sequential
ticks over 20 markets:

* ``alone``: nothing else runs on the service's CPU;
* ``beside``: a CPU-bound process (a Python busy loop) confined to the service's CPU too.

For each phase: the processing time the service reports (p50, p95, and p50 ÷ the kernel's
hot loop in this process, measured in the same run), the client's mean round trip
(``rt``: the phase's wall time over its requests, the 200 warm-up ticks of
``run_ticks`` included), the service's CPU time as a share of
one core (``cores``), the share of the phase's wall time that polling kept the event loop
awake (``polled``, from ``cerebellar_norse_busy_poll_seconds_total``) and, beside, the
busy process's share of the CPU (``other``). Alone, ``polled`` near 1 is polling at work;
beside, ``polled`` near 0 with ``other`` near what it gets from a service that never polls
is the busy process left its share.

    .venv/bin/python benchmarks/confined_polling_bench.py [--ticks 3000] [--rounds 2] [--service-cpu 1] [--client-cpu 0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from http_bench import process_cpu_s  # benchmarks/ is the script's directory, first on sys.path
from service_latency_bench import Service, hot_loop, run_ticks

from cerebellar_norse.neurons.bench import cpu_model

BUSY = "while True: pass"


def confine(pid: int, cpu: int) -> None:
    """Confine every thread of process ``pid`` to ``cpu`` (threads started later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), {cpu})


def polled_s(svc: Service) -> float:
    """``cerebellar_norse_busy_poll_seconds_total`` scraped from the service (s)."""
    for line in httpx.get(svc.server.url + "/metrics", timeout=10.0).text.splitlines():
        if line.startswith("cerebellar_norse_busy_poll_seconds_total "):
            return float(line.split()[1])
    raise SystemExit("the service's /metrics has no cerebellar_norse_busy_poll_seconds_total")


def phase(svc: Service, ticks: int, service_cpu: int, beside: bool) -> dict[str, float]:
    """One phase of sequential ticks; with ``beside``, a busy process on the service's CPU throughout."""
    busy = None
    if beside:
        busy = subprocess.Popen([sys.executable, "-c", BUSY])
        confine(busy.pid, service_cpu)
        time.sleep(0.5)
    try:
        busy_before = sum(process_cpu_s(busy.pid)) if busy else 0.0
        poll_before, t0 = polled_s(svc), time.monotonic()
        q = run_ticks(svc, ticks, None)
        wall = time.monotonic() - t0
        out = {**q, "polled": (polled_s(svc) - poll_before) / wall, "round_trip_us": wall / (ticks + 200) * 1e6}
        if busy:
            out["other"] = (sum(process_cpu_s(busy.pid)) - busy_before) / wall
        return out
    finally:
        if busy:
            busy.kill()
            busy.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=3000, help="sequential ticks per phase (default 3000)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the two phases, alternated (default 2)")
    ap.add_argument("--service-cpu", type=int, default=None, help="the service's CPU (default: the last usable one)")
    ap.add_argument("--client-cpu", type=int, default=None, help="this process's CPU (default: the first usable one)")
    args = ap.parse_args()
    if args.ticks < 1 or args.rounds < 1:
        ap.error("--ticks and --rounds must be at least 1")
    usable = sorted(os.sched_getaffinity(0))
    service_cpu = usable[-1] if args.service_cpu is None else args.service_cpu
    client_cpu = usable[0] if args.client_cpu is None else args.client_cpu
    if service_cpu == client_cpu or not {service_cpu, client_cpu} <= set(usable):
        raise SystemExit(f"need two different usable CPUs (usable: {usable}; service {service_cpu}, client {client_cpu})")
    os.sched_setaffinity(0, {client_cpu})
    print(f"host: {cpu_model()} ({os.cpu_count()} cpus); service on CPU {service_cpu}, client on CPU {client_cpu}")
    hot = hot_loop(args.ticks)["p50_us"]
    svc = Service()
    try:
        confine(svc.server.proc.pid, service_cpu)
        print(f"hot loop (kernel, batch 1, back to back): p50 {hot:.2f} µs")
        print(f"{'phase':<8} {'p50 µs':>8} {'p95 µs':>8} {'p50/hot':>8} {'rt µs':>7} {'cores':>6} {'polled':>7} {'other':>6}")
        for _ in range(args.rounds):
            for beside in (False, True):
                r = phase(svc, args.ticks, service_cpu, beside)
                other = f"{r['other']:6.2f}" if beside else f"{'-':>6}"
                print(f"{'beside' if beside else 'alone':<8} {r['p50_us']:8.2f} {r['p95_us']:8.2f} "
                      f"{r['p50_us'] / hot:8.2f} {r['round_trip_us']:7.1f} {r['cpu_share']:6.2f} {r['polled']:7.2f} {other}")
    finally:
        svc.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
