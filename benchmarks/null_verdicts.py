#!/usr/bin/env python3
"""How often ``train`` then ``evaluate`` (the CLI, default config) say ``trade`` on series with nothing to trade.

Each seed writes one market's ticks (exchange hours 14:30-21:00 UTC on weekdays, ticks in bursts, a U-shaped
intraday profile of volatility and volume, overnight gaps, volumes that move with |returns|), trains a model on the
first 70 % of them (``train --from-scratch --epochs E --json``, which splits that part again into train / validation
/ test) and scores the last 30 % (``evaluate FILE --since T --cost-bp C --json``; the network runs over the whole file
and only the ticks from T on are scored). Families (``--kind``):

- ``micro``: GARCH(1,1) volatility with Student-t(4) shocks, jumps, the intraday profile, overnight gaps, prices on a
  tick grid of ``--tick-bp`` at 100 (many unchanged prints): a martingale before rounding, no edge;
- ``bounce``: a martingale mid (as ``micro``, unrounded) printed at the bid or the ask, each side with probability
  1/2 independently (half-spread ``--half-spread-bp``): the prints' returns have lag-1 autocorrelation about -0.5 ×
  (the bounce's share of their variance), an edge on the print that a taker pays the spread to reach;
- ``regime``: ``make-data``'s hidden regimes (trend: returns continue, busy; revert: returns reverse, quiet) with a
  momentum and reversion of ``--phi`` (0.6 in ``make-data``) in the first 70 %; after it volumes and gaps still
  switch with the regimes but returns no longer depend on them: the edge exists only where the model was trained;
- ``planted``: the regimes of ``regime`` throughout (the power check: a real edge of ``--phi``).

Printed per family: the verdicts, the rate of ``trade`` with its Wilson 95 % interval, and one line per series.

``--score-only`` skips the network: the "model" is the view that family's structure rewards, leaning 10 % of its
moving mass on it (against the print's side, below or above the mean of the last 8 prints, for ``micro`` and
``bounce``; with the last return in busy regimes and against it in quiet ones for ``regime`` and ``planted``), scored
as ``evaluate`` scores (labels of horizon 10 ticks, base rates from the first 70 %, the last 30 % scored,
``evaluate``'s verdict with ``edge: direction`` and the scored prices' bounce): what the verdict says of a model that
did pick the structure up, on many series in seconds.

    .venv/bin/python benchmarks/null_verdicts.py --kind micro --seeds 10
    .venv/bin/python benchmarks/null_verdicts.py --kind bounce --score-only --seeds 200 --cost-bp 0 3 6
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

DAY_MS = 86_400_000
HORIZON = 10  # neural.horizon_ticks of the default config
OPEN_MS = 14 * 3_600_000 + 30 * 60_000      # 14:30 UTC
SESSION_MS = 6 * 3_600_000 + 30 * 60_000    # 6.5 hours


def _timestamps(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ms times, intraday profile at each tick (U-shaped, mean about 1), 1 where a tick opens a session)."""
    times: list[int] = []
    prof: list[float] = []
    opens: list[int] = []
    day = 19_723  # 2024-01-01
    while len(times) < n:
        day += 1
        if (day + 3) % 7 in (5, 6):  # 1970-01-01 was a Thursday: skip Saturdays and Sundays
            continue
        # about 600-1400 ticks a session, denser near the open and the close
        k = int(rng.integers(600, 1400))
        u = np.sort(rng.beta(0.7, 0.7, k))
        ms = np.unique((u * (SESSION_MS - 1)).astype(np.int64))
        x = ms / SESSION_MS
        p = 0.6 + 1.6 * (x - 0.5) ** 2 * 4 / 1.6 * 0.8
        times.extend((day * DAY_MS + OPEN_MS + ms).tolist())
        prof.extend(p.tolist())
        opens.extend([1] + [0] * (ms.size - 1))
    return np.array(times[:n]), np.array(prof[:n]), np.array(opens[:n])


def _garch(rng: np.random.Generator, n: int, sd: float) -> tuple[np.ndarray, np.ndarray]:
    """(shocks of GARCH(1,1) volatility with unit-variance Student-t(4) innovations, scaled to ``sd``; the vol)."""
    z = rng.standard_t(4, n) / math.sqrt(2.0)
    omega, alpha, beta = 0.05, 0.08, 0.90
    h = np.empty(n)
    e = np.empty(n)
    var = omega / (1 - alpha - beta)
    for i in range(n):
        h[i] = var
        e[i] = math.sqrt(var) * z[i]
        var = omega + alpha * e[i] ** 2 + beta * var
    return e * sd, np.sqrt(h) * sd


def series(kind: str, seed: int, n: int, *, tick_bp: float, half_spread_bp: float, sd_bp: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ms times, prices, volumes) of one market."""
    rng = np.random.default_rng(9000 + seed)
    ts, prof, opens = _timestamps(rng, n)
    e, vol = _garch(rng, n, sd_bp * 1e-4)
    r = e * prof
    jumps = rng.random(n) < 0.002
    r[jumps] += rng.standard_t(3, int(jumps.sum())) * 8 * sd_bp * 1e-4
    r[opens == 1] += rng.standard_normal(int(opens.sum())) * 15 * sd_bp * 1e-4  # overnight gaps
    logmid = np.log(100.0) + np.cumsum(r)
    if kind == "bounce":
        side = rng.choice([-1.0, 1.0], n)
        price = np.exp(logmid + side * half_spread_bp * 1e-4)
    else:
        price = np.exp(logmid)
    if kind == "micro":
        grid = 100.0 * tick_bp * 1e-4
        price = np.maximum(np.round(price / grid), 1.0) * grid
    volume = np.round(rng.lognormal(3.0, 0.8, n) * prof * (1 + np.abs(r) / (vol + 1e-12)) / 2) + 1
    return ts, price, volume


def regimes(seed: int, n: int, coef: float, edge_until: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make-data``'s structure (cerebellar_norse.synthetic) for one market, its momentum and reversion ``coef``:
    hidden persistent regimes, trend (returns continue, busy: large volumes, short gaps) and revert (returns reverse,
    quiet). From tick ``edge_until`` on the returns no longer depend on the regime (coefficient 0), while volumes and
    gaps still switch with it: the cues the model learnt remain, the edge is gone."""
    rng = np.random.default_rng(7000 + seed)
    stay = rng.random(n) > 0.02
    trend = np.empty(n, dtype=bool)
    state = bool(rng.random() < 0.5)
    for i in range(n):
        state = state if stay[i] else not state
        trend[i] = state
    eps = 1e-3 * rng.standard_normal(n)
    r = np.empty(n)
    last = 0.0
    for i in range(n):
        c = (coef if trend[i] else -coef) if i < edge_until else 0.0
        last = c * last + eps[i]
        r[i] = last
    gaps = rng.exponential(np.where(trend, 0.3, 1.0) * 250.0)
    ts = 1_704_153_600_000 + np.cumsum(np.maximum(gaps, 1.0)).astype(np.int64)
    volume = np.round(rng.lognormal(np.where(trend, 7.5, 5.5), 0.4))
    return ts, 50.0 * np.exp(np.cumsum(r)), volume


def write_csv(path: Path, ts: np.ndarray, price: np.ndarray, volume: np.ndarray) -> None:
    with open(path, "w") as f:
        f.write("timestamp,price,volume\n")
        for t, p, v in zip(ts, price, volume, strict=True):
            f.write(f"{int(t)},{p:.6f},{int(v)}\n")


def family_series(kind: str, seed: int, args: argparse.Namespace, cut: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(timestamps ms, prices, volumes) of ``kind``'s series ``seed``; ``cut``: the first tick after training."""
    if kind in ("regime", "planted"):
        return regimes(seed, args.ticks, args.phi, cut if kind == "regime" else args.ticks)
    return series(kind, seed, args.ticks, tick_bp=args.tick_bp, half_spread_bp=args.half_spread_bp, sd_bp=args.sd_bp)


def run_one(kind: str, seed: int, args: argparse.Namespace, work: Path) -> dict:
    cut = int(0.7 * args.ticks)
    ts, price, volume = family_series(kind, seed, args, cut)
    d = work / f"{kind}{seed}"
    d.mkdir()
    (d / "state").mkdir()
    cfg = d / "c.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{d / "state"}"\ndata_dir = "{d}"\n')
    whole, part = d / "MKT.csv", d / "MKT_train.csv"
    write_csv(whole, ts, price, volume)
    write_csv(part, ts[:cut], price[:cut], volume[:cut])
    exe = [sys.executable, "-m", "cerebellar_norse.cli", "--config", str(cfg)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tr = subprocess.run([*exe, "train", str(part), "--from-scratch", "--activate", "--epochs", str(args.epochs),
                               "--json"], capture_output=True, text=True, env=env)
    if tr.returncode != 0:
        raise SystemExit(f"train failed: {tr.stderr[-2000:]}")
    trained = json.loads(tr.stdout)
    out = {"seed": seed, "edge": trained.get("edge")}
    for cost in args.cost_bp:
        ev = subprocess.run([*exe, "evaluate", str(whole), "--since", str(int(ts[cut])), "--cost-bp", str(cost),
                                   "--json"], capture_output=True, text=True, env=env)
        if ev.returncode != 0:
            raise SystemExit(f"evaluate failed: {ev.stderr[-2000:]}")
        s = json.loads(ev.stdout)
        pnl = (s.get("model") or {}).get("pnl") or {}
        out[f"cost {cost:g}"] = {"action": s["verdict"]["action"], "reason": s["verdict"]["reason"][:300],
                                 "total_bp": pnl.get("total_bp"), "total_bp_ci95": pnl.get("total_bp_ci95")}
    return out


def score_one(kind: str, seed: int, args: argparse.Namespace) -> dict:
    """The verdicts of the view ``kind``'s structure rewards, at each of ``args.cost_bp`` (``--score-only``)."""
    from cerebellar_norse.training.evaluation import ScoreInputs, bid_ask_bounce, score
    from cerebellar_norse.training.labels import LabelSpec, label_series, past_returns
    from cerebellar_norse.training.report import verdict

    cut = int(0.7 * args.ticks)
    ts, price, volume = family_series(kind, seed, args, cut)
    lab = label_series(ts, price, LabelSpec(horizon_ticks=HORIZON))
    seen = np.arange(500, cut)
    seen = seen[(lab.end[seen] >= 0) & (lab.end[seen] < cut)]
    base = np.bincount(lab.labels[seen], minlength=3) / seen.size
    rows = np.arange(cut, ts.size)
    rows = rows[lab.end[rows] >= 0]
    lp = np.log(price)
    if kind in ("regime", "planted"):
        view = np.sign(lp[rows] - lp[rows - 1]) * np.where(np.log(volume[rows]) > 6.5, 1.0, -1.0)
    else:
        view = -np.sign(lp[rows] - np.array([lp[r - 8:r].mean() for r in rows]))
    moving = base[0] + base[2]
    probs = np.tile(base, (rows.size, 1))
    probs[:, 2], probs[:, 0] = moving * (0.5 + 0.1 * view), moving * (0.5 - 0.1 * view)
    inp = ScoreInputs(probs, lab.labels[rows], lab.fwd_ret[rows], past_returns(price, lab.end)[rows], base, None,
                      HORIZON, None, ts[rows].astype(np.float64))
    bounce = bid_ask_bounce([np.diff(lp[rows[0]:rows[-1] + 1])])
    out: dict = {"seed": seed, "bounce_bp": bounce and bounce["spread_bp"]}
    for asked in args.cost_bp:
        cost = asked
        if args.charge_spread and bounce and bounce["spread_bp"] is not None and bounce["spread_bp"] > cost:
            cost = math.ceil(bounce["spread_bp"] * 100) / 100  # as a user told by the verdict would re-run it
        s = score(inp, cost_bp=cost, bootstrap=400)
        v = verdict({**s, "edge": "direction", "bounce": None if args.ignore_bounce else bounce})
        out[f"cost {asked:g}"] = {"action": v["action"], "total_bp": s["model"]["pnl"]["total_bp"], "charged": cost}
    return out


def wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    z = 1.959964
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, c - h), min(1.0, c + h))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("micro", "bounce", "regime", "planted"), default="micro")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--ticks", type=int, default=10_000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--cost-bp", type=float, nargs="+", default=[1.0])
    ap.add_argument("--sd-bp", type=float, default=2.0, help="per-tick return sd before the intraday profile")
    ap.add_argument("--tick-bp", type=float, default=5.0, help="micro: the price grid at 100, in bp")
    ap.add_argument("--half-spread-bp", type=float, default=3.0, help="bounce: the half-spread in bp")
    ap.add_argument("--score-only", action="store_true", help="no network: score the view the structure rewards")
    ap.add_argument("--ignore-bounce", action="store_true",
                    help="--score-only: the verdict without the scored prices' bounce (as before it was read)")
    ap.add_argument("--charge-spread", action="store_true",
                    help="--score-only: where the verdict names a spread above --cost-bp, charge that spread instead "
                         "(the re-run it asks for)")
    ap.add_argument("--phi", type=float, default=0.3, help="regime, planted: the regimes' momentum and reversion")
    args = ap.parse_args(argv)
    counts: dict[str, Counter[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            res = score_one(args.kind, seed, args) if args.score_only else run_one(args.kind, seed, args, Path(tmp))
            print(json.dumps(res), flush=True)
            for k, v in res.items():
                if k.startswith("cost"):
                    counts.setdefault(k, Counter())[v["action"]] += 1
    for k, c in counts.items():
        n = sum(c.values())
        lo, hi = wilson(c["trade"], n)
        print(f"{args.kind}, {k} bp: {dict(sorted(c.items()))}; trade {c['trade']}/{n} "
              f"(95 % interval {lo:.1%}-{hi:.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
