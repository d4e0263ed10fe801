"""Latency benchmark of the fused kernel against the Norse reference, in one run.

Per-tick latency is the wall time of one staged backend step (``step_buffered``, the
call the engine makes: encoder and network, no validation or HTTP) divided by the
ticks in the batch; p50 and p99 are over repeated calls on a warmed-up network fed a synthetic stream. The reference runs on
the same network (same weights) in the same process, so the speed-up is a ratio of
two figures taken under the same machine conditions.
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any

import numpy as np

from ..config import Config
from ..synthetic import generate_ticks
from ..ticks import validate_ticks
from .backends import Backend
from .network import CerebellarNetwork

FUSED_BATCHES = (1, 16, 256)


def _prepared_batches(net: CerebellarNetwork, batch: int, count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches, each one tick of each of ``batch`` distinct markets, as kernel arrays."""
    streams = [validate_ticks(generate_ticks(count, 1, seed * 100_003 + k)) for k in range(batch)]
    slots = np.array([net.pool.table.acquire(f"B{k:04d}") for k in range(batch)], dtype=np.int64)
    out = []
    for r in range(count):
        chunk = [streams[k][r] for k in range(batch)]
        arr = np.array([[t.price for t in chunk], [t.volume for t in chunk], [t.timestamp for t in chunk]], dtype=np.float64)
        out.append((slots, arr))
    return out


def time_backend(backend: Backend, batches: list[tuple[np.ndarray, np.ndarray]], warmup: int) -> dict[str, float]:
    """Per-tick p50/p99 (µs) of a staged backend step over ``batches`` after ``warmup`` calls.

    Each batch is copied into the backend's input buffers untimed, then
    ``step_buffered`` is timed: the call the engine makes.
    """
    staged_slots, staged_ticks = backend.input_buffers()
    per_tick = []
    for k, (slots, arr) in enumerate(batches):
        b = slots.shape[0]
        staged_slots[:b], staged_ticks[:, :b] = slots, arr
        t0 = time.perf_counter_ns()
        backend.step_buffered(b)
        if k >= warmup:
            per_tick.append((time.perf_counter_ns() - t0) / b)
    a = np.asarray(per_tick) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)), "calls": int(a.size)}


def run_bench(cfg: Config, ticks: int = 2000, reference_ticks: int = 200, seed: int = 11) -> dict[str, Any]:
    """Measure the fused kernel at batch 1/16/256 and the reference at batch 1; return the JSON object."""
    result: dict[str, Any] = {"fused": {}, "reference": {}}
    fused = CerebellarNetwork(cfg, backend="fused", max_markets=max(FUSED_BATCHES), max_batch=max(FUSED_BATCHES))
    warm = 50
    spikes_per_tick = 0.0
    for b in FUSED_BATCHES:
        calls = max(ticks // b, 30) + warm
        batches = _prepared_batches(fused, b, calls, seed + b)
        result["fused"][f"batch_{b}"] = time_backend(fused.backend, batches, warm)
        if b == 1:
            spikes_per_tick = float(np.mean([fused.backend.step(s, a)[1][0] for s, a in batches[-20:]], axis=0).sum())
    ref = CerebellarNetwork(cfg, backend="reference", weights=fused.weights, max_markets=1, max_batch=1)
    batches = _prepared_batches(ref, 1, reference_ticks + 10, seed + 1)
    result["reference"]["batch_1"] = time_backend(ref.backend, batches, 10)

    s = fused.params.shape
    neurons = s.granule + s.purkinje + s.dcn + s.classes
    f1 = result["fused"]["batch_1"]["p50_us"]
    f256 = result["fused"]["batch_256"]["p50_us"]
    result["speedup_vs_reference"] = result["reference"]["batch_1"]["p50_us"] / f1
    result["network"] = {"mossy": s.mossy, "granule": s.granule, "purkinje": s.purkinje, "dcn": s.dcn,
                         "steps_per_tick": fused.params.steps_per_tick, "precision": cfg.neural.precision,
                         "spikes_per_tick": spikes_per_tick}
    steps = fused.params.steps_per_tick
    # Synaptic events per tick: dense mossy->granule inputs plus the spike-driven ones
    # (mean parallel-fibre fan-out per granule spike; Purkinje->DCN; DCN->readout).
    syn_per_tick = s.granule * s.dendrites + s.dcn * s.mossy + spikes_per_tick * (s.purkinje * s.pf_per_purkinje / s.granule)
    for label, us in (("batch_1", f1), ("batch_256", f256)):
        result[f"throughput_{label}"] = {
            "ticks_per_s": 1e6 / us,
            "neuron_updates_per_s": neurons * steps * 1e6 / us,
            "synaptic_events_per_s": syn_per_tick * 1e6 / us,
        }
    result["host"] = {"machine": platform.machine(), "processor": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version()}
    return result


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_bench_command(cfg: Config, ticks: int, reference_ticks: int, as_json: bool) -> int:
    """``cerebellar-norse bench``: print the figures (one JSON object with ``--json``)."""
    r = run_bench(cfg, ticks, reference_ticks)
    if as_json:
        print(json.dumps(r))
        return 0
    net = r["network"]
    print(f"network: {net['granule']} granule, {net['purkinje']} Purkinje, {net['dcn']} DCN, {net['steps_per_tick']} steps/tick, {net['precision']}")
    print(f"host: {r['host']['processor']} ({r['host']['cpus']} cpus)")
    print(f"{'backend':<10} {'batch':>6} {'p50 us/tick':>12} {'p99 us/tick':>12}")
    for name in ("fused", "reference"):
        for key, v in r[name].items():
            print(f"{name:<10} {key.removeprefix('batch_'):>6} {v['p50_us']:>12.3f} {v['p99_us']:>12.3f}")
    print(f"speed-up of fused over reference (batch 1, p50): {r['speedup_vs_reference']:.1f}x")
    for label in ("batch_1", "batch_256"):
        t = r[f"throughput_{label}"]
        print(f"{label}: {t['ticks_per_s']:.0f} ticks/s, {t['neuron_updates_per_s']:.3g} neuron updates/s, {t['synaptic_events_per_s']:.3g} synaptic events/s")
    return 0
