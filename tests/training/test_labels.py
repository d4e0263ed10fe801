"""Labels over the horizon: fixed and volatility bands, tick and time horizons, batch = stream."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cerebellar_norse.config import Config
from cerebellar_norse.training.labels import LabelSpec, StreamLabels, label_series, past_returns


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
    """Five markets' ticks interleaved at random, given in blocks of random sizes to a stream labeller whose pool and
    output start at one entry (so that both grow while ticks are labelled): each market's labels, forward returns
    and bands are bit for bit those of its whole series, every tick with an end tick is judged once, in the order
    of its end tick, and none is left pending but the ticks without one."""
    rng = np.random.default_rng(9)
    walks = [_walk(900 + 50 * m, 4 + m) for m in range(5)]
    order = rng.permutation(np.repeat(np.arange(5), [len(w[1]) for w in walks]))
    seen = [0] * 5
    obs = []
    for m in order:
        ts, p = walks[m]
        k = seen[m]
        obs.append((m + 1, ts[k], p[k], m, k))  # rows 1..5 (row 0 unused), payload: market and index
        seen[m] += 1
    obs_a = np.array(obs, dtype=np.float64)
    lab = StreamLabels(spec, 2, rows=3, pool=1, out=1)
    lab.grow_rows(6)
    got = [np.full(len(w[1]), -1) for w in walks]
    ret = [np.full(len(w[1]), np.nan) for w in walks]
    band = [np.full(len(w[1]), np.nan) for w in walks]
    judged_order = []
    at = 0
    while at < len(obs_a):
        n = int(rng.integers(1, 300))
        for block in lab.label(obs_a[at:at + n]):
            for cls, r, b, m, k in block.tolist():
                m, k = int(m), int(k)
                assert got[m][k] == -1
                got[m][k], ret[m][k], band[m][k] = int(cls), r, b
                judged_order.append((m, k))
        at += n
    unlabelled = 0
    for m, (ts, p) in enumerate(walks):
        batch = label_series(ts, p, spec)
        np.testing.assert_array_equal(got[m], batch.labels)
        np.testing.assert_array_equal(ret[m], batch.fwd_ret)
        np.testing.assert_array_equal(band[m], batch.band)
        unlabelled += int(np.sum(batch.labels < 0))
        ks = [k for mm, k in judged_order if mm == m]
        assert ks == sorted(ks)
    assert lab.pending == unlabelled and lab.dropped == 0


def test_stream_reset_and_pending_bound() -> None:
    """A reset row starts as a new market (its pending ticks dropped, its volatility forgotten: its labels are those
    of the series from the reset on); beyond ``max_pending`` waiting ticks of a market the oldest go unjudged and
    are counted."""
    ts, p = _walk(400, 11)
    spec = LabelSpec(horizon_ticks=5)
    lab = StreamLabels(spec, 1, rows=2)
    obs = np.column_stack([np.ones(400), ts, p, np.arange(400.0)])
    first = [b.copy() for b in lab.label(obs[:150])]
    assert sum(len(b) for b in first) == 145 and lab.pending == 5
    lab.reset(1)
    assert lab.pending == 0
    got = np.concatenate([b.copy() for b in lab.label(obs[150:])])
    batch = label_series(ts[150:], p[150:], spec)
    np.testing.assert_array_equal(got[:, 0], batch.labels[:245])
    np.testing.assert_array_equal(got[:, 3], np.arange(150.0, 395.0))
    # time horizon longer than the series: every tick waits; at most 10 of them
    bounded = StreamLabels(LabelSpec(horizon_ms=10**12), 0, rows=2, pool=4, max_pending=10)
    assert list(bounded.label(obs[:, :3])) == []
    assert bounded.pending == 10 and bounded.dropped == 390


def test_spec_from_config() -> None:
    cfg = Config.model_validate({"neural": {"horizon_ms": 60000}, "training": {"flat_band_mode": "fixed", "flat_band": 0.001}})
    spec = LabelSpec.from_config(cfg)
    assert spec.horizon_ms == 60000 and not spec.volatility_band and spec.flat_band == 0.001
    assert "60000 ms" in spec.describe() and "10 bp" in spec.describe()
