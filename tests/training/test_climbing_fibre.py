"""Climbing-fibre online learning: the LTD/LTP rule, judging predictions after the horizon, the engine switch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from training_helpers import TINY_NEURAL, ConfigFactory

from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.ticks import validate_ticks
from cerebellar_norse.training.climbing_fibre import LTP_RATIO, OnlineLearner, climbing_fibre_update, purkinje_classes

# A hand-made parallel-fibre CSR: 3 granule cells, 3 Purkinje cells (by presynaptic granule cell).
#   g0: e0 -> P0, e1 -> P2
#   g1: e2 -> P0, e3 -> P1, e4 -> P2
#   g2: e5 -> P1
PF_PTR = np.array([0, 2, 5, 6], dtype=np.int32)
PF_POST = np.array([0, 2, 0, 1, 2, 1], dtype=np.int32)
PF_W = np.array([0.10, 0.20, 0.30, 0.40, 0.50, 0.60])


def test_update_ltd_ltp_and_bounds_exactly() -> None:
    w = PF_W.copy()
    active = np.array([0, 1], dtype=np.int64)
    signal = np.array([1, -1, 0], dtype=np.int8)  # P0 climbing fibre fired (LTD), P1 potentiated (LTP), P2 left
    rate, ltp, w_max = 0.1, 0.05, 0.43
    changed = climbing_fibre_update(w, PF_PTR, PF_POST, active, signal, rate, ltp, w_max)
    expected = PF_W.copy()
    expected[0] = PF_W[0] - rate * PF_W[0]  # g0 -> P0: LTD
    expected[2] = PF_W[2] - rate * PF_W[2]  # g1 -> P0: LTD
    expected[3] = w_max  # g1 -> P1: 0.40 + 0.05 capped at w_max
    # e1 (g0 -> P2), e4 (g1 -> P2): no signal; e5: g2 was not active
    np.testing.assert_array_equal(w, expected)
    assert changed == 3

    w2 = PF_W.copy()
    assert climbing_fibre_update(w2, PF_PTR, PF_POST, np.array([2], dtype=np.int64), np.array([0, -1, 0], dtype=np.int8),
                                 rate, ltp, 10.0) == 1
    expected2 = PF_W.copy()
    expected2[5] = PF_W[5] + ltp
    np.testing.assert_array_equal(w2, expected2)

    w3 = PF_W.copy()  # full depression stops at zero, no synapse goes negative
    climbing_fibre_update(w3, PF_PTR, PF_POST, np.array([0, 1, 2], dtype=np.int64), np.array([1, 1, 1], dtype=np.int8),
                          1.0, ltp, 10.0)
    np.testing.assert_array_equal(w3, np.zeros(6))

    w4 = PF_W.copy()  # nobody active: nothing changes
    assert climbing_fibre_update(w4, PF_PTR, PF_POST, np.zeros(0, dtype=np.int64), signal, rate, ltp, w_max) == 0
    np.testing.assert_array_equal(w4, PF_W)


def hand_weights() -> Any:
    """Weights whose Purkinje cells P0, P1, P2 inhibit the down, flat and up DCN groups."""
    w_pd = np.zeros((6, 3))  # 6 DCN cells in 3 groups of 2
    w_pd[0:2, 0] = 1.0
    w_pd[2:4, 1] = 1.0
    w_pd[4:6, 2] = 1.0
    w_pd += 0.01
    return SimpleNamespace(w_pd=w_pd, w_out=np.zeros((3, 6)), pf_w=PF_W.reshape(3, 2))


def probs_for(cls: int) -> np.ndarray:
    p = np.full(3, 0.1)
    p[cls] = 0.8
    return p


def flags(*granules: int) -> np.ndarray:
    a = np.zeros(3, dtype=np.uint8)
    a[list(granules)] = 1
    return a


def test_purkinje_classes_by_strongest_inhibition() -> None:
    assert purkinje_classes(hand_weights()).tolist() == [0, 1, 2]


def test_online_learner_judges_after_the_horizon_and_learns_only_from_errors() -> None:
    rate, band = 0.1, 0.001
    learner = OnlineLearner(hand_weights(), horizon=2, flat_band=band, rate=rate)
    w = PF_W.copy()

    def see(market: str, price: float, predicted: int, *active: int) -> None:
        learner.observe(market, price, probs_for(predicted), flags(*active), w, PF_PTR, PF_POST)

    see("A", 100.0, 2, 0, 2)  # t0: predicts up
    see("B", 50.0, 0, 0, 1, 2)  # another market's ticks do not count for A's horizon
    see("A", 100.0, 0, 1)  # t1: predicts down
    see("B", 40.0, 0, 0, 1, 2)
    assert learner.judged == 0  # nothing is judged before its horizon has passed
    np.testing.assert_array_equal(w, PF_W)

    see("A", 110.0, 1)  # t2: judges t0: log(110/100) > band -> up, predicted up: right, no change
    assert learner.judged == 1 and learner.errors == 0 and learner.updates == 0
    np.testing.assert_array_equal(w, PF_W)

    see("A", 100.0, 1)  # t3: judges t1: log(100/100) = 0 -> flat, predicted down: wrong
    assert learner.judged == 2 and learner.errors == 1 and learner.updates == 1
    expected = PF_W.copy()
    # active at t1: g1 only. The true class's (flat: P1) synapses are depressed,
    # the wrongly predicted class's (down: P0) potentiated, up's (P2) left alone.
    expected[3] = PF_W[3] - rate * PF_W[3]  # g1 -> P1: LTD
    expected[2] = PF_W[2] + rate * LTP_RATIO * float(np.mean(PF_W))  # g1 -> P0: LTP
    np.testing.assert_array_equal(w, expected)
    assert learner.synapses_changed == 2

    see("B", 60.0, 0)  # judges B's t0 (50 -> 60: up, predicted down): wrong, every granule cell was active
    assert learner.judged == 3 and learner.errors == 2
    assert w[0] > expected[0] and w[2] > expected[2]  # -> P0 (down, predicted): LTP
    assert w[1] < expected[1] and w[4] < expected[4]  # -> P2 (up, true): LTD
    assert w[3] == expected[3] and w[5] == expected[5]  # -> P1 (flat): untouched
    learner.forget("A")
    assert "A" not in learner.pending


def test_online_learner_without_active_granules_changes_nothing() -> None:
    learner = OnlineLearner(hand_weights(), horizon=1, flat_band=0.0, rate=0.5)
    w = PF_W.copy()
    learner.observe("A", 100.0, probs_for(2), flags(), w, PF_PTR, PF_POST)
    learner.observe("A", 90.0, probs_for(2), flags(0, 1, 2), w, PF_PTR, PF_POST)  # t0 was wrong, but silent
    assert learner.judged == 1 and learner.updates == 0
    np.testing.assert_array_equal(w, PF_W)


@pytest.mark.parametrize("online", [True, False])
def test_engine_online_learning_switch(make_config: ConfigFactory, online: bool) -> None:
    cfg = make_config(neural=TINY_NEURAL, training={"online_learning": online, "climbing_fibre_rate": 0.01},
                      performance={"batch_size": 64, "max_batch_delay_us": 0})
    eng = Engine(cfg)
    before = eng.backend.pf_views()[0].copy()  # type: ignore[attr-defined]
    ticks = validate_ticks(generate_ticks(1500, 3, seed=9))
    for k in range(0, len(ticks), 64):
        eng.process_now(ticks[k:k + 64])
    after = eng.backend.pf_views()[0]  # type: ignore[attr-defined]
    if online:
        assert eng.learner is not None
        assert eng.learner.judged == 1500 - 3 * cfg.neural.horizon_ticks
        assert eng.learner.updates > 0
        assert not np.array_equal(after, before)
        assert np.all(after >= 0)
    else:
        assert eng.learner is None
        assert after.tobytes() == before.tobytes()  # bit-identical


def test_online_learning_keeps_the_kernels_dense_rows_equal_to_the_synapses(make_config: ConfigFactory) -> None:
    cfg = make_config(neural=TINY_NEURAL, training={"online_learning": True, "climbing_fibre_rate": 0.05},
                      performance={"batch_size": 64, "max_batch_delay_us": 0})
    eng = Engine(cfg)
    pf_w, pf_ptr, pf_post, rows = eng.backend.pf_views()  # type: ignore[attr-defined]
    assert rows.shape[0] == cfg.neural.granule_size  # a tiny network uses the dense rows
    ticks = validate_ticks(generate_ticks(800, 3, seed=4))
    for k in range(0, len(ticks), 64):
        eng.process_now(ticks[k:k + 64])
    assert eng.learner is not None and eng.learner.updates > 0
    dense = np.zeros_like(rows)
    for g in range(rows.shape[0]):
        for e in range(pf_ptr[g], pf_ptr[g + 1]):
            dense[g, pf_post[e]] = pf_w[e]
    np.testing.assert_array_equal(rows, dense)
