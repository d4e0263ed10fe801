#!/usr/bin/env python3
"""How often ``evaluate``'s verdict says ``trade`` for a model without skill, and whether it does for a planted edge.

Each seed draws an hourly series of Gaussian log returns (sd 10 bp a tick; ``--kind walk``: a random walk,
``shuffled``: the same returns of a series with regimes, shuffled, ``planted``: regimes of 50 ticks with a drift of
``--drift`` a tick up or down), labels it as training does (horizon 10 ticks), takes the base rates from its first
``--ticks`` ticks and scores the next ``--ticks`` with a "model" that puts its moving mass (0.5 ± tilt) on a view:
without skill, the sign of the last ``--lean-lag`` ticks' return (tilt 0.05; a long lag makes the position persist,
as a trend follower's does); planted, the regime of the ticks ahead (tilt 0.15). Printed: the verdicts
(:func:`cerebellar_norse.training.report.verdict`, with ``edge: direction``) at ``--cost-bp``, how many P&L intervals
lie above 0, and how many also have both differences with the constant positions above 0 (the P&L's own gate).

    .venv/bin/python benchmarks/verdict_controls.py --kind walk --seeds 100
    .venv/bin/python benchmarks/verdict_controls.py --kind planted --seeds 20
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from cerebellar_norse.training.evaluation import ScoreInputs, score
from cerebellar_norse.training.labels import LabelSpec, label_series, past_returns
from cerebellar_norse.training.report import verdict

HORIZON = 10
WARM = 300
REGIME = 50
HOUR_MS = 3_600_000


def one_seed(kind: str, seed: int, n: int, cost_bp: float, lean_lag: int, drift: float,
             resamples: int) -> tuple[str, bool, bool]:
    """(the verdict's action, the P&L interval above 0, that and both differences with constant positions above 0)."""
    rng = np.random.default_rng(5000 + seed)
    m = 2 * n + WARM + 100
    r = rng.standard_normal(m) * 1e-3
    regime = np.repeat(rng.choice([-1.0, 1.0], m // REGIME + 1), REGIME)[:m]
    if kind == "planted":
        r = r + drift * regime
    elif kind == "shuffled":
        r = rng.permutation(r + drift * regime)
    price = 100.0 * np.exp(np.cumsum(r))
    ts = np.arange(m, dtype=np.int64) * HOUR_MS
    lab = label_series(ts, price, LabelSpec(horizon_ticks=HORIZON))
    train = np.arange(WARM, n)
    train = train[lab.end[train] >= 0]
    base = np.bincount(lab.labels[train], minlength=3) / train.size
    rows = np.arange(n + WARM, 2 * n + WARM)
    rows = rows[lab.end[rows] >= 0]
    if kind == "planted":
        view, tilt = regime[rows + 1], 0.15
    else:
        view, tilt = np.sign(np.log(price[rows]) - np.log(price[rows - lean_lag])), 0.05
    moving = base[0] + base[2]
    probs = np.tile(base, (rows.size, 1))
    probs[:, 2] = moving * (0.5 + tilt * view)
    probs[:, 0] = moving * (0.5 - tilt * view)
    s = score(ScoreInputs(probs, lab.labels[rows], lab.fwd_ret[rows], past_returns(price, lab.end)[rows], base, None,
                          HORIZON, None, ts[rows].astype(np.float64)), cost_bp=cost_bp, bootstrap=resamples, seed=seed)
    pnl = s["model"]["pnl"]
    above = pnl["total_bp_ci95"][0] > 0
    gate = above and pnl["vs_always_long"]["ci95"][0] > 0 and pnl["vs_always_short"]["ci95"][0] > 0
    return verdict({**s, "edge": "direction"})["action"], above, gate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("walk", "shuffled", "planted"), default="walk")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--ticks", type=int, default=3000, help="ticks per seed for the base rates, and as many scored")
    ap.add_argument("--cost-bp", type=float, default=1.0)
    ap.add_argument("--lean-lag", type=int, default=3, help="ticks of past return the no-skill lean follows")
    ap.add_argument("--drift", type=float, default=1e-4, help="the regimes' drift a tick (log return)")
    ap.add_argument("--resamples", type=int, default=400,
                    help="score's bootstrap argument (> 0: intervals; their variance is exact, any number gives the same)")
    args = ap.parse_args(argv)
    actions: Counter[str] = Counter()
    above = gate = 0
    for seed in range(args.seeds):
        action, a, g = one_seed(args.kind, seed, args.ticks, args.cost_bp, args.lean_lag, args.drift, args.resamples)
        actions[action] += 1
        above += a
        gate += g
    print(f"{args.kind}, {args.seeds} series of {args.ticks} scored hourly ticks, horizon {HORIZON}, cost {args.cost_bp:g} bp"
          + (f", drift {args.drift:g}" if args.kind != "walk" else f", lean on the last {args.lean_lag} ticks")
          + f": verdicts {dict(sorted(actions.items()))}; P&L interval above 0: {above}; and both differences with "
          f"the constant positions above 0: {gate}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
