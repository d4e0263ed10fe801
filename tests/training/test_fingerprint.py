"""The stretch fingerprint that tells a copy of a model's training data under other dates or names."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cerebellar_norse.training.fingerprint import QUANTUM, WINDOW, copied, fingerprint, stretch_hashes


def _walk(seed: int, n: int = 3000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 100.0 * np.exp(np.cumsum(rng.normal(0.0, 1e-3, n)))


def test_a_copy_scaled_by_a_constant_is_found_and_another_walk_is_not() -> None:
    price = _walk(1)
    record = fingerprint([stretch_hashes(price)])
    assert 0 < len(record["hashes"]) <= 2 * 2048
    every = np.ones(price.shape[0], dtype=bool)
    found = copied(record, stretch_hashes(price * 3.0), every)  # another currency, a split adjustment
    assert found is not None
    mask, matched, picked = found
    assert mask.sum() > 0.9 * price.shape[0] and matched >= 0.9 * picked
    assert copied(record, stretch_hashes(_walk(2)), every) is None


def test_a_quiet_stretch_is_not_hashed() -> None:
    price = np.full(100, 50.0)
    price[60:] = 50.5
    assert not stretch_hashes(price).any()
    assert not stretch_hashes(price[:WINDOW]).any()


@pytest.mark.parametrize("damage", [
    {"hashes": ["12"]}, {"hashes": [-5]}, {"hashes": [1.5]}, {"hashes": [1 << 60]}, {"hashes": [True]},
    {"hashes": [None]}, {"hashes": {}}, {"hashes": []}, {"modulus": 0}, {"modulus": "1"}, {"modulus": True},
    {"window": 8}, {"quantum": 1e-6},
])
def test_a_damaged_record_is_no_evidence_and_no_error(damage: dict[str, Any]) -> None:
    """A metrics.json edited by hand or damaged in transit: evaluate goes on without the check, never fails on it."""
    price = _walk(3)
    record = {**fingerprint([stretch_hashes(price)]), **damage}
    assert copied(record, stretch_hashes(price), np.ones(price.shape[0], dtype=bool)) is None


def _bounce(seed: int, n: int, switch: float) -> np.ndarray:
    """Trade prints of a market quoted a cent wide at about 50: a mid that moves a cent now and then, each trade at
    the bid or the ask, the side switching with probability ``switch`` (an illiquid book, a market maker's
    alternating fills): the returns are a few values over and over."""
    rng = np.random.default_rng(seed)
    mid = 5000 + np.cumsum(rng.choice([-1, 0, 1], n, p=[0.001, 0.998, 0.001]))
    side = np.cumsum(rng.random(n) < switch) % 2
    return (mid + side) / 100.0


@pytest.mark.parametrize(("seed", "n", "switch"), [(1, 5000, 0.9), (2, 20000, 0.95), (3, 20000, 0.99)])
def test_a_bouncing_market_later_is_not_a_copy_of_its_earlier_ticks(seed: int, n: int, switch: float) -> None:
    """A market bouncing between bid and ask repeats the same stretches of returns by itself: its later, unseen
    ticks are not a copy of the earlier ones a model was trained on, whether the model was trained on it alone or
    with another market (whose copy is still found), or its fingerprint was stored before such markets kept none."""
    price = _bounce(seed, n, switch)
    cut = int(n * 0.6)
    hashes = stretch_hashes(price)
    later = np.arange(n) >= cut
    walk = _walk(seed)
    record = fingerprint([hashes[:cut], stretch_hashes(walk)])
    assert copied(record, hashes, later) is None
    assert copied(record, stretch_hashes(walk * 2.0), np.ones(walk.shape[0], dtype=bool)) is not None
    every = hashes[:cut][hashes[:cut] != 0]
    older = {"window": WINDOW, "quantum": QUANTUM, "modulus": 1, "hashes": [int(x) for x in np.unique(every)]}
    assert copied(older, hashes, later) is None
