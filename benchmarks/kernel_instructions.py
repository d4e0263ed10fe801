#!/usr/bin/env python3
"""Instructions per tick of the engine's backend call, counted by valgrind's callgrind.

Timings on a shared host move by 50% within minutes; instruction counts do not. This
script runs itself under ``valgrind --tool=callgrind`` with instrumentation off until the
network is warm, then counts only the instructions executed inside each backend call
(collection toggled on and off around it through callgrind's client requests, from a
tiny C helper compiled on the fly), and prints instructions per tick for each batch
size. Cache misses and branch mispredictions are not in the count: it measures the work,
not the wait.

    .venv/bin/python benchmarks/kernel_instructions.py [--batches 1,256] [--calls 2000,40] [--window]

With ``--window`` it counts the engine's processing window instead: what
``processing_time_ns`` (and ``processing_duration_seconds``) times, from the clock read
before the backend call to the one after the finishing pass, in ``Engine.process_now``
of ticks over 20 markets (batch 1) or ``batch`` distinct markets. The clock reads that
toggle collection are counted too; their own cost, measured in a run with nothing
between them, is printed beside the window and taken off it.

The counts are of the kernel numba compiles under valgrind: LLVM is asked for the host's
CPU, and under valgrind that is valgrind's own (a Haswell: AVX2, FMA, no AVX-512), so on
a host with AVX-512 the variant counted is not the one that serves. Compare counts with
counts (one revision against another), not with the host's timings.

Needs ``valgrind`` (with its headers, ``valgrind/callgrind.h``) and a C compiler. To
compare two revisions, run the script with ``PYTHONPATH`` set to the other checkout: on
revisions older than the staged step (``Backend.step_buffered``) it times ``step``, the
call the engine made then.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELPER_C = """
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""
WARM_CALLS = 60
WINDOW_MARKETS = 20  # markets the single ticks of --window take turns over


def _measure(helper: str, batch: int, calls: int) -> None:
    """Inside valgrind: warm the network, then step ``calls`` batches with collection on only inside each call."""
    from cerebellar_norse.config import load_config
    from cerebellar_norse.neurons.bench import _prepared_batches
    from cerebellar_norse.neurons.network import CerebellarNetwork

    cg = ctypes.CDLL(helper)
    net = CerebellarNetwork(load_config(None), backend="fused", max_markets=max(batch, 1), max_batch=max(batch, 1))
    backend = net.backend
    staged = hasattr(backend, "step_buffered")  # older revisions: the engine called step
    if staged:
        in_slots, in_ticks = backend.input_buffers()
    for k, (slots, arr) in enumerate(_prepared_batches(net, batch, WARM_CALLS + calls, 7)):
        if k == WARM_CALLS:
            cg.cg_start()
        if staged:
            in_slots[:batch], in_ticks[:, :batch] = slots, arr
            cg.cg_toggle()
            backend.step_buffered(batch)
            cg.cg_toggle()
        else:
            cg.cg_toggle()
            backend.step(slots, arr)
            cg.cg_toggle()


class _TogglingClock:
    """``time`` for the engine's pipeline module: ``perf_counter_ns`` toggles collection once ``on``."""

    def __init__(self, cg: ctypes.CDLL) -> None:
        self.cg, self.on = cg, False

    def perf_counter_ns(self) -> int:
        if self.on:
            self.cg.cg_toggle()
        return time.perf_counter_ns()


def _measure_window(helper: str, batch: int, calls: int, empty: bool) -> None:
    """Inside valgrind: ``Engine.process_now`` of ``calls`` batches, collection on only inside the processing window.

    With ``empty``, the two clock reads back to back, no engine (the toggles' own instructions).
    """
    import numpy as np

    cg = ctypes.CDLL(helper)
    clock = _TogglingClock(cg)
    if empty:
        cg.cg_start()
        clock.on = True
        for _ in range(calls):
            clock.perf_counter_ns()
            clock.perf_counter_ns()
        return
    from cerebellar_norse.config import load_config
    from cerebellar_norse.engine import pipeline
    from cerebellar_norse.engine.engine import Engine
    from cerebellar_norse.ticks import Tick

    eng = Engine(load_config(None))
    eng.warm_up()
    pipeline.time = clock  # type: ignore[assignment]
    markets, k = max(batch, WINDOW_MARKETS), 0
    for n in range(WARM_CALLS + calls):
        if n == WARM_CALLS:
            cg.cg_start()
            clock.on = True
        ticks = []
        for _ in range(batch):
            k += 1
            ticks.append(Tick(100.0 * (1.0 + 0.001 * float(np.sin(k / 7.0))), 1000.0 + k % 17,
                              1_700_000_000_000 + 10 * k, f"M{k % markets:03d}"))
        eng.process_now(ticks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,256", help="batch sizes (default 1,256)")
    ap.add_argument("--calls", default="2000,40", help="counted calls per batch size (default 2000,40)")
    ap.add_argument("--window", action="store_true",
                    help="count the engine's processing window (processing_time_ns) instead of the backend call")
    ap.add_argument("--inner", nargs=4, metavar=("MODE", "HELPER", "BATCH", "CALLS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        mode, helper, b_, n_ = args.inner
        if mode == "kernel":
            _measure(helper, int(b_), int(n_))
        else:
            _measure_window(helper, int(b_), int(n_), mode == "empty")
        return 0
    batches = [int(b) for b in args.batches.split(",")]
    calls = [int(c) for c in args.calls.split(",")]
    if len(calls) != len(batches):
        raise SystemExit("--calls needs one count per batch size")
    with tempfile.TemporaryDirectory(prefix="cn-icount-") as tmp:
        lib = helper_library(Path(tmp))
        if not args.window:
            print(f"{'batch':>6} {'calls':>6} {'instructions/tick':>18}")
            for b, n in zip(batches, calls, strict=True):
                collected = callgrind_count([__file__, "--inner", "kernel", str(lib), str(b), str(n)], Path(tmp) / f"out.{b}")
                print(f"{b:>6} {n:>6} {collected / (b * n):>18,.0f}")
            return 0
        clocks = callgrind_count([__file__, "--inner", "empty", str(lib), "1", "1000"], Path(tmp) / "out.empty") / 1000
        print(f"{'batch':>6} {'calls':>6} {'window/call':>12} {'clock reads/call':>17} {'window/tick, net':>17}")
        for b, n in zip(batches, calls, strict=True):
            collected = callgrind_count([__file__, "--inner", "window", str(lib), str(b), str(n)], Path(tmp) / f"out.w{b}")
            print(f"{b:>6} {n:>6} {collected / n:>12,.0f} {clocks:>17,.0f} {(collected / n - clocks) / b:>17,.0f}")
    return 0


def helper_library(tmp: Path) -> Path:
    """Compile the callgrind client-request helper (``cg_start``, ``cg_toggle``) into ``tmp``; returns the .so."""
    for tool in ("valgrind", "cc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (apt-get install valgrind gcc)")
    src, lib = tmp / "cg.c", tmp / "libcg.so"
    src.write_text(HELPER_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def callgrind_count(argv: list[str], out_file: Path) -> int:
    """Run ``python argv…`` under callgrind with instrumentation off until the script turns it on; the instructions collected."""
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
           f"--callgrind-out-file={out_file}", sys.executable, *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), check=False)
    m = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    if proc.returncode != 0 or m is None:
        raise SystemExit(f"callgrind run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return int(m.group(1))


if __name__ == "__main__":
    raise SystemExit(main())
