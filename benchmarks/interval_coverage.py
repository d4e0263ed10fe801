#!/usr/bin/env python3
"""How often ``evaluate``'s 95 % intervals exclude 0 for a model without skill (their false-alarm rate).

Each seed draws a return series with no predictability (``iid``: Gaussian; ``garch``:
GARCH(1,1) with Student-t(4) shocks, volatility clustering and heavy tails, as market
returns have), labels it as training does (``labels.label_series``, horizon in ticks),
and scores a "model" that leans 5 % of the moving mass on the sign of the last three
ticks' return (a feature with no information) against the base rates with
:func:`cerebellar_norse.training.evaluation.score`. Printed: the share of seeds whose
model-minus-base-rates interval excludes 0, per metric. For directional accuracy the
truth is 0 (no skill either way), so the share is the false-alarm rate of a 95 %
interval, 5 % when the intervals are exact; for the log losses the leaning model is truly
worse than the base rates, so a share near 1 is the power to say so.

    .venv/bin/python benchmarks/interval_coverage.py --kind garch --seeds 400 --ticks 8000
"""

from __future__ import annotations

import argparse

import numpy as np

from cerebellar_norse.training.evaluation import ScoreInputs, score
from cerebellar_norse.training.labels import LabelSpec, label_series, past_returns

WARM = 100  # rows before the first scored one (the leaning feature needs 3 past ticks)


def garch_returns(rng: np.random.Generator, n: int, omega: float = 1e-6, alpha: float = 0.1, beta: float = 0.85,
                  df: int = 4) -> np.ndarray:
    """n GARCH(1,1) log returns with Student-t(``df``) shocks scaled to unit variance (no predictable mean)."""
    r = np.empty(n)
    h = omega / (1.0 - alpha - beta)
    shocks = rng.standard_t(df, n) / np.sqrt(df / (df - 2.0))
    for t in range(n):
        r[t] = np.sqrt(h) * shocks[t]
        h = omega + alpha * r[t] * r[t] + beta * h
    return r


def one_seed(kind: str, seed: int, n: int, horizon: int, resamples: int) -> dict[str, bool]:
    rng = np.random.default_rng(1000 + seed)
    r = garch_returns(rng, n + 2 * WARM) if kind == "garch" else rng.standard_normal(n + 2 * WARM) * 1e-3
    price = 100.0 * np.exp(np.cumsum(r))
    lab = label_series(np.arange(price.size, dtype=np.int64) * 1000, price, LabelSpec(horizon_ticks=horizon))
    rows = np.arange(WARM, n + WARM)
    rows = rows[lab.end[rows] >= 0]
    labels = lab.labels[rows]
    base = np.bincount(labels, minlength=3) / labels.size
    lean = np.sign(np.log(price[rows]) - np.log(price[rows - 3]))
    probs = np.tile(base, (labels.size, 1))
    moving = base[0] + base[2]
    probs[:, 2] = moving * (0.5 + 0.05 * lean)
    probs[:, 0] = moving * (0.5 - 0.05 * lean)
    s = score(ScoreInputs(probs, labels, lab.fwd_ret[rows], past_returns(price, lab.end)[rows], base, None, horizon, None),
              bootstrap=resamples, seed=seed)
    return {metric: bool(lo > 0.0 or hi < 0.0) for metric, (lo, hi) in
            ((m, s["vs_baselines"]["base_rates"][m]["ci95"]) for m in ("directional_accuracy", "direction_log_loss", "log_loss"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("iid", "garch"), default="garch")
    ap.add_argument("--seeds", type=int, default=400)
    ap.add_argument("--ticks", type=int, default=8000, help="scored ticks per seed")
    ap.add_argument("--horizon", type=int, default=10, help="label horizon in ticks")
    ap.add_argument("--resamples", type=int, default=400, help="bootstrap resamples per interval")
    args = ap.parse_args(argv)
    hits: dict[str, int] = {}
    for seed in range(args.seeds):
        for metric, excluded in one_seed(args.kind, seed, args.ticks, args.horizon, args.resamples).items():
            hits[metric] = hits.get(metric, 0) + excluded
    print(f"{args.kind}, {args.seeds} seeds of {args.ticks} ticks, horizon {args.horizon}: share of 95 % intervals "
          "(model − base rates) that exclude 0")
    for metric, k in hits.items():
        share = k / args.seeds
        se = (share * (1 - share) / args.seeds) ** 0.5
        print(f"  {metric}: {share:.3f} (± {se:.3f} standard error)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
