#!/usr/bin/env python3
"""How often ``evaluate``'s 95 % intervals exclude 0 for a model without skill (their false-alarm rate).

Each seed draws a return series with no predictability (``iid``: Gaussian; ``garch``:
GARCH(1,1) with Student-t(4) shocks, volatility clustering and heavy tails, as market
returns have), labels it as training does (``labels.label_series``, horizon in ticks),
takes the base rates from its first ``--ticks`` ticks (as ``evaluate`` takes them from the
model's training split) and scores the next ``--ticks``: a "model" that leans 5 % of the
moving mass on the sign of the last ``--lean-lag`` ticks' return (default 3; a feature with no information;
a long lag makes the prediction persist, as a trend follower's does)
against the base rates with :func:`cerebellar_norse.training.evaluation.score`. Printed,
per metric, the share of seeds whose model-minus-base-rates interval says the model is
better, and the share that says it is worse. For directional accuracy the truth is no
difference, so each share is a one-sided false-alarm rate, 2.5 % when the intervals are
exact; for the log losses the leaning model is truly worse than the base rates, so the
"worse" share is the power to say so. The model's P&L (``total_bp``, no cost) and its Sharpe ratio per trade
have no edge either: the share whose interval lies above 0 (better) or below it (worse) is a false-alarm rate too.

    .venv/bin/python benchmarks/interval_coverage.py --kind garch --seeds 1500 --ticks 8000
    .venv/bin/python benchmarks/interval_coverage.py --kind iid --seeds 400 --ticks 740
    .venv/bin/python benchmarks/interval_coverage.py --kind iid --seeds 400 --ticks 3000 --markets 4 --rho 0.9

``--markets K --rho R``: K markets of one period, their returns sharing a shock (correlation R), each leaning on its
own past, scored together (one market's rows after another's, with their times, as ``evaluate`` lists them): the
intervals must count them as one period's evidence, not K independent markets'.
"""

from __future__ import annotations

import argparse

import numpy as np

from cerebellar_norse.training.evaluation import ScoreInputs, score
from cerebellar_norse.training.labels import LabelSpec, label_series, past_returns

WARM = 100  # rows before the first scored one, at least (the leaning feature needs --lean-lag past ticks)


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


def _market(kind: str, r: np.ndarray, n: int, warm: int, horizon: int, lean_lag: int,
            base: np.ndarray | None) -> tuple[ScoreInputs, np.ndarray]:
    """One market's scored rows (the last ``n`` ticks after ``warm``) of the returns ``r``, leaning on its own past, with
    the base rates ``base`` (None: its first ``n`` ticks'), and the base rates used."""
    price = 100.0 * np.exp(np.cumsum(r))
    times = np.arange(price.size, dtype=np.int64) * 1000
    lab = label_series(times, price, LabelSpec(horizon_ticks=horizon))
    if base is None:
        train = np.arange(warm, n)
        train = train[lab.end[train] >= 0]
        base = np.bincount(lab.labels[train], minlength=3) / train.size
    rows = np.arange(n + warm, 2 * n + warm)
    rows = rows[lab.end[rows] >= 0]
    labels = lab.labels[rows]
    lean = np.sign(np.log(price[rows]) - np.log(price[rows - lean_lag]))
    probs = np.tile(base, (labels.size, 1))
    moving = base[0] + base[2]
    probs[:, 2] = moving * (0.5 + 0.05 * lean)
    probs[:, 0] = moving * (0.5 - 0.05 * lean)
    return ScoreInputs(probs, labels, lab.fwd_ret[rows], past_returns(price, lab.end)[rows], base, None, horizon, None,
                       times[rows].astype(np.float64)), base


def one_seed(kind: str, seed: int, n: int, horizon: int, resamples: int, lean_lag: int = 3, markets: int = 1,
             rho: float = 0.0) -> dict[str, tuple[bool, bool]]:
    """Per metric: (the interval says the model is better, the interval says it is worse). With ``markets`` > 1, as
    many markets of one period, their returns correlated ``rho`` (a shared shock), scored together, one after another
    as ``evaluate`` lists them."""
    rng = np.random.default_rng(1000 + seed)
    warm = max(WARM, lean_lag + 1)

    def draw() -> np.ndarray:
        return garch_returns(rng, 2 * n + 2 * warm) if kind == "garch" else rng.standard_normal(2 * n + 2 * warm) * 1e-3

    if markets == 1:
        inp, base = _market(kind, draw(), n, warm, horizon, lean_lag, None)
        inp.times_ms = None
    else:
        common = draw()
        parts: list[ScoreInputs] = []
        base = None
        for _ in range(markets):
            part, base = _market(kind, np.sqrt(rho) * common + np.sqrt(1.0 - rho) * draw(), n, warm, horizon,
                                 lean_lag, base)
            parts.append(part)
        cat = np.concatenate
        inp = ScoreInputs(cat([q.probs for q in parts]), cat([q.labels for q in parts]), cat([q.fwd_ret for q in parts]),
                          cat([q.past_ret for q in parts]), base, None, horizon,
                          np.array([f"M{k}" for k, q in enumerate(parts) for _ in range(q.labels.size)], dtype=object),
                          cat([q.times_ms for q in parts if q.times_ms is not None]))
    s = score(inp, bootstrap=resamples, seed=seed)
    out = {}
    for metric in ("directional_accuracy", "direction_log_loss", "log_loss"):
        lo, hi = s["vs_baselines"]["base_rates"][metric]["ci95"]
        higher, lower = lo > 0.0, hi < 0.0  # model minus base rates: an accuracy is better higher, a loss lower
        out[metric] = (higher, lower) if metric == "directional_accuracy" else (lower, higher)
    pnl = s["model"]["pnl"]
    for metric in ("total_bp", "sharpe_per_trade"):
        lo, hi = pnl[f"{metric}_ci95"]
        out[f"pnl_{metric}" if metric == "total_bp" else metric] = (lo > 0.0, hi < 0.0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("iid", "garch"), default="garch")
    ap.add_argument("--seeds", type=int, default=1500)
    ap.add_argument("--ticks", type=int, default=8000, help="ticks per seed for the base rates, and as many scored")
    ap.add_argument("--horizon", type=int, default=10, help="label horizon in ticks")
    ap.add_argument("--resamples", type=int, default=400,
                    help="score's bootstrap argument (> 0: intervals; their variance is exact, any number gives the same)")
    ap.add_argument("--lean-lag", type=int, default=3, help="ticks of past return the no-skill lean follows (default 3)")
    ap.add_argument("--markets", type=int, default=1, help="markets of one period scored together (default 1)")
    ap.add_argument("--rho", type=float, default=0.0, help="with --markets: the correlation of their returns")
    args = ap.parse_args(argv)
    hits: dict[str, list[int]] = {}
    for seed in range(args.seeds):
        for metric, sides in one_seed(args.kind, seed, args.ticks, args.horizon, args.resamples,
                                      args.lean_lag, args.markets, args.rho).items():
            counts = hits.setdefault(metric, [0, 0])
            counts[0] += sides[0]
            counts[1] += sides[1]
    print(f"{args.kind}, {args.seeds} seeds, base rates from {args.ticks} ticks, {args.ticks} scored, horizon "
          f"{args.horizon}, lean on the last {args.lean_lag} ticks"
          + (f", {args.markets} markets of correlation {args.rho:g}" if args.markets > 1 else "")
          + ": share of 95 % intervals (model − base rates) that say the model is better / worse")
    for metric, (better, worse) in hits.items():
        b, w = better / args.seeds, worse / args.seeds
        se_b, se_w = ((x * (1 - x) / args.seeds) ** 0.5 for x in (b, w))
        print(f"  {metric}: better {b:.3f} (± {se_b:.3f}), worse {w:.3f} (± {se_w:.3f}) (standard errors)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
