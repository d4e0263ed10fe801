"""Synthetic market ticks with a learnable structure (tests, demos, benchmarks).

Each market switches between two hidden, persistent regimes (a Markov chain):

* *trend*: returns continue (``ret = momentum * previous ret + noise``), trading is
  busy (volume bursts, short gaps between ticks);
* *revert*: returns reverse (``ret = -reversion * previous ret + noise``), trading is
  quiet (low volume, longer gaps).

So the direction of the next ticks depends on the last return *and* on the volume
that identifies the regime: an interaction a linear model of the current tick
cannot use, but the granule layer's mixed mossy inputs can. Everything comes from
one seed.

Units: price in quote currency, volume in traded units, timestamp in ms since epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

START_MS = 1_640_995_200_000  # 2022-01-01T00:00:00Z


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of the generator: per-tick volatility, regime dynamics, activity."""

    volatility: float = 1e-3
    momentum: float = 0.6
    reversion: float = 0.6
    regime_stay: float = 0.98
    mean_gap_ms: float = 250.0
    busy_log_volume: float = 7.5
    quiet_log_volume: float = 5.5


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
    last_ret = np.zeros(n_markets)
    trend = rng.random(n_markets) < 0.5
    clock = np.full(n_markets, float(START_MS)) + rng.uniform(0, 1000, n_markets)
    for _ in range(n_ticks):
        m = int(rng.integers(0, n_markets))
        if rng.random() > sp.regime_stay:
            trend[m] = not trend[m]
        coef = sp.momentum if trend[m] else -sp.reversion
        ret = coef * last_ret[m] + sp.volatility * rng.standard_normal()
        logp[m] += ret
        last_ret[m] = ret
        gap = rng.exponential(sp.mean_gap_ms * (0.3 if trend[m] else 1.0))
        clock[m] += gap
        mu = sp.busy_log_volume if trend[m] else sp.quiet_log_volume
        volume = float(np.round(rng.lognormal(mu, 0.4), 2))
        yield {"price": float(np.round(np.exp(logp[m]), 6)), "volume": volume, "timestamp": int(clock[m]), "market_id": names[m]}
