"""The calibrated output head and the warming_up flag, through the public network API."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from network_sizes import SMALL_NEURAL

from cerebellar_norse.config import Config
from cerebellar_norse.neurons.network import CerebellarNetwork
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.training.checkpoints import weights_from_bytes, weights_to_bytes

ConfigFactory = Any


def _probs(results: list[dict[str, Any]]) -> np.ndarray:
    return np.array([[r["probabilities"][c] for c in ("down", "flat", "up")] for r in results])


def test_head_is_softmax_of_scaled_log_probabilities(small_config: Config, ticks: Any) -> None:
    data = ticks(200, 3, 5)
    w = generate_weights(small_config)
    gain, bias = np.array([0.5, 2.0, 1.5]), np.array([-0.3, 0.4, 0.1])
    raw = _probs(CerebellarNetwork(small_config, weights=w).process_batch(data))
    cal = CerebellarNetwork(small_config, weights=w.with_head(gain, bias)).process_batch(data)
    logits = gain * np.log(raw) + bias
    expect = np.exp(logits - logits.max(axis=1, keepdims=True))
    expect /= expect.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(_probs(cal), expect, rtol=1e-12, atol=1e-14)
    assert all(r["prediction"] == pytest.approx(r["probabilities"]["up"] - r["probabilities"]["down"]) for r in cal)


def test_zero_gain_head_serves_the_priors(small_config: Config, ticks: Any) -> None:
    prior = np.array([0.3, 0.2, 0.5])
    w = generate_weights(small_config).with_head(np.zeros(3), np.log(prior))
    res = CerebellarNetwork(small_config, weights=w).process_batch(ticks(50, 2, 1))
    np.testing.assert_allclose(_probs(res), np.tile(prior, (50, 1)), rtol=1e-12)


def test_head_survives_a_checkpoint_and_old_models_load_with_identity(small_config: Config) -> None:
    w = generate_weights(small_config).with_head(np.array([0.0, 1.2, 0.0]), np.array([0.1, -0.2, 0.3]))
    back = weights_from_bytes(weights_to_bytes(w), "mem")
    np.testing.assert_array_equal(back.head_gain, w.head_gain)
    np.testing.assert_array_equal(back.head_bias, w.head_bias)
    import io

    with np.load(io.BytesIO(weights_to_bytes(w))) as z:
        arrays = {k: z[k] for k in z.files if not k.startswith("head_")}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    assert weights_from_bytes(buf.getvalue(), "old").head_is_identity


@pytest.mark.parametrize("batch", [False, True])
def test_warming_up_until_warmup_ticks(make_config: ConfigFactory, batch: bool) -> None:
    cfg = make_config({**SMALL_NEURAL, "warmup_ticks": 5})
    net = CerebellarNetwork(cfg)
    t0 = 1_640_995_200_000
    data = [{"price": 100.0 + k, "volume": 10.0, "timestamp": t0 + 10 * (k // 2), "market_id": "AB"[k % 2]} for k in range(16)]
    res = net.process_batch(data) if batch else [net.process(d) for d in data]
    flags = [(r["market_id"], r["warming_up"]) for r in res]
    assert [w for m, w in flags if m == "A"] == [True] * 5 + [False] * 3
    assert [w for m, w in flags if m == "B"] == [True] * 5 + [False] * 3
    net.reset("A")
    assert net.process({**data[-1], "market_id": "A", "timestamp": t0 + 1000})["warming_up"] is True
