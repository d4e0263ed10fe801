"""The stretch fingerprint that tells a copy of a model's training data under other dates or names."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cerebellar_norse.training.fingerprint import WINDOW, copied, fingerprint, stretch_hashes


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
