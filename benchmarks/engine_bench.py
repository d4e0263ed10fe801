#!/usr/bin/env python3
"""Engine benchmark: one sequential submitter against 64 concurrent submitters, in one run.

Both scenarios drive the real :class:`~cerebellar_norse.engine.engine.Engine` in this
process (no HTTP), on the event loop the service runs on (uvloop; ``--loop asyncio``
for the standard one), with the configuration of this process: the built-in default
(or ``--config``) plus ``CEREBELLAR_NORSE_*`` environment overrides.

* ``single``: one submitter sends ticks of one market, awaiting each result before the
  next (a client that needs the answer first);
* ``concurrent``: 64 submitters, each with its own market, each awaiting its results
  the same way, all at once.

Latency is submit -> result as the submitting coroutine sees it (``perf_counter_ns``
around ``await engine.submit(tick)``), so it includes queueing, the batch wait, the
kernel, and being scheduled again. Throughput is ticks / wall time of the scenario.
Each scenario runs on a fresh, warmed-up engine (plus an unmeasured warm pass), the
two alternate ``--repeats`` times and the medians are reported.

    .venv/bin/python benchmarks/engine_bench.py
    CEREBELLAR_NORSE_PERFORMANCE__CPU_THREADS=2 .venv/bin/python benchmarks/engine_bench.py

``--journal-compare`` runs each scenario twice per repeat, without and with the tick
journal (``[performance] journal``: every backend step appended to a memory-mapped
journal file in a temporary state dir before its results are returned, checkpoints
running as in the service), alternating, and reports the journal's cost as the ratio of
the two medians of the same run:

    .venv/bin/python benchmarks/engine_bench.py --journal-compare --repeats 5

Prints one JSON object and a Markdown table; results are recorded in docs/engine.md
(the journal comparison in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from cerebellar_norse.config import Config, load_config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.ticks import Tick, validate_ticks

SUBMITTERS = 64
TARGET_THROUGHPUT_RATIO = 5.0  # concurrent / single, at least
TARGET_P99_RATIO = 2.0  # concurrent p99 / single p99, at most
JOURNAL_COST_MAX = 0.10  # the journal may add at most this fraction to a tick's wall time


def market_ticks(market: str, n: int, seed: int) -> list[Tick]:
    """``n`` synthetic ticks of one market (time-ordered), renamed to ``market``."""
    return [replace(t, market_id=market) for t in validate_ticks(generate_ticks(n, 1, seed))]


async def submit_all(engine: Engine, ticks: list[Tick], lat: list[int]) -> None:
    """Submit ticks one at a time, awaiting each; append each latency (ns) to ``lat``."""
    clock = time.perf_counter_ns
    for t in ticks:
        t0 = clock()
        await engine.submit(t)
        lat.append(clock() - t0)


async def scenario(engine: Engine, streams: list[list[Tick]]) -> tuple[float, list[int]]:
    """Run one submitter per stream concurrently; (wall seconds, latencies in ns)."""
    lat: list[int] = []
    t0 = time.perf_counter()
    await asyncio.gather(*(submit_all(engine, s, lat) for s in streams))
    return time.perf_counter() - t0, lat


def summary(wall_s: float, lat: list[int], engine: Engine) -> dict[str, Any]:
    a = np.asarray(lat, dtype=np.float64) / 1e3
    st = engine.stats
    return {
        "ticks": len(lat),
        "wall_s": round(wall_s, 4),
        "throughput_ticks_per_s": round(len(lat) / wall_s, 1),
        "latency_us": {"p50": round(float(np.percentile(a, 50)), 2), "p90": round(float(np.percentile(a, 90)), 2),
                       "p99": round(float(np.percentile(a, 99)), 2), "max": round(float(a.max()), 2)},
        "mean_batch_size": round(st.ticks / max(st.batches, 1), 2),
        "kernel_us_per_tick": round(st.busy_ns / max(st.ticks, 1) / 1e3, 3),
    }


async def measure(cfg: Config, n_submitters: int, ticks_each: int, seed: int, journal: bool = False) -> dict[str, Any]:
    """One scenario on a fresh engine; with ``journal``, the service's tick journal on, in a temporary state dir."""
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        if journal:
            cfg = cfg.model_copy(update={"paths": cfg.paths.model_copy(update={"state_dir": tmp})})
        engine = Engine(cfg)
        durability = Durability(engine) if journal else None
        checkpoints = None
        if durability is not None:
            durability.recover()
            checkpoints = asyncio.create_task(durability.run())
        engine.warm_up()
        warm = [market_ticks(f"W{k:02d}", 200, seed + 1000 + k) for k in range(n_submitters)]
        streams = [market_ticks(f"B{k:02d}", ticks_each, seed + k) for k in range(n_submitters)]
        await scenario(engine, warm)
        engine.stats = type(engine.stats)()
        gc.collect()
        cpu0 = time.process_time()
        wall, lat = await scenario(engine, streams)
        cpu = time.process_time() - cpu0
        out = summary(wall, lat, engine)
        out["cpu_us_per_tick"] = round(cpu / max(len(lat), 1) * 1e6, 3)  # this process's CPU time (all its threads)
        if durability is not None:
            out["journal_records"] = durability.seq
        await engine.drain(save=False)
        if checkpoints is not None:
            checkpoints.cancel()
        return out


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats of every figure (ticks are equal across runs)."""
    med = dict(runs[0])
    for key in ("wall_s", "throughput_ticks_per_s", "mean_batch_size", "kernel_us_per_tick", "cpu_us_per_tick"):
        med[key] = round(statistics.median(r[key] for r in runs), 4)
    med["latency_us"] = {q: round(statistics.median(r["latency_us"][q] for r in runs), 2) for q in runs[0]["latency_us"]}
    med["repeats"] = len(runs)
    return med


def host_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
            "loadavg_1m_before": round(os.getloadavg()[0], 2), "python": platform.python_version(),
            "platform": platform.platform()}


def markdown(res: dict[str, Any]) -> str:
    s, c, r = res["single"], res["concurrent"], res["ratios"]
    rows = [
        "| scenario | ticks | throughput (ticks/s) | p50 (µs) | p90 (µs) | p99 (µs) | mean batch | kernel µs/tick |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, d in (("1 submitter, sequential", s), (f"{SUBMITTERS} submitters, concurrent", c)):
        lat = d["latency_us"]
        rows.append(f"| {name} | {d['ticks']} | {d['throughput_ticks_per_s']:,.0f} | {lat['p50']:.1f} | {lat['p90']:.1f} "
                    f"| {lat['p99']:.1f} | {d['mean_batch_size']:.1f} | {d['kernel_us_per_tick']:.2f} |")
    t = res["targets"]
    rows += [
        "",
        "| ratio (64 / 1) | value | target | met |",
        "|---|---:|---:|---|",
        f"| throughput | {r['throughput']:.2f}× | ≥ {TARGET_THROUGHPUT_RATIO:.0f}× | {'yes' if t['throughput_met'] else 'no'} |",
        f"| p99 latency | {r['p99']:.2f}× | ≤ {TARGET_P99_RATIO:.0f}× | {'yes' if t['p99_met'] else 'no'} |",
        f"| p50 latency | {r['p50']:.2f}× | – | – |",
    ]
    return "\n".join(rows)


def append_cost_ns(cfg: Config, n: int = 20_000) -> float:
    """ns per one-tick journal append (the hot-path addition alone), measured in this process."""
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        engine = Engine(cfg.model_copy(update={"paths": cfg.paths.model_copy(update={"state_dir": tmp})}))
        d = Durability(engine)
        d.recover()
        ticks = [(t,) for t in market_ticks("A", n, 0)]
        append = d.ticks
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter_ns()
            for one in ticks:
                append(one)
            best = min(best, (time.perf_counter_ns() - t0) / n)
            d.checkpoint_now()
        d.close(save=False)
        return round(best, 1)


def journal_cost(off: dict[str, dict[str, Any]], on: dict[str, dict[str, Any]], append_ns: float) -> dict[str, Any]:
    """Per scenario: medians without and with the journal, and the cost per tick (CPU time and wall time, on - off).

    The target is judged on CPU time per tick: on a shared host, wall time carries the
    other processes' load, while this process's CPU time is what the journal adds.
    """
    out: dict[str, Any] = {"append_ns_per_one_tick_record": append_ns}
    for name in ("single", "concurrent"):
        a, b = off[name], on[name]
        wall_off, wall_on = 1e6 / a["throughput_ticks_per_s"], 1e6 / b["throughput_ticks_per_s"]
        cpu_off, cpu_on = a["cpu_us_per_tick"], b["cpu_us_per_tick"]
        out[name] = {
            "off": a, "on": b,
            "cpu_us_per_tick": {"off": cpu_off, "on": cpu_on},
            "wall_us_per_tick": {"off": round(wall_off, 3), "on": round(wall_on, 3)},
            "cost_fraction_cpu": round(cpu_on / cpu_off - 1.0, 4),
            "cost_fraction_wall": round(wall_on / wall_off - 1.0, 4),
            "p50_ratio": round(b["latency_us"]["p50"] / a["latency_us"]["p50"], 4),
            "p99_ratio": round(b["latency_us"]["p99"] / a["latency_us"]["p99"], 4),
        }
    out["target_fraction_max"] = JOURNAL_COST_MAX
    out["met"] = all(out[n]["cost_fraction_cpu"] <= JOURNAL_COST_MAX for n in ("single", "concurrent"))
    return out


def journal_markdown(j: dict[str, Any]) -> str:
    rows = [
        "| scenario | CPU µs/tick off | CPU µs/tick on | cost (CPU) | wall µs/tick off | wall µs/tick on | cost (wall) | p50 on/off | p99 on/off |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in (("single", "1 submitter, sequential"), ("concurrent", f"{SUBMITTERS} submitters, concurrent")):
        d = j[name]
        rows.append(f"| {label} | {d['cpu_us_per_tick']['off']:.2f} | {d['cpu_us_per_tick']['on']:.2f} | {100 * d['cost_fraction_cpu']:+.1f}% "
                    f"| {d['wall_us_per_tick']['off']:.2f} | {d['wall_us_per_tick']['on']:.2f} | {100 * d['cost_fraction_wall']:+.1f}% "
                    f"| {d['p50_ratio']:.3f} | {d['p99_ratio']:.3f} |")
    rows.append(f"\nOne-tick journal append alone: {j['append_ns_per_one_tick_record']:.0f} ns (best of 3 × 20000, this process).")
    rows.append(f"Target: journal cost ≤ {100 * j['target_fraction_max']:.0f}% of a tick (CPU time): {'met' if j['met'] else 'not met'}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--config", help="TOML config (default: the built-in one); CEREBELLAR_NORSE_* overrides apply")
    ap.add_argument("--ticks", type=int, default=20_000, help="ticks per scenario (default 20000)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of both scenarios; medians reported")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="event loop (default: uvloop, as served)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--journal-compare", action="store_true",
                    help="run each scenario without and with the tick journal and report the journal's cost")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, environ=os.environ)

    runner: Callable[..., Any]
    if args.loop == "uvloop":
        import uvloop

        runner = uvloop.run
    else:
        runner = asyncio.run

    singles: list[dict[str, Any]] = []
    concurrents: list[dict[str, Any]] = []
    on: dict[str, list[dict[str, Any]]] = {"single": [], "concurrent": []}
    each = max(args.ticks // SUBMITTERS, 1)
    for k in range(args.repeats):  # with --journal-compare, off and on alternate with the same ticks
        singles.append(runner(measure(cfg, 1, args.ticks, args.seed + 100 * k)))
        if args.journal_compare:
            on["single"].append(runner(measure(cfg, 1, args.ticks, args.seed + 100 * k, journal=True)))
        concurrents.append(runner(measure(cfg, SUBMITTERS, each, args.seed + 100 * k)))
        if args.journal_compare:
            on["concurrent"].append(runner(measure(cfg, SUBMITTERS, each, args.seed + 100 * k, journal=True)))
    single, conc = median_of(singles), median_of(concurrents)
    journal: dict[str, Any] | None = None
    if args.journal_compare:
        journal = journal_cost({"single": single, "concurrent": conc}, {name: median_of(runs) for name, runs in on.items()},
                               append_cost_ns(cfg))
    ratios = {
        "throughput": round(conc["throughput_ticks_per_s"] / single["throughput_ticks_per_s"], 3),
        "p50": round(conc["latency_us"]["p50"] / single["latency_us"]["p50"], 3),
        "p99": round(conc["latency_us"]["p99"] / single["latency_us"]["p99"], 3),
    }
    perf = cfg.performance
    res: dict[str, Any] = {
        "command": " ".join([*(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("CEREBELLAR_NORSE_") and "__" in k),
                             "python", *sys.argv]),  # config overrides only (CEREBELLAR_NORSE_<SECTION>__<KEY>)
        "loop": args.loop,
        "config": {"batch_size": perf.batch_size, "max_batch_delay_us": perf.max_batch_delay_us,
                   "queue_size": perf.queue_size, "cpu_threads": perf.cpu_threads, "device": perf.device,
                   "granule_size": cfg.neural.granule_size, "precision": cfg.neural.precision},
        "host": host_info(),
        "single": single,
        "concurrent": conc,
        "submitters": SUBMITTERS,
        "ratios": ratios,
        "targets": {"throughput_ratio_min": TARGET_THROUGHPUT_RATIO, "throughput_met": ratios["throughput"] >= TARGET_THROUGHPUT_RATIO,
                    "p99_ratio_max": TARGET_P99_RATIO, "p99_met": ratios["p99"] <= TARGET_P99_RATIO},
    }
    if journal is not None:
        res["journal"] = journal
    print(json.dumps(res))
    print()
    print(markdown(res))
    if journal is not None:
        print()
        print(journal_markdown(journal))
    return 0


if __name__ == "__main__":
    sys.exit(main())
