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

``--journal-compare`` also measures the tick journal's cost (``[performance] journal``:
every backend step appended to a memory-mapped journal file before its results are
returned). Per repeat and scenario, one engine recovered by the service's
:class:`~cerebellar_norse.engine.journal.Durability` (temporary state dir) steps the
ticks in blocks (500 ticks for one submitter, 8 per submitter for 64) with the journal
hook alternately off and on (order off, on, timed, timed, on, off, …; "timed" blocks time
each append for the journal's own share), so both modes share the run,
the engine and the host's drifts; the cost is the ratio of the two modes' medians of
this process's CPU time per tick (wall time is reported beside it), and the one-tick
append alone is timed too:

    .venv/bin/python benchmarks/engine_bench.py --journal-compare --repeats 5

``--recording-compare`` measures the cost of ``[debug] record_requests`` the same way:
one engine steps blocks of ticks with recording alternately off and on (order off, on,
on, off, …), sharing one recorder (one file, so a market's slot is copied once, at its
first recorded tick, as in service). Reported per mode: the event-loop thread's CPU time
per tick (the hot path: :meth:`TickRecorder.before_step` and :meth:`TickRecorder.record`),
the process's CPU time per tick (the writer thread included), wall time per tick, and
the median and p99 latency, with on/off ratios; and the slot copy a market's first
recorded tick costs, timed alone:

    .venv/bin/python benchmarks/engine_bench.py --recording-compare --repeats 5

Prints one JSON object and a Markdown table; results are recorded in docs/engine.md
(the journal and recording comparisons in docs/benchmarks.md).
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
from pathlib import Path
from typing import Any

import numpy as np

from cerebellar_norse.config import Config, load_config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.engine.recorder import TickRecorder
from cerebellar_norse.neurons.bench import cpu_model
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


async def measure(cfg: Config, n_submitters: int, ticks_each: int, seed: int) -> dict[str, Any]:
    engine = Engine(cfg)
    engine.warm_up()
    warm = [market_ticks(f"W{k:02d}", 200, seed + 1000 + k) for k in range(n_submitters)]
    streams = [market_ticks(f"B{k:02d}", ticks_each, seed + k) for k in range(n_submitters)]
    await scenario(engine, warm)
    engine.stats = type(engine.stats)()
    gc.collect()
    wall, lat = await scenario(engine, streams)
    return summary(wall, lat, engine)


class TimedJournal:
    """The journal hook of the engine, timing each append (ns) for the benchmark."""

    def __init__(self, durability: Durability) -> None:
        self.durability = durability
        self.ns = 0
        self.calls: list[int] = []

    def ticks(self, ticks: Any) -> None:
        t0 = time.perf_counter_ns()
        self.durability.ticks(ticks)
        dt = time.perf_counter_ns() - t0
        self.ns += dt
        self.calls.append(dt)


async def journal_ab(cfg: Config, n_submitters: int, ticks_each: int, block: int, seed: int) -> dict[str, Any]:
    """The journal's cost on one engine: blocks of ticks alternately without and with the journal (ABBA order).

    One engine, recovered by :class:`Durability` in a temporary state dir (as the
    service does), steps every block; the journal hook is detached for the "off" blocks.
    Blocks of ``block`` ticks per submitter in the order off, on, timed, timed, on, off, …
    cancel the host's slow drifts; the medians over the off and on blocks of this
    process's CPU time and of the wall time per tick are compared. The "timed" blocks
    run the journal behind a wrapper that times each append (its own time, page faults
    included), kept out of the on/off comparison.
    """
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        engine = Engine(cfg.model_copy(update={"paths": cfg.paths.model_copy(update={"state_dir": tmp})}))
        durability = Durability(engine)
        durability.recover()
        engine.warm_up()
        warm = [market_ticks(f"W{k:02d}", 200, seed + 1000 + k) for k in range(n_submitters)]
        await scenario(engine, warm)
        streams = [market_ticks(f"B{k:02d}", ticks_each, seed + k) for k in range(n_submitters)]
        per: dict[str, dict[str, list[float]]] = {m: {"cpu": [], "wall": [], "lat": []} for m in ("off", "on", "timed")}
        timed = TimedJournal(durability)
        hooks: dict[str, Any] = {"off": None, "on": durability, "timed": timed}
        gc.collect()
        for b, start in enumerate(range(0, ticks_each, block)):
            mode = ("off", "on", "timed", "timed", "on", "off")[b % 6]
            engine.journal = hooks[mode]
            part = [st[start:start + block] for st in streams]
            n = sum(len(p) for p in part)
            c0 = time.process_time()
            wall, lat = await scenario(engine, part)
            per[mode]["cpu"].append((time.process_time() - c0) / n * 1e6)
            per[mode]["wall"].append(wall / n * 1e6)
            per[mode]["lat"].extend(x / 1e3 for x in lat)
        engine.journal = durability
        records = durability.seq
        await engine.drain(save=False)
    timed_ticks = len(per["timed"]["lat"])
    out: dict[str, Any] = {"blocks": {m: len(per[m]["cpu"]) for m in per}, "block_ticks": block * n_submitters,
                           "journal_records": records,
                           # the journal's own time inside the serving loop, per tick (mean: page faults included)
                           "append_in_loop_us_per_tick": round(timed.ns / max(timed_ticks, 1) / 1e3, 3),
                           "append_in_loop_p50_us_per_record": round(float(np.percentile(np.asarray(timed.calls) / 1e3, 50)), 3)}
    for m in ("off", "on"):
        lat_a = np.asarray(per[m]["lat"])
        out[m] = {"cpu_us_per_tick": round(statistics.median(per[m]["cpu"]), 3),
                  "wall_us_per_tick": round(statistics.median(per[m]["wall"]), 3),
                  "latency_us": {"p50": round(float(np.percentile(lat_a, 50)), 2), "p99": round(float(np.percentile(lat_a, 99)), 2)}}
    off, on = out["off"], out["on"]
    out["cost_us_per_tick_cpu"] = round(on["cpu_us_per_tick"] - off["cpu_us_per_tick"], 3)
    out["cost_fraction_cpu"] = round(on["cpu_us_per_tick"] / off["cpu_us_per_tick"] - 1.0, 4)
    out["cost_fraction_wall"] = round(on["wall_us_per_tick"] / off["wall_us_per_tick"] - 1.0, 4)
    out["attributed_fraction_cpu"] = round(out["append_in_loop_us_per_tick"] / off["cpu_us_per_tick"], 4)
    out["p50_ratio"] = round(on["latency_us"]["p50"] / off["latency_us"]["p50"], 4)
    out["p99_ratio"] = round(on["latency_us"]["p99"] / off["latency_us"]["p99"], 4)
    return out


async def recording_ab(cfg: Config, n_submitters: int, ticks_each: int, block: int, seed: int) -> dict[str, Any]:
    """Recording's cost on one engine: blocks of ticks alternately with ``record_requests`` off and on (ABBA order).

    The "on" blocks share one recorder (temporary directory), kept aside during the
    "off" blocks, so each market's slot is copied once (its first recorded tick) and
    the file is not restarted. Per block: the loop thread's CPU time (``thread_time``:
    the hot path alone), the process's CPU time (the writer thread too) and wall time,
    per tick; latencies per tick.
    """
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        paths = cfg.paths.model_copy(update={"state_dir": tmp})
        cfg_off = cfg.model_copy(update={"paths": paths, "debug": cfg.debug.model_copy(update={"record_requests": False})})
        cfg_on = cfg_off.model_copy(update={"debug": cfg.debug.model_copy(update={"record_requests": True})})
        engine = Engine(cfg_off)
        engine.warm_up()
        warm = [market_ticks(f"W{k:02d}", 200, seed + 1000 + k) for k in range(n_submitters)]
        await scenario(engine, warm)
        streams = [market_ticks(f"B{k:02d}", ticks_each, seed + k) for k in range(n_submitters)]
        per: dict[str, dict[str, list[float]]] = {m: {"loop_cpu": [], "cpu": [], "wall": [], "lat": []} for m in ("off", "on")}
        recorder = TickRecorder(Path(tmp) / "recordings")
        gc.collect()
        for b, start in enumerate(range(0, ticks_each, block)):
            mode = ("off", "on", "on", "off")[b % 4]
            engine.cfg, engine.recorder = (cfg_on, recorder) if mode == "on" else (cfg_off, None)
            part = [st[start:start + block] for st in streams]
            n = sum(len(p) for p in part)
            c0, l0 = time.process_time(), time.thread_time()
            wall, lat = await scenario(engine, part)
            per[mode]["loop_cpu"].append((time.thread_time() - l0) / n * 1e6)
            per[mode]["cpu"].append((time.process_time() - c0) / n * 1e6)
            per[mode]["wall"].append(wall / n * 1e6)
            per[mode]["lat"].extend(x / 1e3 for x in lat)
        engine.cfg, engine.recorder = cfg_on, recorder
        await engine.drain(save=False)
        written, dropped, captured = recorder.written, recorder.dropped, recorder.states_captured
    out: dict[str, Any] = {"blocks": {m: len(per[m]["cpu"]) for m in per}, "block_ticks": block * n_submitters,
                           "recorded_ticks": written, "dropped_ticks": dropped, "slot_copies": captured}
    for m in ("off", "on"):
        lat_a = np.asarray(per[m]["lat"])
        out[m] = {k: round(statistics.median(per[m][k]), 3) for k in ("loop_cpu", "cpu", "wall")}
        out[m]["latency_us"] = {"p50": round(float(np.percentile(lat_a, 50)), 2),
                                "p99": round(float(np.percentile(lat_a, 99)), 2)}
    off, on = out["off"], out["on"]
    for k in ("loop_cpu", "cpu", "wall"):
        out[f"ratio_{k}"] = round(on[k] / off[k], 4)
    out["ratio_p50"] = round(on["latency_us"]["p50"] / off["latency_us"]["p50"], 4)
    out["ratio_p99"] = round(on["latency_us"]["p99"] / off["latency_us"]["p99"], 4)
    return out


def slot_copy_cost(cfg: Config, n: int = 20_000) -> dict[str, float]:
    """A market's first recorded tick: ns per slot copy (``read_slot``), best of 3 runs of ``n``, and the slot's bytes."""
    engine = Engine(cfg)
    arrays = engine.pool.arrays
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            arrays.read_slot(0)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return {"ns_per_copy": round(best, 1), "slot_bytes": sum(a.nbytes for a in arrays.read_slot(0).values())}


def recording_summary(runs: dict[str, list[dict[str, Any]]], copy: dict[str, float]) -> dict[str, Any]:
    """Medians over repeats of each scenario's recording A/B figures."""
    out: dict[str, Any] = {"slot_copy": copy}
    for name, rs in runs.items():
        med: dict[str, Any] = {k: round(statistics.median(r[k] for r in rs), 4)
                               for k in ("ratio_loop_cpu", "ratio_cpu", "ratio_wall", "ratio_p50", "ratio_p99")}
        for m in ("off", "on"):
            med[m] = {k: round(statistics.median(r[m][k] for r in rs), 3) for k in ("loop_cpu", "cpu", "wall")}
            med[m]["latency_us"] = {q: round(statistics.median(r[m]["latency_us"][q] for r in rs), 2) for q in ("p50", "p99")}
        med["blocks_per_run"] = rs[0]["blocks"]
        med["block_ticks"] = rs[0]["block_ticks"]
        med["dropped_ticks"] = sum(r["dropped_ticks"] for r in rs)
        med["runs"] = rs
        out[name] = med
    return out


def recording_markdown(j: dict[str, Any]) -> str:
    rows = [
        "| scenario | loop CPU µs/tick off | on | ratio | process CPU µs/tick off | on | ratio | wall µs/tick ratio "
        "| p50 µs off | on | ratio | p99 µs off | on | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in (("single", "1 submitter, one tick per step"), ("concurrent", f"{SUBMITTERS} submitters, batched")):
        d = j[name]
        off, on = d["off"], d["on"]
        rows.append(f"| {label} | {off['loop_cpu']:.2f} | {on['loop_cpu']:.2f} | {d['ratio_loop_cpu']:.3f} "
                    f"| {off['cpu']:.2f} | {on['cpu']:.2f} | {d['ratio_cpu']:.3f} | {d['ratio_wall']:.3f} "
                    f"| {off['latency_us']['p50']:.1f} | {on['latency_us']['p50']:.1f} | {d['ratio_p50']:.3f} "
                    f"| {off['latency_us']['p99']:.1f} | {on['latency_us']['p99']:.1f} | {d['ratio_p99']:.3f} |")
    c = j["slot_copy"]
    rows.append(f"\nSlot copy at a market's first recorded tick in a file: {c['ns_per_copy']:.0f} ns for {c['slot_bytes']:.0f} bytes "
                "(best of 3 × 20000, this process).")
    rows.append(f"Ticks dropped by the recorder during the comparison: {j['single']['dropped_ticks'] + j['concurrent']['dropped_ticks']}.")
    return "\n".join(rows)


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats of every figure (ticks are equal across runs)."""
    med = dict(runs[0])
    for key in ("wall_s", "throughput_ticks_per_s", "mean_batch_size", "kernel_us_per_tick"):
        med[key] = round(statistics.median(r[key] for r in runs), 4)
    med["latency_us"] = {q: round(statistics.median(r["latency_us"][q] for r in runs), 2) for q in runs[0]["latency_us"]}
    med["repeats"] = len(runs)
    return med


def host_info() -> dict[str, Any]:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
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
    """ns per one-tick journal append (the hot-path addition alone), best of 3 runs of ``n``, in this process."""
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


def journal_summary(runs: dict[str, list[dict[str, Any]]], append_ns: float) -> dict[str, Any]:
    """Medians over repeats of each scenario's A/B figures; the target is judged on CPU time per tick.

    On a shared host, wall time carries the other processes' load; this process's CPU
    time is what the journal adds to a tick.
    """
    out: dict[str, Any] = {"append_ns_per_one_tick_record": append_ns}
    for name, rs in runs.items():
        med = {k: round(statistics.median(r[k] for r in rs), 4)
               for k in ("cost_us_per_tick_cpu", "cost_fraction_cpu", "cost_fraction_wall", "p50_ratio", "p99_ratio",
                         "append_in_loop_us_per_tick", "append_in_loop_p50_us_per_record", "attributed_fraction_cpu")}
        for m in ("off", "on"):
            med[m] = {k: round(statistics.median(r[m][k] for r in rs), 3) for k in ("cpu_us_per_tick", "wall_us_per_tick")}
        med["blocks_per_run"] = rs[0]["blocks"]
        med["block_ticks"] = rs[0]["block_ticks"]
        med["runs"] = rs
        out[name] = med
    out["target_fraction_max"] = JOURNAL_COST_MAX
    out["met"] = all(out[n]["cost_fraction_cpu"] <= JOURNAL_COST_MAX for n in runs)
    return out


def journal_markdown(j: dict[str, Any]) -> str:
    rows = [
        "| scenario | CPU µs/tick off | CPU µs/tick on | cost on − off (CPU) | journal's own time µs/tick | its share of a tick (CPU) "
        "| wall µs/tick off | wall µs/tick on | cost (wall) | p50 on/off | p99 on/off |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in (("single", "1 submitter, sequential"), ("concurrent", f"{SUBMITTERS} submitters, concurrent")):
        d = j[name]
        rows.append(f"| {label} | {d['off']['cpu_us_per_tick']:.2f} | {d['on']['cpu_us_per_tick']:.2f} | {100 * d['cost_fraction_cpu']:+.1f}% "
                    f"| {d['append_in_loop_us_per_tick']:.2f} | {100 * d['attributed_fraction_cpu']:.1f}% "
                    f"| {d['off']['wall_us_per_tick']:.2f} | {d['on']['wall_us_per_tick']:.2f} | {100 * d['cost_fraction_wall']:+.1f}% "
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
                    help="also measure the tick journal's cost (blocks with the journal off and on, alternating)")
    ap.add_argument("--recording-compare", action="store_true",
                    help="also measure debug.record_requests' cost (blocks with recording off and on, alternating)")
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
    ab: dict[str, list[dict[str, Any]]] = {"single": [], "concurrent": []}
    rec_ab: dict[str, list[dict[str, Any]]] = {"single": [], "concurrent": []}
    each = max(args.ticks // SUBMITTERS, 1)
    for k in range(args.repeats):
        singles.append(runner(measure(cfg, 1, args.ticks, args.seed + 100 * k)))
        concurrents.append(runner(measure(cfg, SUBMITTERS, each, args.seed + 100 * k)))
        if args.journal_compare:
            ab["single"].append(runner(journal_ab(cfg, 1, args.ticks, 500, args.seed + 100 * k)))
            ab["concurrent"].append(runner(journal_ab(cfg, SUBMITTERS, each, 8, args.seed + 100 * k)))
        if args.recording_compare:
            rec_ab["single"].append(runner(recording_ab(cfg, 1, args.ticks, 500, args.seed + 100 * k)))
            rec_ab["concurrent"].append(runner(recording_ab(cfg, SUBMITTERS, each, 8, args.seed + 100 * k)))
    single, conc = median_of(singles), median_of(concurrents)
    journal = journal_summary(ab, append_cost_ns(cfg)) if args.journal_compare else None
    recording = recording_summary(rec_ab, slot_copy_cost(cfg)) if args.recording_compare else None
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
    if recording is not None:
        res["recording"] = recording
    print(json.dumps(res))
    print()
    print(markdown(res))
    if journal is not None:
        print()
        print(journal_markdown(journal))
    if recording is not None:
        print()
        print(recording_markdown(recording))
    return 0


if __name__ == "__main__":
    sys.exit(main())
