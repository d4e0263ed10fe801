"""Labels over the horizon: fixed and volatility bands, tick and time horizons, batch = stream."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cerebellar_norse.config import Config
from cerebellar_norse.training.labels import LabelSpec, StreamLabeler, label_series, past_returns


def _walk(n: int, seed: int, scale: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    price = 100.0 * np.exp(np.cumsum(rng.normal(0.0, scale, n)))
    ts = 1_600_000_000_000.0 + np.cumsum(rng.integers(1, 5000, n)).astype(np.float64)
    return ts, price


def test_fixed_band_hand_computed() -> None:
    price = np.array([100.0, 101.0, 102.0, 99.5, 102.5, 95.0, 95.5])
    spec = LabelSpec(horizon_ticks=2, volatility_band=False, flat_band=0.01)
    lab = label_series(np.arange(7.0), price, spec)
    assert lab.labels.tolist() == [2, 0, 1, 0, 0, -1, -1]
    assert lab.fwd_ret[0] == pytest.approx(math.log(102.0 / 100.0))
    assert lab.end.tolist() == [2, 3, 4, 5, 6, -1, -1]


def test_volatility_band_scales_with_volatility() -> None:
    """The same shape of returns at 100x the volatility gets the same labels."""
    ts, p1 = _walk(3000, 1, 0.0001)
    _, p2 = _walk(3000, 1, 0.01)
    spec = LabelSpec(horizon_ticks=5)
    a, b = label_series(ts, p1, spec), label_series(ts, p2, spec)
    agree = np.mean(a.labels == b.labels)
    assert agree > 0.99
    shares = np.bincount(a.labels[a.labels >= 0], minlength=3) / np.sum(a.labels >= 0)
    assert all(0.2 < s < 0.45 for s in shares), shares  # a reasonable share of each class


def test_fixed_band_depends_on_scale() -> None:
    ts, p = _walk(2000, 2, 0.0001)
    lab = label_series(ts, p, LabelSpec(horizon_ticks=5, volatility_band=False, flat_band=0.0005))
    assert np.mean(lab.labels[lab.labels >= 0] == 1) > 0.8  # tiny moves: mostly flat


def test_volatility_is_causal() -> None:
    ts, p = _walk(500, 3)
    base = label_series(ts, p, LabelSpec(horizon_ticks=3))
    p2 = p.copy()
    p2[300:] *= np.exp(np.linspace(0, 0.5, 200))  # change the future only
    other = label_series(ts, p2, LabelSpec(horizon_ticks=3))
    np.testing.assert_array_equal(base.sigma[:300], other.sigma[:300])


def test_time_horizon() -> None:
    ts = np.array([0.0, 100.0, 150.0, 400.0, 1000.0, 1100.0])
    p = np.array([10.0, 11.0, 12.0, 9.0, 10.0, 10.5])
    lab = label_series(ts, p, LabelSpec(horizon_ms=300, volatility_band=False, flat_band=0.0))
    assert lab.end.tolist() == [3, 3, 4, 4, -1, -1]
    assert lab.labels.tolist() == [0, 0, 0, 2, -1, -1]
    past = past_returns(p, lab.end)
    assert math.isnan(past[0]) and past[3] == pytest.approx(math.log(9.0 / 11.0))  # latest start ending at 3 wins


@pytest.mark.parametrize("spec", [LabelSpec(horizon_ticks=7), LabelSpec(horizon_ticks=1, volatility_band=False),
                                  LabelSpec(horizon_ms=20_000), LabelSpec(horizon_ms=5_000, volatility_window=10)])
def test_stream_equals_batch(spec: LabelSpec) -> None:
    ts, p = _walk(3000, 4)
    batch = label_series(ts, p, spec)
    lab = StreamLabeler[int](spec)
    got = np.full(len(p), -1)
    ret = np.full(len(p), np.nan)
    for t in range(len(p)):
        for r in lab.observe(ts[t], p[t], t):
            got[r.payload] = r.label
            ret[r.payload] = r.fwd_ret
    np.testing.assert_array_equal(got, batch.labels)
    np.testing.assert_array_equal(ret, batch.fwd_ret)


def test_spec_from_config() -> None:
    cfg = Config.model_validate({"neural": {"horizon_ms": 60000}, "training": {"flat_band_mode": "fixed", "flat_band": 0.001}})
    spec = LabelSpec.from_config(cfg)
    assert spec.horizon_ms == 60000 and not spec.volatility_band and spec.flat_band == 0.001
    assert "60000 ms" in spec.describe() and "10 bp" in spec.describe()
