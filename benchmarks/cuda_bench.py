"""Latency benchmark of the CUDA backend (batch 1 / 256 / 1024), with the fused CPU backend beside it.

Usage::

    .venv/bin/python benchmarks/cuda_bench.py [--config PATH] [--batches 1,256,1024] [--calls 200]
                                              [--streams N] [--no-graphs] [--no-fused]

Per-tick latency is the wall time of one ``step`` call (host encoder, copy-in, the
network steps, copy-out, synchronisation) divided by the ticks of the batch; p50
and p99 are over ``--calls`` calls after a warm-up that also captures the CUDA
graphs. Each batch holds one tick of each of ``batch`` distinct markets, fed from
per-market synthetic random walks (seeded). ``pipelined`` is the same stream
submitted ``streams`` batches ahead (``submit``/``wait``), i.e. the throughput the
streams buy. The fused CPU kernel runs the same batches in the same process, so the
ratios are taken under the same conditions. ``weights`` gives the weight bytes
a batch reads (the mossy projections once per tick, the rest once per step) and the rate at
which the step reads them, to set against the device's memory bandwidth (``--hbm-gbps``).

Prints one JSON object. Without a CUDA device it prints a message and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cerebellar_norse.config import Config, load_checked_config  # noqa: E402
from cerebellar_norse.neurons.backends import FusedBackend  # noqa: E402
from cerebellar_norse.neurons.bench import time_backend as time_steps  # noqa: E402
from cerebellar_norse.neurons.parameters import encoder_parameters, network_parameters  # noqa: E402
from cerebellar_norse.neurons.state import StateArrays  # noqa: E402
from cerebellar_norse.neurons.topology import generate_weights  # noqa: E402
from cerebellar_norse.synthetic import START_MS  # noqa: E402


def market_batches(batch: int, count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches of one tick of each of ``batch`` markets (slots 0..batch-1), in time order."""
    rng = np.random.Generator(np.random.PCG64(seed))
    logp = np.log(rng.uniform(20.0, 200.0, batch))[:, None] + np.cumsum(rng.normal(0.0, 1e-3, (batch, count)), axis=1)
    volume = np.round(rng.lognormal(6.0, 0.6, (batch, count)), 2)
    ts = START_MS + np.cumsum(rng.exponential(250.0, (batch, count)), axis=1).astype(np.int64)
    slots = np.arange(batch, dtype=np.int64)
    return [(slots, np.stack([np.exp(logp[:, r]), volume[:, r], ts[:, r].astype(np.float64)])) for r in range(count)]


def percentiles(per_tick_ns: list[float]) -> dict[str, float]:
    """p50/p99 in µs per tick."""
    a = np.asarray(per_tick_ns) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)), "calls": int(a.size)}


def time_pipelined(backend: Any, batches: list[tuple[np.ndarray, np.ndarray]], depth: int) -> dict[str, float]:
    """Ticks per second with up to ``depth`` batches in flight (submit ahead, wait behind)."""
    handles = []
    t0 = time.perf_counter_ns()
    ticks = 0
    for slots, arr in batches:
        handles.append(backend.submit(slots, arr))
        ticks += slots.shape[0]
        if len(handles) >= depth:
            backend.wait(handles.pop(0))
    for h in handles:
        backend.wait(h)
    elapsed = time.perf_counter_ns() - t0
    return {"ticks_per_s": ticks * 1e9 / elapsed, "us_per_tick": elapsed / 1e3 / ticks, "depth": depth}


def weight_bytes_per_batch(cfg: Config) -> int:
    """Weight bytes one launch reads: the mossy projections once per tick, the rest once per step (the two sparse
    projections as int64 indices and values, see cerebellar_norse.cuda.projections)."""
    n = cfg.neural
    b = cfg.dtype_bytes
    per_tick = n.granule_size * n.granule_dendrites * (8 + b) + n.dcn_size * n.mossy_size * b
    per_step = (n.purkinje_size * n.connections_per_neuron * (8 + b)
                + b * (n.dcn_size * n.purkinje_size + 3 * n.dcn_size + n.purkinje_size))
    return per_tick + n.steps_per_tick * per_step


def run(cfg: Config, batches_list: list[int], calls: int, warmup: int, streams: int | None, graphs: bool,
        with_fused: bool, hbm_gbps: float | None, seed: int) -> dict[str, Any]:
    """Measure every batch size; returns the JSON object."""
    import torch

    from cerebellar_norse.cuda.backend import CudaBackend
    from cerebellar_norse.cuda.device import cuda_memory

    params = network_parameters(cfg)
    weights = generate_weights(cfg)
    enc = encoder_parameters(cfg.neural)
    golgi = float(weights.golgi_init)
    top = max(batches_list)
    n_streams = streams or cfg.performance.cuda_streams
    perf = cfg.performance
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda_version": torch.version.cuda,
                              "streams": n_streams, "graphs": graphs, "precision": cfg.neural.precision,
                              "network": dict(zip(("mossy", "granule", "purkinje", "dcn"), params.shape[:4], strict=True)),
                              "steps_per_tick": params.steps_per_tick, "cuda": {}, "pipelined": {}, "fused": {}}

    def fresh() -> StateArrays:
        st = StateArrays.allocate(top, params, cfg.neural.precision)
        for s in range(top):
            st.reset_slot(s, params, golgi)
        return st

    backend = CudaBackend(weights, params, fresh(), enc, top, streams=n_streams, memory_limit=int(perf.memory_limit),
                          pool_size=int(perf.memory_pool_size), pool_enabled=perf.memory_pool_enabled, use_graphs=graphs)
    fused = FusedBackend(weights, params, fresh(), enc, top, threads=perf.cpu_threads) if with_fused else None
    wb = weight_bytes_per_batch(cfg)
    for b in batches_list:
        data = market_batches(b, warmup + calls, seed + b)
        key = f"batch_{b}"
        result["cuda"][key] = time_steps(backend, data, warmup)
        result["pipelined"][key] = time_pipelined(backend, market_batches(b, calls, seed + 7 * b), max(n_streams, 1))
        step_s = result["cuda"][key]["p50_us"] * b / 1e6
        result["cuda"][key]["weight_read_GBps"] = wb / step_s / 1e9
        if hbm_gbps:
            result["cuda"][key]["fraction_of_hbm"] = wb / step_s / 1e9 / hbm_gbps
        if fused is not None:
            result["fused"][key] = time_steps(fused, data, warmup)
            result["fused"][key]["cuda_speedup_p50"] = result["fused"][key]["p50_us"] / result["cuda"][key]["p50_us"]
    used, total = cuda_memory()
    result["weights"] = {"bytes_per_batch": wb}
    result["memory"] = {"device_used_bytes": used, "device_total_bytes": total, **backend.memory_report()}
    result["captured_graphs"] = sorted(str(k) for k in backend.graph_policy.captured)
    result["launch_ticks"] = backend.launch_ticks
    backend.close()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--config", type=Path, default=None, help="TOML config (default: the built-in one)")
    ap.add_argument("--batches", default="1,256,1024", help="comma-separated batch sizes")
    ap.add_argument("--calls", type=int, default=200, help="timed calls per batch size")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls first (graphs are captured here)")
    ap.add_argument("--streams", type=int, default=None, help="override performance.cuda_streams")
    ap.add_argument("--no-graphs", action="store_true", help="run eagerly, without CUDA graphs")
    ap.add_argument("--no-fused", action="store_true", help="skip the fused CPU backend")
    ap.add_argument("--hbm-gbps", type=float, default=None, help="device memory bandwidth (GB/s) for the roofline fraction")
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("cuda_bench: no CUDA device on this host; nothing to measure", file=sys.stderr)
        return 0
    cfg = load_checked_config(args.config)
    batches = sorted({int(x) for x in args.batches.split(",") if x.strip()})
    if not batches or batches[0] < 1:
        ap.error("--batches needs positive sizes")
    res = run(cfg, batches, args.calls, max(args.warmup, 3), args.streams, not args.no_graphs, not args.no_fused,
              args.hbm_gbps, args.seed)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
