#!/usr/bin/env python3
"""CPU per served tick of live self-evaluation (``LiveScorer.observe_batch``), in process.

Random-walk ticks of ``--markets`` markets, served in batches of ``--batch`` ticks with
random probabilities, go through the scorer with the service's default labels (horizon 10
ticks, volatility band) and window; each round reports ns per tick (wall clock, nothing
else running in the process), then the median and the spread of the rounds, and the
figures the scorer ends with (the same for any revision that labels the same way).

    .venv/bin/python benchmarks/live_eval_bench.py [--batch 7] [--markets 8] [--ticks 40000] [--rounds 5]

To compare revisions, run the script with ``PYTHONPATH`` set to the other checkout.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from cerebellar_norse.config import Config
from cerebellar_norse.engine.selfeval import LiveScorer
from cerebellar_norse.ticks import Tick
from cerebellar_norse.training.labels import LabelSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=7, help="ticks per served batch (default 7, as wrk at concurrency 8)")
    ap.add_argument("--markets", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=40_000, help="ticks per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    cfg = Config()
    scorer = LiveScorer(LabelSpec.from_config(cfg), cfg.training.live_evaluation_window, 1024)
    rng = np.random.default_rng(0)
    b, n = args.batch, args.ticks - args.ticks % args.batch
    price = np.full(args.markets, 100.0)
    ts = 1_600_000_000_000
    per_tick = []
    for _ in range(args.rounds):
        ticks = []
        for k in range(n):
            m = k % args.markets
            price[m] *= float(np.exp(rng.normal(0.0, 0.001)))
            ts += 1
            ticks.append(Tick(market_id=f"W{m}", timestamp=ts, price=float(price[m]), volume=1.0))
        probs = rng.dirichlet([1.0, 1.0, 1.0], size=b)
        warming = [False] * b
        t0 = time.perf_counter_ns()
        for i in range(0, n, b):
            scorer.observe_batch(ticks[i:i + b], probs, warming)
        per_tick.append((time.perf_counter_ns() - t0) / n)
        print(f"round {len(per_tick)}: {per_tick[-1]:.0f} ns per tick", flush=True)
    window, total = scorer.overall()
    print(f"batch {b}, {args.markets} markets: median {statistics.median(per_tick):.0f} ns per tick (range "
          f"{min(per_tick):.0f}–{max(per_tick):.0f}); judged {total['judged']}, window log loss "
          f"{window['model']['log_loss']:.6f}")


if __name__ == "__main__":
    main()
