"""Golgi homeostasis keeps granule activity at ``target_sparsity`` over a long synthetic stream."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cerebellar_norse.neurons.network import CerebellarNetwork
from cerebellar_norse.synthetic import generate_ticks

ConfigFactory = Any
N_TICKS = 2000


@pytest.mark.parametrize("target", [None, 0.1, 0.02])
def test_granule_activity_tracks_the_target(make_config: ConfigFactory, target: float | None) -> None:
    cfg = make_config({} if target is None else {"target_sparsity": target})
    rho = cfg.neural.target_sparsity
    if target is None:
        assert rho == 0.05  # the default config's value
    net = CerebellarNetwork(cfg, max_markets=8)
    results = net.process_batch(generate_ticks(N_TICKS, 8, seed=5))
    spikes = net.last_spikes
    assert spikes.shape == (N_TICKS, 3)
    np.testing.assert_array_equal(spikes.sum(axis=1), [r["spike_count"] for r in results])
    activity = spikes[:, 0] / cfg.neural.granule_size / cfg.neural.steps_per_tick
    mean = float(activity.mean())
    assert 0.5 * rho <= mean <= 1.5 * rho, f"mean granule activity {mean:.4f} per step, target {rho}"
    # and it is not just the average of silence and bursts
    late = float(activity[N_TICKS // 2:].mean())
    assert 0.5 * rho <= late <= 1.5 * rho
    assert float(np.median(activity)) > 0.25 * rho
    # the downstream populations are alive too
    assert spikes[:, 1].sum() > 0 and spikes[:, 2].sum() > 0
