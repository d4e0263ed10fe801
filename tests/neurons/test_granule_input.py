"""The fused kernel's granule-input helpers: exact sums in the reference order (d = 0..D-1)."""

from __future__ import annotations

import numpy as np
import pytest

from cerebellar_norse.neurons.fused import LANES, _granule_input, _granule_input_lanes


def _inputs(d: int, g: int, m: int, dtype: type, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.normal(0.0, 1.0, (d, g)).astype(dtype)
    idx = rng.integers(0, m, (d, g)).astype(np.uint32)
    mossy = rng.gamma(1.0, 1.0, (LANES, m)).astype(dtype)
    return w, idx, mossy


def _sequential_sum(w: np.ndarray, idx: np.ndarray, mossy: np.ndarray) -> np.ndarray:
    """sum_d w[d] * mossy[idx[d]], added left to right in the array's float type."""
    out = w[0] * mossy[idx[0]]
    for d in range(1, w.shape[0]):
        out = out + w[d] * mossy[idx[d]]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dendrites", [1, 2, 3, 4, 5])
def test_one_tick_granule_input_is_the_sum_in_dendrite_order(dendrites: int, dtype: type) -> None:
    w, idx, mossy = _inputs(dendrites, 300, 48, dtype, 10 + dendrites)
    out = np.zeros(300, dtype=dtype)
    _granule_input(mossy[0], w, idx, out)
    np.testing.assert_array_equal(out, _sequential_sum(w, idx, mossy[0]))


@pytest.mark.parametrize("dendrites", [2, 4])
def test_eight_tick_granule_inputs_equal_one_tick_at_a_time(dendrites: int) -> None:
    g, m = 200, 48
    w, idx, mossy = _inputs(dendrites, g, m, np.float32, 20 + dendrites)
    mossy_t = np.zeros(m * LANES, dtype=np.float32)
    out = np.zeros(g * LANES, dtype=np.float32)
    _granule_input_lanes(mossy, mossy_t, w, idx, out)
    one = np.zeros(g, dtype=np.float32)
    for q in range(LANES):
        _granule_input(mossy[q], w, idx, one)
        np.testing.assert_array_equal(out.reshape(g, LANES)[:, q], one)
