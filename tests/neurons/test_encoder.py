"""Tick encoder: running normaliser (first tick, finiteness, clipping, state) and population code."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from cerebellar_norse.config import Config
from cerebellar_norse.neurons.encoder import (
    N_ENC_STATE,
    S_COUNT,
    S_LAST_PRICE,
    S_LAST_TS,
    S_MEAN,
    S_N_TICKS,
    S_VAR,
    encode_tick,
    encode_tick_to_mossy,
    population_code,
)
from cerebellar_norse.neurons.network import CerebellarNetwork
from cerebellar_norse.neurons.parameters import encoder_parameters

T0 = 1_640_995_200_000.0
WINDOW, CLIP = 1000.0, 4.0


def _encode(state: np.ndarray, price: float, volume: float, ts: float, window: float = WINDOW, clip: float = CLIP) -> np.ndarray:
    z = np.full(3, np.nan)
    encode_tick(state, price, volume, ts, window, clip, z)
    return z


def test_first_tick_has_zero_return_and_gap() -> None:
    st = np.zeros(N_ENC_STATE)
    z = _encode(st, 123.45, 1000.0, T0)
    assert z[0] == 0.0 and z[2] == 0.0
    assert z[1] == 0.0  # fewer than two observations of volume: no z-score yet either
    # return and gap statistics are untouched by the first tick; volume's get one observation
    assert st[S_COUNT + 0] == 0.0 and st[S_COUNT + 2] == 0.0 and st[S_COUNT + 1] == 1.0
    assert st[S_MEAN + 0] == 0.0 and st[S_MEAN + 2] == 0.0
    assert st[S_MEAN + 1] == pytest.approx(math.log1p(1000.0))


def test_state_updates_count_and_last_tick() -> None:
    st = np.zeros(N_ENC_STATE)
    prices = [100.0, 101.0, 100.5, 100.5, 102.0]
    for k, p in enumerate(prices):
        _encode(st, p, 10.0 * k, T0 + 250.0 * k)
        assert st[S_N_TICKS] == k + 1
        assert st[S_LAST_PRICE] == p
        assert st[S_LAST_TS] == T0 + 250.0 * k
        np.testing.assert_array_equal(st[S_COUNT:S_COUNT + 3], [k, k + 1, k])
    # plain running mean while fewer than `window` ticks: mean of the observed log returns
    returns = np.diff(np.log(prices))
    assert st[S_MEAN + 0] == pytest.approx(returns.mean(), rel=1e-12)
    assert st[S_MEAN + 2] == pytest.approx(math.log1p(0.25), rel=1e-12)
    assert st[S_VAR + 2] == pytest.approx(0.0, abs=1e-15)  # constant gaps
    assert st[S_VAR + 0] == pytest.approx(returns.var(), rel=1e-9)


def test_third_tick_is_the_first_z_scored_return() -> None:
    st = np.zeros(N_ENC_STATE)
    _encode(st, 100.0, 1.0, T0)
    z2 = _encode(st, 101.0, 1.0, T0 + 1000.0)  # first return observation: no statistics yet
    z3 = _encode(st, 102.0, 1.0, T0 + 2000.0)  # one prior return: still fewer than two
    assert z2[0] == 0.0 and z3[0] == 0.0
    z4 = _encode(st, 99.0, 1.0, T0 + 3000.0)
    assert z4[0] < 0.0  # a fall after two rises


def _random_stream(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prices with jumps and flat runs, volumes with many zeros, timestamps with many repeats."""
    steps = rng.normal(0.0, 1e-3, n)
    steps[rng.random(n) < 0.01] *= 1000.0  # rare large moves (up to a few e-folds)
    steps[rng.random(n) < 0.2] = 0.0  # unchanged prices
    prices = 100.0 * np.exp(np.cumsum(steps))
    volumes = np.where(rng.random(n) < 0.3, 0.0, rng.lognormal(5.0, 2.0, n))
    gaps = np.where(rng.random(n) < 0.3, 0.0, rng.exponential(200.0, n)).round()
    ts = T0 + np.cumsum(gaps)
    return prices, volumes, ts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_long_random_streams_stay_finite_and_clipped(seed: int) -> None:
    rng = np.random.default_rng(seed)
    prices, volumes, ts = _random_stream(rng, 20_000)
    st = np.zeros(N_ENC_STATE)
    zs = np.empty((prices.size, 3))
    window = float(rng.integers(2, 500))
    for k in range(prices.size):
        zs[k] = _encode(st, prices[k], volumes[k], ts[k], window=window)
        assert np.isfinite(st).all(), f"state not finite after tick {k}: {st}"
    assert np.isfinite(zs).all()
    assert (np.abs(zs) <= CLIP).all()
    assert (st[S_VAR:S_VAR + 3] >= 0).all()
    # the stream really exercised the clip and the spread of z-scores
    assert (np.abs(zs[:, 0]) == CLIP).any()
    assert zs[:, 1].std() > 0.5


def test_degenerate_streams_stay_finite() -> None:
    """Constant price, zero volume, equal timestamps: zero variance must not give NaN or inf."""
    st = np.zeros(N_ENC_STATE)
    for _ in range(100):
        z = _encode(st, 50.0, 0.0, T0)
        np.testing.assert_array_equal(z, [0.0, 0.0, 0.0])
    # then a move after a perfectly flat history: a huge z-score, clipped, still finite
    z = _encode(st, 50.5, 0.0, T0)
    assert z[0] == CLIP
    z = _encode(st, 49.0, 5.0, T0 + 1.0)
    assert z[0] == -CLIP and z[1] == CLIP and z[2] == CLIP
    assert np.isfinite(st).all()


def test_z_is_clipped_to_feature_clip() -> None:
    rng = np.random.default_rng(5)
    for clip in (0.5, 2.0, 4.0):
        st = np.zeros(N_ENC_STATE)
        p, t = 100.0, T0
        for _ in range(200):
            p *= math.exp(rng.normal(0, 1e-3))
            t += rng.uniform(95.0, 105.0)
            _encode(st, p, rng.uniform(50.0, 150.0), t, clip=clip)
        up = _encode(st.copy(), p * 1.5, 1e9, t + 1e7, clip=clip)
        np.testing.assert_array_equal(up, [clip, clip, clip])
        down = _encode(st.copy(), p / 1.5, 0.0, t, clip=clip)
        np.testing.assert_array_equal(down, [-clip, -clip, -clip])


@pytest.mark.parametrize("per_feature", [2, 5, 16])
def test_population_code_peaks_at_the_nearest_centre(per_feature: int) -> None:
    clip, gain = 4.0, 1.7
    spacing = 2 * clip / (per_feature - 1)
    centres = -clip + spacing * np.arange(per_feature)
    rng = np.random.default_rng(per_feature)
    for _ in range(200):
        z = rng.uniform(-clip, clip, 3)
        nearest = np.abs(z[:, None] - centres[None, :]).argmin(axis=1)
        second = np.sort(np.abs(z[:, None] - centres[None, :]), axis=1)[:, 1]
        if np.any(second - np.abs(z - centres[nearest]) < 1e-9):
            continue  # (almost) halfway between two centres
        m = population_code(z, per_feature, clip, gain).reshape(3, per_feature)
        np.testing.assert_array_equal(m.argmax(axis=1), nearest)
        assert (m > 0).all() and (m <= gain).all()
    # exactly on a centre: that fibre carries the peak current
    m = population_code(np.array([centres[0], centres[-1], centres[per_feature // 2]]), per_feature, clip, gain)
    assert m[0] == gain and m[2 * per_feature - 1] == gain and m[2 * per_feature + per_feature // 2] == gain
    # neighbours one spacing away get exp(-1/2) of the peak
    assert m[1] == pytest.approx(gain * math.exp(-0.5))


@pytest.mark.parametrize("per_feature", [2, 3, 16, 32, 64])
def test_population_code_equals_the_direct_gaussian_formula(per_feature: int) -> None:
    clip, gain = 3.0, 2.5
    spacing = 2 * clip / (per_feature - 1)
    centres = -clip + spacing * np.arange(per_feature)
    rng = np.random.default_rng(100 + per_feature)
    # inside the clip range, on and between centres, and beyond it (the public function takes any z)
    zs = np.concatenate([rng.uniform(-clip, clip, (300, 3)), rng.uniform(-6 * clip, 6 * clip, (100, 3)),
                         np.tile(centres[:, None], (1, 3))])
    for z in zs:
        got = population_code(z, per_feature, clip, gain).reshape(3, per_feature)
        direct = gain * np.exp(-0.5 * ((z[:, None] - centres[None, :]) / spacing) ** 2)
        np.testing.assert_allclose(got, direct, rtol=1e-12, atol=1e-300)
    nan = population_code(np.array([np.nan, 0.0, np.inf]), per_feature, clip, gain).reshape(3, per_feature)
    assert np.isnan(nan[0]).all()
    np.testing.assert_allclose(nan[1], gain * np.exp(-0.5 * (centres / spacing) ** 2), rtol=1e-12)


def test_encode_to_mossy_is_encode_then_population_code(tiny_config: Config) -> None:
    enc_par = encoder_parameters(tiny_config.neural)
    st_a, st_b = np.zeros(N_ENC_STATE), np.zeros(N_ENC_STATE)
    mossy = np.zeros(tiny_config.neural.mossy_size)
    z_buf = np.zeros(3)
    for k, p in enumerate([10.0, 10.2, 9.9, 10.4, 10.3]):
        encode_tick_to_mossy(st_a, p, 5.0 + k, T0 + 10.0 * k * k, enc_par, z_buf, mossy)
        z = _encode(st_b, p, 5.0 + k, T0 + 10.0 * k * k, window=float(tiny_config.neural.norm_window),
                    clip=float(tiny_config.neural.feature_clip))
        np.testing.assert_array_equal(z_buf, z)
        np.testing.assert_array_equal(st_a, st_b)
        expect = population_code(z, tiny_config.neural.mossy_size // 3, tiny_config.neural.feature_clip, tiny_config.neural.mossy_gain)
        np.testing.assert_array_equal(mossy, expect)


def test_network_keeps_one_encoder_state_per_market(tiny_config: Config) -> None:
    net = CerebellarNetwork(tiny_config, max_markets=4)
    ticks: list[dict[str, Any]] = [
        {"price": 10.0, "volume": 1.0, "timestamp": int(T0), "market_id": "A"},
        {"price": 20.0, "volume": 0.0, "timestamp": int(T0), "market_id": "B"},
        {"price": 11.0, "volume": 2.0, "timestamp": int(T0) + 500, "market_id": "A"},
    ]
    net.process_batch(ticks)
    a, b = net.snapshot("A")["enc"], net.snapshot("B")["enc"]
    assert a[S_N_TICKS] == 2 and a[S_LAST_PRICE] == 11.0 and a[S_LAST_TS] == T0 + 500
    assert b[S_N_TICKS] == 1 and b[S_LAST_PRICE] == 20.0 and b[S_LAST_TS] == T0
    assert a[S_MEAN + 0] == pytest.approx(math.log(1.1))


def test_extreme_but_valid_price_jump_keeps_the_state_finite() -> None:
    net = CerebellarNetwork()
    for k, p in enumerate([1e-300, 1e-300, 1e-300, 1e300, 1.0, 2.0]):
        net.process({"price": p, "volume": 1.0, "timestamp": int(T0) + k, "market_id": "X"})
    snap = net.snapshot("X")
    bad = sorted(name for name, arr in snap.items() if not np.isfinite(arr).all())
    assert not bad, f"non-finite state after valid ticks: {bad}"
