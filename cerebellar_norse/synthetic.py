"""Synthetic market ticks with a learnable structure (tests, demos, benchmarks).

Each market follows a log-price random walk whose drift depends on a hidden regime
(Markov chain): *trend* regimes continue the recent return (momentum), the *revert*
regime pulls the price back towards a slow moving average (mean reversion). Volume
is log-normal with bursts that accompany large moves; inter-tick gaps are
exponential and shrink during bursts. Everything is generated from one seed.

Units: price in quote currency, volume in traded units, timestamp in ms since epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

START_MS = 1_640_995_200_000  # 2022-01-01T00:00:00Z


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of the generator (per-tick volatility and regime persistence)."""

    volatility: float = 1e-3
    momentum: float = 0.35
    reversion: float = 0.08
    regime_stay: float = 0.995
    mean_gap_ms: float = 250.0
    burst_prob: float = 0.02


def market_ids(n: int) -> list[str]:
    """Deterministic market names M000, M001, …"""
    return [f"M{k:03d}" for k in range(n)]


def generate_ticks(n_ticks: int, n_markets: int = 4, seed: int = 0, spec: SyntheticSpec | None = None) -> list[dict[str, object]]:
    """``n_ticks`` ticks of ``n_markets`` markets interleaved at random, in time order per market."""
    return list(iter_ticks(n_ticks, n_markets, seed, spec))


def iter_ticks(n_ticks: int, n_markets: int = 4, seed: int = 0, spec: SyntheticSpec | None = None) -> Iterator[dict[str, object]]:
    """Generator form of :func:`generate_ticks`."""
    sp = spec or SyntheticSpec()
    rng = np.random.Generator(np.random.PCG64(seed))
    names = market_ids(n_markets)
    logp = np.log(rng.uniform(20.0, 200.0, n_markets))
    avg = logp.copy()
    last_ret = np.zeros(n_markets)
    regime = rng.integers(0, 3, n_markets)  # 0 trend-up-bias, 1 revert, 2 trend-down-bias
    clock = np.full(n_markets, float(START_MS)) + rng.uniform(0, 1000, n_markets)
    for _ in range(n_ticks):
        m = int(rng.integers(0, n_markets))
        if rng.random() > sp.regime_stay:
            regime[m] = rng.integers(0, 3)
        burst = rng.random() < sp.burst_prob
        vol = sp.volatility * (3.0 if burst else 1.0)
        if regime[m] == 1:
            drift = -sp.reversion * (logp[m] - avg[m])
        else:
            drift = sp.momentum * last_ret[m] + (0.2 if regime[m] == 0 else -0.2) * sp.volatility
        ret = drift + vol * rng.standard_normal()
        logp[m] += ret
        avg[m] += 0.02 * (logp[m] - avg[m])
        last_ret[m] = ret
        gap = rng.exponential(sp.mean_gap_ms * (0.2 if burst else 1.0))
        clock[m] += max(gap, 0.0)
        volume = float(np.round(rng.lognormal(6.0 + (1.5 if burst else 0.0) + 20.0 * abs(ret), 0.6), 2))
        yield {"price": float(np.round(np.exp(logp[m]), 6)), "volume": volume, "timestamp": int(clock[m]), "market_id": names[m]}
