"""After neural.warmup_ticks ticks a market's outputs no longer depend on where it started."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cerebellar_norse.config import Config
from cerebellar_norse.neurons.network import CerebellarNetwork
from cerebellar_norse.synthetic import generate_ticks


def _probs(rs: list[dict[str, Any]]) -> np.ndarray:
    return np.array([[r["probabilities"][c] for c in ("down", "flat", "up")] for r in rs])


def _heavy_tailed(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    price = 100.0 * np.exp(np.cumsum(rng.standard_t(3, n) * 1e-3))
    ts = 1_600_000_000_000 + np.cumsum(rng.exponential(60_000, n)).astype(np.int64)
    return [{"price": float(p), "volume": float(rng.lognormal(5, 1)), "timestamp": int(t), "market_id": "X"}
            for p, t in zip(price, ts, strict=True)]


def _regimes(n: int, seed: int) -> list[dict[str, Any]]:
    ticks = generate_ticks(n, 1, seed)
    for t in ticks:
        t["market_id"] = "X"
    return ticks


@pytest.mark.parametrize(("series", "seed"), [(_regimes, 0), (_heavy_tailed, 1), (_regimes, 2), (_heavy_tailed, 3)])
def test_warm_and_cold_networks_agree_after_the_warmup(series: Any, seed: int) -> None:
    cfg = Config()  # the built-in default: the documented warm-up is for it
    ticks = series(3500, seed)
    history, later = ticks[:2000], ticks[2000:]
    warm = CerebellarNetwork(cfg)
    warm.process_batch(history)
    cold = CerebellarNetwork(cfg)
    rw, rc = warm.process_batch(later), cold.process_batch(later)
    diff = np.abs(_probs(rw) - _probs(rc)).max(axis=1)
    w = cfg.neural.warmup_ticks
    assert w <= 500
    assert diff[w:].max() <= 0.01, f"max difference {diff[w:].max():.4f} after {w} ticks"
    assert diff[:50].max() > 0.01  # the two really started apart
    assert [r["warming_up"] for r in rc] == [True] * w + [False] * (len(later) - w)
    assert not any(r["warming_up"] for r in rw)
