"""Live self-evaluation: hand-computed figures, the causal base rate, rolling windows, bounds, the engine hook."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from engine_helpers import T0, ConfigFactory, tick

from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.selfeval import LiveScorer
from cerebellar_norse.observability.metrics import ServiceMetrics, engine_families
from cerebellar_norse.ticks import Tick
from cerebellar_norse.training.labels import LabelSpec, label_series

FIXED_1 = LabelSpec(horizon_ticks=1, volatility_band=False, flat_band=0.0005)  # next tick, 5 bp flat band
ln = math.log


def feed(scorer: LiveScorer, ticks: Sequence[Tick], probs: np.ndarray | Sequence[Sequence[float]], batch: int = 1) -> None:
    """Observe ticks in batches, reusing one probability buffer (as the engine does)."""
    p = np.asarray(probs, dtype=np.float64)
    buf = np.empty((batch, 3))
    for k in range(0, len(ticks), batch):
        n = min(batch, len(ticks) - k)
        buf[:n] = p[k:k + n]
        scorer.observe_batch(ticks[k:k + n], buf[:n])
        buf[:] = np.nan  # the scorer must have copied what it keeps


def series(market: str, prices: Sequence[float]) -> list[Tick]:
    return [tick(market, T0 + 1000 * i, float(x)) for i, x in enumerate(prices)]


# Labels of 100, 101, 100, 100, 101 with a one-tick horizon: up, down, flat, up (the last tick is unjudged).
PRICES = [100.0, 101.0, 100.0, 100.0, 101.0]
PROBS = [[0.2, 0.3, 0.5], [0.6, 0.3, 0.1], [0.1, 0.5, 0.4], [0.5, 0.2, 0.3], [0.3, 0.3, 0.4]]


def test_hand_computed_figures_and_causal_base_rate() -> None:
    sc = LiveScorer(FIXED_1, window=100)
    feed(sc, series("A", PRICES[:2]), PROBS[:2])
    first = sc.scope("A")
    assert first is not None and first["total"]["judged"] == 1
    assert first["total"]["base_rate"]["log_loss"] == pytest.approx(ln(3))  # uniform before any judged tick
    assert first["total"]["base_rate"]["direction_log_loss"] == pytest.approx(ln(2))
    assert first["total"]["base_rate"]["directional_accuracy"] == 0.5

    sc = LiveScorer(FIXED_1, window=100)
    feed(sc, series("A", PRICES), PROBS, batch=2)
    s = sc.scope("A")
    assert s is not None
    tot = s["total"]
    assert tot["judged"] == 4 and tot["directional"] == 3
    assert tot["class_counts"] == {"down": 1, "flat": 1, "up": 2}
    m, b = tot["model"], tot["base_rate"]
    # model: up/down hits on ticks 0, 1, miss on 3; q = P(up)/(P(up)+P(down))
    assert m["directional_accuracy"] == pytest.approx(2 / 3)
    assert m["direction_log_loss"] == pytest.approx((-ln(5 / 7) - ln(6 / 7) - ln(3 / 8)) / 3)
    assert m["log_loss"] == pytest.approx((-ln(0.5) - ln(0.6) - ln(0.5) - ln(0.3)) / 4)
    assert m["accuracy"] == pytest.approx(3 / 4)
    # base rate with one pseudo-count per class, from the ticks judged before:
    # tick 0 (up): 1/3 each; tick 1 (down): (1, 1, 2)/4; tick 2 (flat): (2, 1, 2)/5; tick 3 (up): 1/3 each
    assert b["log_loss"] == pytest.approx((ln(3) + ln(4) + ln(5) + ln(3)) / 4)
    assert b["direction_log_loss"] == pytest.approx((ln(2) - ln(1 / 3) + ln(2)) / 3)
    assert b["directional_accuracy"] == pytest.approx((0.5 + 0 + 0.5) / 3)  # tie, predicts up (wrong), tie
    assert b["accuracy"] == pytest.approx((1 / 3 + 0 + 0 + 1 / 3) / 4)  # ties split the hit
    assert s["base_rate"] == pytest.approx({"down": 2 / 7, "flat": 2 / 7, "up": 3 / 7})
    assert s["window"]["model"] == pytest.approx(tot["model"], rel=1e-6)  # the window holds every tick so far
    assert sc.scope(None) == s  # one market: all markets together score the same
    assert sc.judged == 4


def test_ticks_served_warming_up_drive_the_labels_but_are_not_scored() -> None:
    sc = LiveScorer(FIXED_1, window=100)
    ticks = series("A", PRICES)
    sc.observe_batch(ticks[:2], np.array(PROBS[:2]), [True, True])
    sc.observe_batch(ticks[2:], np.array(PROBS[2:]), [False, False, False])
    s = sc.scope("A")
    assert s is not None and s["total"]["judged"] == 2  # ticks 2 and 3; ticks 0 and 1 were warming up
    assert s["total"]["model"]["log_loss"] == pytest.approx((-ln(0.5) - ln(0.3)) / 2)
    assert s["total"]["class_counts"] == {"down": 0, "flat": 1, "up": 1}


def test_rolling_window_drops_old_ticks() -> None:
    sc = LiveScorer(FIXED_1, window=2)
    feed(sc, series("A", PRICES), PROBS)
    s = sc.scope("A")
    assert s is not None
    w = s["window"]  # ticks 2 (flat) and 3 (up)
    assert w["judged"] == 2 and w["directional"] == 1
    assert w["class_counts"] == {"down": 0, "flat": 1, "up": 1}
    assert w["model"] == pytest.approx({"directional_accuracy": 0.0, "direction_log_loss": -ln(3 / 8),
                                        "accuracy": 0.5, "log_loss": (-ln(0.5) - ln(0.3)) / 2}, rel=1e-6)
    assert w["base_rate"] == pytest.approx({"directional_accuracy": 0.5, "direction_log_loss": ln(2),
                                            "accuracy": (0 + 1 / 3) / 2, "log_loss": (ln(5) + ln(3)) / 2}, rel=1e-6)
    assert s["total"]["judged"] == 4  # totals keep everything


def _reference(ticks: Sequence[Tick], probs: np.ndarray, spec: LabelSpec, window: int) -> dict[str | None, dict[str, Any]]:
    """Brute force: every judged tick's contributions in judgement order, per market (and None: all), from label_series."""
    by_market: dict[str, list[int]] = defaultdict(list)
    for j, t in enumerate(ticks):
        by_market[t.market_id].append(j)
    labels = {}
    for m, idx in by_market.items():
        labels[m] = label_series(np.array([ticks[j].timestamp for j in idx], dtype=np.float64),
                                 np.array([ticks[j].price for j in idx]), spec).labels
    seen: dict[str, int] = defaultdict(int)
    rows: dict[str | None, list[list[float]]] = defaultdict(list)
    counts: dict[str | None, list[int]] = defaultdict(lambda: [0, 0, 0])
    for t in ticks:
        m = t.market_id
        k = seen[m] - spec.horizon_ticks
        seen[m] += 1
        if k < 0:
            continue
        y = int(labels[m][k])
        pd, pf, pu = probs[by_market[m][k]]
        p = (pd, pf, pu)
        for scope in (None, m):
            c = counts[scope]
            n = sum(c)
            base = [(c[i] + 1) / (n + 3) for i in range(3)]
            hit = lambda v: (1.0 / sum(x == max(v) for x in v)) if v[y] == max(v) else 0.0  # noqa: B023, E731
            row: list[float] = [y, -ln(p[y]), hit(p), -ln(base[y]), hit(c), math.nan, math.nan, math.nan, math.nan]
            if y != 1:
                q, qb = pu / (pu + pd), (c[2] + 1) / (c[2] + c[0] + 2)
                row[5] = -ln(q) if y == 2 else -ln(1 - q)
                row[6] = 0.5 if pu == pd else float((pu > pd) == (y == 2))
                row[7] = -ln(qb) if y == 2 else -ln(1 - qb)
                row[8] = 0.5 if c[2] == c[0] else float((c[2] > c[0]) == (y == 2))
            rows[scope].append(row)
            c[y] += 1

    def figures(rs: list[Any]) -> dict[str, Any]:
        a = np.array(rs, dtype=np.float64)
        d = a[a[:, 0] != 1]
        return {"judged": len(a), "directional": len(d),
                "model": {"log_loss": a[:, 1].mean(), "accuracy": a[:, 2].mean(),
                          "direction_log_loss": d[:, 5].mean(), "directional_accuracy": d[:, 6].mean()},
                "base_rate": {"log_loss": a[:, 3].mean(), "accuracy": a[:, 4].mean(),
                              "direction_log_loss": d[:, 7].mean(), "directional_accuracy": d[:, 8].mean()}}

    return {s: {"total": figures(rs), "window": figures(rs[-window:])} for s, rs in rows.items()}


def test_matches_a_brute_force_reference_over_many_window_turns() -> None:
    """Three markets, volatility band, horizon 3, window 7: every figure equals a from-scratch computation."""
    rng = np.random.default_rng(5)
    n = 900
    markets = rng.choice(["A", "B", "C"], size=n, p=[0.5, 0.3, 0.2])
    price = {m: 100.0 for m in "ABC"}
    ticks = []
    for i, m in enumerate(markets):
        price[m] *= math.exp(rng.normal(0, 1e-3))
        ticks.append(tick(str(m), T0 + i, price[m]))
    probs = rng.dirichlet(np.ones(3), size=n)
    spec = LabelSpec(horizon_ticks=3, band_multiple=0.43, volatility_window=20)
    sc = LiveScorer(spec, window=7)
    feed(sc, ticks, probs, batch=32)
    ref = _reference(ticks, probs, spec, 7)
    for scope in (None, "A", "B", "C"):
        got = sc.scope(scope)
        assert got is not None
        for part in ("window", "total"):
            want = ref[scope][part]
            assert got[part]["judged"] == want["judged"] and got[part]["directional"] == want["directional"]
            assert got[part]["model"] == pytest.approx(want["model"], rel=1e-6), (scope, part)
            assert got[part]["base_rate"] == pytest.approx(want["base_rate"], rel=1e-6), (scope, part)
    assert sc.judged == n - 3 * 3


def test_a_predictor_that_knows_the_future_beats_the_base_rate() -> None:
    rng = np.random.default_rng(1)
    prices = 100 * np.exp(np.cumsum(rng.normal(0, 1e-3, 400)))
    labels = label_series(np.arange(400.0), prices, FIXED_1).labels
    probs = np.full((400, 3), 0.1)
    probs[np.arange(399), labels[:399]] = 0.8
    sc = LiveScorer(FIXED_1, window=1000)
    feed(sc, series("A", prices), probs, batch=64)
    w = sc.overall()[0]
    assert w["model"]["directional_accuracy"] == 1.0 and w["model"]["accuracy"] == 1.0
    assert w["model"]["log_loss"] == pytest.approx(-ln(0.8), rel=1e-6)
    assert w["model"]["log_loss"] < w["base_rate"]["log_loss"]
    assert w["model"]["direction_log_loss"] < w["base_rate"]["direction_log_loss"]
    assert w["model"]["directional_accuracy"] > w["base_rate"]["directional_accuracy"]


def test_the_base_rate_itself_ties() -> None:
    """A predictor serving exactly the causal base rate scores the same as the base rate."""
    rng = np.random.default_rng(2)
    prices = 100 * np.exp(np.cumsum(rng.normal(0, 5e-4, 300)))
    labels = label_series(np.arange(300.0), prices, FIXED_1).labels
    probs = np.empty((300, 3))
    counts = np.zeros(3)
    for i in range(300):  # for tick i, every earlier tick has been judged when i is
        probs[i] = (counts + 1) / (counts.sum() + 3)
        if labels[i] >= 0:
            counts[labels[i]] += 1
    sc = LiveScorer(FIXED_1, window=50)
    feed(sc, series("A", prices), probs, batch=16)
    for part in sc.overall():
        assert part["directional"] > 0
        assert part["model"] == pytest.approx(part["base_rate"], rel=1e-6)


def test_markets_are_scored_apart() -> None:
    up = series("UP", [100.0 * 1.01 ** i for i in range(20)])
    down = series("DOWN", [100.0 * 0.99 ** i for i in range(20)])
    mixed = [t for pair in zip(up, down, strict=True) for t in pair]
    probs = np.tile([0.1, 0.1, 0.8], (40, 1))
    sc = LiveScorer(FIXED_1)
    feed(sc, mixed, probs, batch=8)
    alone = LiveScorer(FIXED_1)
    feed(alone, up, probs[:20], batch=8)
    assert sc.scope("UP") == alone.scope("UP")
    d = sc.scope("DOWN")
    assert d is not None and d["total"]["class_counts"] == {"down": 19, "flat": 0, "up": 0}
    assert d["total"]["model"]["directional_accuracy"] == 0.0
    assert d["total"]["base_rate"]["directional_accuracy"] == pytest.approx((0.5 + 18) / 19)
    overall = sc.scope(None)
    assert overall is not None and overall["total"]["judged"] == 38
    assert overall["total"]["class_counts"] == {"down": 19, "flat": 0, "up": 19}


def test_markets_bounded_least_recently_observed_first_and_forgotten() -> None:
    sc = LiveScorer(FIXED_1, max_markets=2)
    for k, m in enumerate(("A", "B", "A", "C")):  # C pushes B out: B was observed least recently
        feed(sc, [tick(m, T0 + 1000 * k)], [[0.3, 0.3, 0.4]])
    snap = sc.snapshot()
    assert sc.markets == 2 and set(snap["markets"]) == {"A", "C"} and snap["markets_dropped"] == 1
    assert sc.scope("B") is None
    assert sc.forget("A") and not sc.forget("A")
    assert sc.retain({"X"}) == 1 and sc.markets == 0
    overall = sc.scope(None)
    assert overall is not None and overall["total"]["judged"] == 1  # all-markets figures stay


def test_memory_bound_lowers_max_markets() -> None:
    sc = LiveScorer(FIXED_1, window=1000, max_markets=10_000, max_bytes=10 * 1000 * 21)
    assert sc.max_markets == 9  # plus the all-markets scope


def test_snapshot_is_strict_json() -> None:
    sc = LiveScorer(FIXED_1)
    json.dumps(sc.snapshot(), allow_nan=False)
    assert sc.snapshot()["overall"]["window"]["model"]["log_loss"] is None
    feed(sc, series("A", [100.0, 100.0, 100.0]), [[0.2, 0.6, 0.2]] * 3)  # only flat ticks: no directional figure
    snap = json.loads(json.dumps(sc.snapshot(), allow_nan=False))
    assert snap["overall"]["window"]["model"]["directional_accuracy"] is None
    assert snap["markets"]["A"]["total"]["judged"] == 2


def test_top_markets_by_judged_ticks() -> None:
    sc = LiveScorer(FIXED_1)
    for k in range(5):
        feed(sc, series(f"M{k}", [100.0] * (k + 2)), [[0.3, 0.4, 0.3]] * (k + 2))
    assert list(sc.snapshot(top=3)["markets"]) == ["M4", "M3", "M2"]


# -- the engine ----------------------------------------------------------------------------------


def test_engine_scores_served_ticks_and_exports_them(engine_config: ConfigFactory) -> None:
    cfg = engine_config(neural={"horizon_ticks": 5, "warmup_ticks": 5}, training={"live_evaluation_window": 10})
    engine = Engine(cfg)
    engine.warm_up()
    assert engine.scorer is not None and engine.scorer.judged == 0 and engine.scorer.markets == 0  # warm-up not scored
    ticks = [tick("LIVE", T0 + 1000 * i, 100.0 * math.exp(0.002 * math.sin(i))) for i in range(30)]
    for k in range(0, 30, 7):
        engine.process_now(ticks[k:k + 7])
    assert engine.scorer.judged == 20  # 25 ticks reached their horizon; the first 5 were served warming up
    snap = engine.scorer.snapshot()
    assert snap["overall"]["window"]["judged"] == 10 and snap["markets"]["LIVE"]["total"]["judged"] == 20
    metrics = ServiceMetrics()
    metrics.add_source(engine_families(engine, "cpu", lambda: (0, 0)))
    text = metrics.render().decode()
    assert "cerebellar_norse_live_judged_ticks_total 20.0" in text
    assert "cerebellar_norse_live_window_ticks 10.0" in text
    assert "cerebellar_norse_live_log_loss " in text and "cerebellar_norse_live_base_rate_log_loss " in text
    assert not [line for line in text.splitlines() if "_live_" in line and "NaN" in line]
    engine.pool.table.release("LIVE")
    engine.collect_idle()
    assert engine.scorer.markets == 0  # evicted from the pool: forgotten


def test_engine_without_live_evaluation(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config(training={"live_evaluation": False}))
    assert engine.scorer is None
    engine.process_now([tick("A", T0 + i) for i in range(3)])
    metrics = ServiceMetrics()
    metrics.add_source(engine_families(engine, "cpu", lambda: (0, 0)))
    assert "cerebellar_norse_live_" not in metrics.render().decode()


def test_reads_and_evictions_while_ticks_wait_change_no_figure() -> None:
    """Served ticks wait to be labelled and scored until ``FLUSH_AT`` of them are kept or a read comes: a scorer read
    after every batch ends with the figures of one read only at the end, with a time horizon, ticks served warming
    up, NaN probabilities, markets evicted (five tracked of nine, so a slot is reused while ticks of the market that
    held it still wait), forgotten and retained."""
    spec = LabelSpec(horizon_ms=4000, volatility_band=False, flat_band=4e-4)
    read_often, read_once = LiveScorer(spec, window=40, max_markets=5), LiveScorer(spec, window=40, max_markets=5)
    rng = np.random.default_rng(12)
    price: dict[str, float] = defaultdict(lambda: 100.0)
    ts = T0
    for step in range(1500):
        batch, warm = [], []
        for _ in range(int(rng.integers(1, 9))):
            m = f"M{int(rng.integers(0, 9))}"
            ts += int(rng.integers(1, 900))
            price[m] *= math.exp(rng.normal(0, 2e-3))
            batch.append(tick(m, ts, price[m]))
            warm.append(bool(rng.random() < 0.05))
        probs = rng.dirichlet(np.ones(3), size=len(batch))
        if step % 50 == 7:
            probs[0, 1] = np.nan
        for sc in (read_often, read_once):
            sc.observe_batch(batch, probs, warm)
            if step % 200 == 99:
                sc.forget("M3")
            if step % 300 == 149:
                sc.retain({"M0", "M2", "M4", "M6", "M8"})
        read_often.snapshot(3)
    assert read_once.snapshot(20) == read_often.snapshot(20)
    assert read_once.judged == read_often.judged > 1000 and read_once.dropped_markets > 100
