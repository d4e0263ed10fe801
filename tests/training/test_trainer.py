"""Gradient training: it learns the synthetic structure, checkpointing, metrics, early stopping, time budget."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from training_helpers import TINY_NEURAL, ConfigFactory

from cerebellar_norse.config import Config
from cerebellar_norse.errors import DataError
from cerebellar_norse.neurons.topology import TRAINABLE, generate_weights
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training import trainer
from cerebellar_norse.training.data import TickData, load_csv_files, write_csv
from cerebellar_norse.training.trainer import Prepared, classification_metrics, evaluate, prepare, train


def tick_data(tmp_path: Path, n: int, markets: int, seed: int) -> TickData:
    path = tmp_path / f"ticks-{n}-{markets}-{seed}.csv"
    write_csv(path, generate_ticks(n, markets, seed))
    return load_csv_files([path])


def tiny(make_config: ConfigFactory, **training: Any) -> Config:
    lr = training.pop("learning_rate", 0.005)
    return make_config(neural={**TINY_NEURAL, "learning_rate": lr, "warmup_ticks": 50}, training=training)


@pytest.fixture
def tiny_prep(tmp_path: Path, make_config: ConfigFactory) -> tuple[Config, Prepared]:
    cfg = tiny(make_config)
    return cfg, prepare(cfg, tick_data(tmp_path, 1200, 2, seed=3))


# --------------------------------------------------------------------------------------
# It learns
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_training_finds_the_signal_and_beats_the_base_rates_on_the_test_split(tmp_path: Path, make_config: ConfigFactory) -> None:
    """60,000 ticks of 3 markets with learnable regimes, 3 epochs (one thread: deterministic). The head's
    cross-validation runs over the markets' validation ticks in time order, each fold a period of every market: after
    2 epochs it measures a direction gain of 0.0068 nats against a margin of 0.0071 (cut from the markets one after
    another, a fold's head was fitted on the other markets' ticks of its own period: 0.0085), after 3 epochs 0.0100
    against 0.0076."""
    cfg = make_config(neural={"learning_rate": 0.005}, training={"threads": 1})
    prep = prepare(cfg, tick_data(tmp_path, 60_000, 3, seed=3))
    result = train(cfg, prep, generate_weights(cfg), epochs=3)
    val = result.validation
    assert result.edge == "direction", val["cv"]
    assert val["cv"][val["head"]]["log_loss"] < val["cv"]["priors"]["log_loss"]
    base = (prep.train_counts + 1.0) / (prep.train_counts.sum() + 3.0)
    _, labels = prep.rows(2)
    base_loss = float(-np.mean(np.log(base[labels])))
    test = evaluate(cfg, result.weights, prep, split=2)
    assert test["samples"] > 4000
    assert test["loss"] < base_loss, (test, base_loss)  # unseen data: better than knowing nothing
    # better than the more common direction of the test split itself, a constant known only in hindsight
    assert test["directional_accuracy"] > test["directional_baseline_accuracy"], test
    assert len(result.history) == 3 and val == result.history[result.best_epoch - 1]["validation"]
    assert result.ticks_per_second > 0


@pytest.mark.slow
def test_without_signal_the_model_serves_the_base_rates(tmp_path: Path, make_config: ConfigFactory) -> None:
    """Independent returns, volumes and gaps: no edge is found and the test log loss is the base rates'."""
    rng = np.random.default_rng(11)
    rows = []
    for k in range(2):
        price = 100.0 * np.exp(np.cumsum(rng.standard_t(3, 8000) * 1e-3))
        ts = 1_600_000_000_000 + np.cumsum(rng.exponential(500.0, 8000)).astype(np.int64)
        rows += [{"timestamp": int(t), "market_id": f"N{k}", "price": float(p), "volume": float(v)}
                 for p, t, v in zip(price, ts, rng.lognormal(5, 1, 8000), strict=True)]
    path = tmp_path / "noise.csv"
    write_csv(path, sorted(rows, key=lambda d: d["timestamp"]))
    cfg = make_config(training={"threads": 1})
    prep = prepare(cfg, load_csv_files([path]))
    result = train(cfg, prep, generate_weights(cfg), epochs=2)
    assert result.edge == "none", result.validation["cv"]
    assert (result.weights.head_gain == 0).all()
    test = evaluate(cfg, result.weights, prep, split=2)
    base = (prep.train_counts + prep.val_counts + 1.0) / (prep.train_counts.sum() + prep.val_counts.sum() + 3.0)
    _, labels = prep.rows(2)
    assert test["loss"] == pytest.approx(float(-np.mean(np.log(base[labels]))), abs=1e-9)


def test_splits_are_by_time_with_a_horizon_embargo(tmp_path: Path, make_config: ConfigFactory) -> None:
    from dataclasses import replace

    cfg = tiny(make_config)
    data = tick_data(tmp_path, 1200, 2, seed=3)
    prep = prepare(cfg, data)
    h, t = cfg.neural.horizon_ticks, cfg.training
    for m in prep.markets:
        n = len(m.ticks)
        n_train, n_val_end = int((m.split == 0).sum()), n - int((m.split == 2).sum())  # the common time cuts' share
        assert m.n_train == n_train and 0 < n_train < n_val_end < n
        assert (m.split[:n_train] == 0).all() and (m.split[n_train:n_val_end] == 1).all() and (m.split[n_val_end:] == 2).all()
        # no training label reaches into validation, no validation label into test
        assert (m.labels[n_train - h:] == -1).all() and (m.labels[:n_train - h] >= 0).all()
        val = np.nonzero(m.scored & (m.split == 1))[0]
        assert val.size and val.max() < n_val_end - h and val.min() >= max(n_train, cfg.neural.warmup_ticks)
        test = np.nonzero(m.scored & (m.split == 2))[0]
        assert test.size and test.min() >= n_val_end and test.max() < n - h
        ts = [x.timestamp for x in m.ticks]
        assert ts == sorted(ts)
    assert prep.train_counts.sum() > 0 and prep.val_counts.sum() > 0 and prep.test_counts.sum() > 0
    assert len(prep.warnings) == 3  # far fewer than 10,000 samples per class
    one = prepare(cfg, replace(data, markets=data.markets[:1]))  # one market: exactly the configured fractions
    n = len(one.markets[0].ticks)
    assert one.markets[0].n_train == round(n * (1 - t.validation_fraction - t.test_fraction))
    assert int((one.markets[0].split == 2).sum()) == round(n * t.test_fraction)


def _markets_csv(tmp_path: Path, ticks: dict[str, int]) -> Path:
    """A file of markets (name -> ticks) over one time grid, a tick a second, every market from its first second."""
    rows = [f"{1_700_000_000_000 + k * 1000},{m},{100 + (k * 7 + i) % 13},1"
            for k in range(max(ticks.values())) for i, (m, n) in enumerate(ticks.items()) if k < n]
    path = tmp_path / "short.csv"
    path.write_text("timestamp,market_id,price,volume\n" + "\n".join(rows) + "\n")
    return path


def test_series_too_short_for_the_warm_up_names_the_longest_market_and_the_ticks_needed(
        tmp_path: Path, make_config: ConfigFactory) -> None:
    """Many markets of a few hundred ticks under the default warm-up of 500: the error gives the numbers."""
    cfg = make_config(neural={**TINY_NEURAL, "warmup_ticks": 500, "horizon_ticks": 5})
    need = trainer.ticks_for_validation(cfg)
    assert need == 595  # 595 - round(0.15 x 595) = 506 > 500 + 5: tick 500 is scored, its end tick 505 validates
    data = load_csv_files([_markets_csv(tmp_path, {"A": 300, "B": 450, "C": 400})])
    with pytest.raises(DataError) as err:
        prepare(cfg, data)
    msg = str(err.value)
    assert msg.startswith("no validation ticks past the warm-up of 500 ticks: the series are too short: the longest"
                          " market, 'B', has 450 ticks, and a market needs at least 595 (")
    for key in ("neural.warmup_ticks 500", "neural.horizon_ticks 5", "training.validation_fraction 0.15",
                "training.test_fraction 0.15"):
        assert key in msg, msg
    # the time cuts common to the markets end B's and C's validation parts at their tick 339: tick 333 is the last
    # whose end tick, 5 on, lies before it
    assert msg.endswith("; set neural.warmup_ticks to 333 or less (then market 'B' has validation ticks), or train on"
                        " longer series (more days of ticks per market)")
    assert prepare(make_config(neural={**TINY_NEURAL, "warmup_ticks": 333, "horizon_ticks": 5}), data).val_counts.sum()
    with pytest.raises(DataError, match="no validation ticks past the warm-up of 334 ticks"):
        prepare(make_config(neural={**TINY_NEURAL, "warmup_ticks": 334, "horizon_ticks": 5}), data)
    # the number is the code's: one market of that many ticks has a validation tick, one tick fewer has none
    assert prepare(cfg, load_csv_files([_markets_csv(tmp_path, {"B": need})])).val_counts.sum() > 0
    with pytest.raises(DataError, match="the longest market, 'B', has 594 ticks, and a market needs at least 595"):
        prepare(cfg, load_csv_files([_markets_csv(tmp_path, {"B": need - 1})]))


def test_a_short_series_is_cut_into_fewer_lanes_not_refused(tmp_path: Path, make_config: ConfigFactory) -> None:
    """150 ticks of one market (about 105 to train on, as a half-year of daily bars gives) with the default 8 lanes:
    8 lanes of 13 ticks would all be shorter than the burn-in, and training was refused with "no market has more
    than 17 training ticks". Lanes are now at least MIN_LANE_TICKS long where the market allows."""
    cfg = make_config(neural={**TINY_NEURAL, "warmup_ticks": 10, "horizon_ticks": 5}, training={"epochs": 1})
    prep = prepare(cfg, load_csv_files([_markets_csv(tmp_path, {"A": 150})]))
    n_train = prep.markets[0].n_train
    assert 8 * (trainer.BURN_IN + 1) > n_train > trainer.MIN_LANE_TICKS
    lanes = trainer.make_lanes(prep, 8)
    assert lanes.labels.shape[0] == n_train // trainer.MIN_LANE_TICKS  # as many lanes as the market's ticks allow
    assert (lanes.labels >= 0).sum() == (prep.markets[0].labels[:n_train] >= 0).sum() - trainer.BURN_IN * lanes.labels.shape[0]
    result = train(cfg, prep, generate_weights(cfg), epochs=1)
    assert len(result.history) == 1 and math.isfinite(result.history[0]["train_loss"])
    # a long market is still cut into the lanes asked for
    long_prep = prepare(cfg, load_csv_files([_markets_csv(tmp_path, {"A": 2000})]))
    assert trainer.make_lanes(long_prep, 8).labels.shape[0] == 8


def test_a_market_shorter_than_the_burn_in_is_refused_saying_what_to_do() -> None:
    pm = SimpleNamespace(n_train=12, mossy=np.zeros((12, 4)), labels=np.zeros(12, dtype=np.int64))
    with pytest.raises(DataError, match=r"no market has more than 17 training ticks \(the longest has 12; .*train on "
                                        r"longer series or lower training.validation_fraction"):
        trainer.make_lanes(SimpleNamespace(markets=[pm]), 8)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# Gradient checkpointing
# --------------------------------------------------------------------------------------


def test_gradient_checkpointing_gives_the_same_step(tmp_path: Path, make_config: ConfigFactory) -> None:
    data = tick_data(tmp_path, 400, 2, seed=5)
    out = {}
    for ckpt in (False, True):
        # one window covers every lane: exactly one Adam step per epoch
        cfg = tiny(make_config, gradient_checkpointing=ckpt, sequence_length=1000, batch_markets=2)
        prep = prepare(cfg, data)
        res = train(cfg, prep, generate_weights(cfg), epochs=1)
        assert len(res.history) == 1
        out[ckpt] = res
    loss_plain, loss_ckpt = out[False].history[0]["train_loss"], out[True].history[0]["train_loss"]
    assert math.isfinite(loss_plain)
    assert abs(loss_plain - loss_ckpt) <= 1e-6
    init = generate_weights(tiny(make_config))
    for name in TRAINABLE:
        np.testing.assert_allclose(getattr(out[True].weights, name), getattr(out[False].weights, name), atol=1e-6, err_msg=name)
    assert not np.array_equal(out[True].weights.pf_w, init.pf_w)  # the step did change the weights


# --------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------


def test_classification_metrics_by_hand() -> None:
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.2, 0.5, 0.3], [0.5, 0.1, 0.4], [0.1, 0.2, 0.7]])
    labels = np.array([0, 2, 1, 2, 1])
    m = classification_metrics(probs, labels, majority_class=1)
    assert m["samples"] == 5
    assert m["loss"] == pytest.approx(-np.mean(np.log([0.7, 0.6, 0.5, 0.4, 0.2])))
    assert m["accuracy"] == pytest.approx(0.6)  # predictions 0, 2, 1, 0, 2
    # moving ticks 0, 1, 3: P(up)-P(down) = -0.6, +0.5, -0.1 against down, up, up
    assert m["directional_accuracy"] == pytest.approx(2 / 3)
    assert m["recall"] == {"down": 1.0, "flat": 0.5, "up": 0.5}
    assert m["majority_class"] == "flat" and m["majority_baseline_accuracy"] == pytest.approx(0.4)
    assert m["directional_baseline_accuracy"] == pytest.approx(2 / 3)
    assert m["class_counts"] == {"down": 1, "flat": 2, "up": 2}


def test_classification_metrics_edge_cases() -> None:
    assert classification_metrics(np.zeros((0, 3)), np.zeros(0, dtype=np.int64), 1) == {"samples": 0}
    m = classification_metrics(np.array([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]]), np.array([1, 1]), majority_class=0)
    assert math.isnan(m["directional_accuracy"])  # no moving tick
    assert m["recall"]["down"] is None and m["recall"]["flat"] == 0.5
    assert m["majority_baseline_accuracy"] == 0.0 and m["directional_baseline_accuracy"] == 0.0
    assert math.isfinite(m["loss"])  # probability 0 of a label is clipped, not -inf


# --------------------------------------------------------------------------------------
# Early stopping and the time budget
# --------------------------------------------------------------------------------------


def test_early_stopping_after_patience_epochs_without_improvement(tmp_path: Path, make_config: ConfigFactory) -> None:
    # a learning rate far below float32 resolution: the weights (and validation loss) never change
    cfg = tiny(make_config, learning_rate=1e-12, early_stopping_patience=1, epochs=5)
    prep = prepare(cfg, tick_data(tmp_path, 600, 2, seed=7))
    seen: list[dict[str, Any]] = []
    res = train(cfg, prep, generate_weights(cfg), progress=lambda d: seen.append(d) if d.get("epoch_done") else None)
    assert len(res.history) < 5
    assert len(res.history) == 2 and res.stopped_early and res.best_epoch == 1
    assert res.history[1]["validation"]["loss"] == res.history[0]["validation"]["loss"]
    assert [d["epoch"] for d in seen] == [1, 2]


def test_no_early_stop_while_validation_improves(tiny_prep: tuple[Config, Prepared], make_config: ConfigFactory) -> None:
    _, prep = tiny_prep
    cfg = tiny(make_config, early_stopping_patience=5, epochs=2)
    res = train(cfg, prep, generate_weights(cfg))
    assert len(res.history) == 2 and not res.stopped_early


def test_time_budget_starts_no_epoch_that_would_not_fit(tiny_prep: tuple[Config, Prepared], make_config: ConfigFactory,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake clock: every epoch takes 10 s; with a 25 s budget the third epoch (ending at 30 s) never starts."""
    _, prep = tiny_prep
    cfg = tiny(make_config, early_stopping_patience=100, epochs=5)
    now = [1000.0]

    def perf_counter() -> float:
        now[0] += 1e-6
        return now[0]

    def progress(d: dict[str, Any]) -> None:
        if d.get("epoch_done"):
            now[0] += 10.0

    monkeypatch.setattr(trainer, "time", SimpleNamespace(perf_counter=perf_counter))
    t0 = now[0]
    res = train(cfg, prep, generate_weights(cfg), progress=progress, time_budget_s=25.0)
    assert len(res.history) == 2 and res.stopped_early
    assert now[0] - t0 <= 25.0


def test_time_budget_on_the_real_clock(tiny_prep: tuple[Config, Prepared], make_config: ConfigFactory) -> None:
    _, prep = tiny_prep
    cfg = tiny(make_config, early_stopping_patience=100, epochs=3)
    res = train(cfg, prep, generate_weights(cfg), time_budget_s=1e-6)
    assert len(res.history) == 1 and res.stopped_early  # the first epoch always runs


def test_cancellation_is_polled_between_steps(tiny_prep: tuple[Config, Prepared], make_config: ConfigFactory) -> None:
    _, prep = tiny_prep
    cfg = tiny(make_config, sequence_length=16)
    calls = [0]

    def should_stop() -> bool:
        calls[0] += 1
        return calls[0] > 3

    with pytest.raises(InterruptedError):
        train(cfg, prep, generate_weights(cfg), should_stop=should_stop)
    assert calls[0] == 4


def _split_bounds(prep: Prepared) -> tuple[float, float, float, float]:
    """Latest training tick, earliest and latest validation tick, earliest test tick, over all markets (ms)."""
    def times(split: int) -> np.ndarray:
        return np.concatenate([np.array([t.timestamp for t in pm.ticks])[pm.split == split] for pm in prep.markets])

    train, val, test = times(0), times(1), times(2)
    return float(train.max()), float(val.min()), float(val.max()), float(test.min())


@pytest.mark.parametrize("shift", [0.1, 0.25, 0.5, 1.0])
def test_markets_are_cut_at_common_times(tmp_path: Path, make_config: ConfigFactory, shift: float) -> None:
    """Two markets over overlapping or following periods (two downloads of one instrument, a file per month read as a
    market per file): no validation tick is older than a training tick and no test tick older than a validation tick,
    of any market, so the test split is an out-of-time estimate; the times are recorded for `evaluate`."""
    from dataclasses import replace

    cfg = tiny(make_config)
    data = tick_data(tmp_path, 2400, 2, seed=3)
    a, b = data.markets
    span = float(a.timestamp[-1] - a.timestamp[0])
    prep = prepare(cfg, replace(data, markets=[a, replace(b, timestamp=b.timestamp + int(shift * span) + 1)]))
    train_end, val_start, val_end, test_start = _split_bounds(prep)
    assert train_end < val_start and val_end < test_start
    train_start = min(float(a.timestamp[0]), float(b.timestamp[0]) + int(shift * span) + 1)
    assert prep.times == {"train_from": train_start, "train_until": train_end, "validation_until": val_end,
                          "test_from": test_start}
    ticks = sum(len(pm.ticks) for pm in prep.markets)
    assert abs(sum(int((pm.split == 2).sum()) for pm in prep.markets) - ticks * cfg.training.test_fraction) <= 2
    if shift < 1.0:  # the later market starts inside the earlier one's span: both train
        assert all(pm.n_train > 0 for pm in prep.markets) and not any("training period" in w for w in prep.warnings)


def test_markets_of_the_same_dates_are_cut_between_dates(tmp_path: Path, make_config: ConfigFactory) -> None:
    """Daily files of several instruments share every date: a cut never splits one, so no market is validated or
    tested on a date another trained on, and every market is cut at the same place."""
    from dataclasses import replace

    cfg = tiny(make_config)
    data = tick_data(tmp_path, 3600, 3, seed=3)
    days = 1_262_304_000_000 + 86_400_000 * np.arange(1001, dtype=np.float64)  # 1,001 days from 2010-01-01: 70 % of 3,003 ticks ends inside a day
    markets = [replace(m, timestamp=days, price=m.price[:1001], volume=m.volume[:1001]) for m in data.markets]
    assert len(markets) == 3 and all(len(m.price) == 1001 for m in markets)
    prep = prepare(cfg, replace(data, markets=markets))
    train_end, val_start, val_end, test_start = _split_bounds(prep)
    assert train_end < val_start and val_end < test_start
    assert len({pm.n_train for pm in prep.markets}) == 1 and len({int((pm.split == 2).sum()) for pm in prep.markets}) == 1


def test_a_market_wholly_after_the_training_period_is_said_to_be_only_scored(
        tmp_path: Path, make_config: ConfigFactory) -> None:
    """A short market recorded after the others: it has no training tick, is scored on validation and test, and the
    warning says so."""
    from dataclasses import replace

    cfg = tiny(make_config)
    data = tick_data(tmp_path, 4000, 1, seed=3)
    long = data.markets[0]
    short = tick_data(tmp_path, 500, 1, seed=4).markets[0]
    late = replace(short, market_id="LATE", timestamp=short.timestamp - short.timestamp[0] + long.timestamp[-1] + 1000)
    prep = prepare(cfg, replace(data, markets=[long, late]))
    (pm,) = [m for m in prep.markets if m.market_id == "LATE"]
    assert pm.n_train == 0 and (pm.split > 0).all() and (pm.labels == -1).all()
    (warning,) = [w for w in prep.warnings if "training period" in w]
    assert warning.startswith("market 'LATE' has no tick in the training period (up to ")


def test_a_market_too_short_to_train_on_is_named_not_dropped_silently(tmp_path: Path, make_config: ConfigFactory) -> None:
    from dataclasses import replace

    cfg = tiny(make_config)
    data = tick_data(tmp_path, 2400, 2, seed=3)
    a, b = data.markets
    need = 2 * cfg.neural.horizon_ticks + trainer.BURN_IN + 2
    tiny_market = replace(b, market_id="TINY", timestamp=b.timestamp[:need - 1], price=b.price[:need - 1],
                          volume=b.volume[:need - 1])
    prep = prepare(cfg, replace(data, markets=[a, b, tiny_market]))
    assert [pm.market_id for pm in prep.markets] == [a.market_id, b.market_id]
    (warning,) = [w for w in prep.warnings if "left out" in w]
    assert warning == (f"1 market(s) left out, with fewer than the {need} ticks a market needs (2 x neural.horizon_ticks"
                       f" + {trainer.BURN_IN + 2}): 'TINY' ({need - 1} ticks)")
    just = replace(tiny_market, timestamp=b.timestamp[:need], price=b.price[:need], volume=b.volume[:need])
    assert "TINY" in [pm.market_id for pm in prepare(cfg, replace(data, markets=[a, b, just])).markets]


def test_one_class_in_every_validation_label_is_no_edge() -> None:
    """A price that never moves labels every tick flat: a head fitted to say "flat" scores a log loss near 0 against
    the smoothed priors, which is no edge (it predicts nothing a trader could use)."""
    from cerebellar_norse.training.calibration import choose_head

    rng = np.random.Generator(np.random.PCG64(3))
    logp = np.log(rng.dirichlet(np.ones(3), 600))
    flat = np.ones(600, dtype=np.int64)
    choice = choose_head(logp, flat, np.array([0, 2000, 0]), horizon=10)
    assert choice.edge == "none" and "every validation label is flat" in choice.cv["reason"]
    assert np.abs(choice.head.gain).max() == 0.0  # the priors head: served probabilities are the base rates
    mixed = rng.integers(0, 3, 600)  # two or three classes: the cross-validated rule decides, as before
    assert "reason" not in choose_head(logp, mixed, np.array([700, 600, 700]), horizon=10).cv


def test_no_head_is_fitted_on_a_tick_within_a_horizon_of_the_fold_it_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head's cross-validation is purged: the labels of ticks less than a horizon apart share returns, so a fold is
    scored by heads fitted on the ticks more than a horizon away from it, on either side."""
    from cerebellar_norse.training import calibration

    n, horizon = 600, 10
    rng = np.random.Generator(np.random.PCG64(5))
    logp = np.log(rng.dirichlet(np.ones(3), n))
    logp[:, 0] = -(np.arange(n) + 1.0) * 1e-3  # each row names itself
    fitted: list[np.ndarray] = []
    real = calibration.fit_head

    def recording(lp: np.ndarray, labels: np.ndarray, kind: str, max_iter: int = 100) -> calibration.Head:
        fitted.append(np.rint(-lp[:, 0] * 1e3 - 1.0).astype(int))
        return real(lp, labels, kind, max_iter)

    monkeypatch.setattr(calibration, "fit_head", recording)
    calibration.choose_head(logp, rng.integers(0, 3, n), np.array([700, 600, 700]), horizon=horizon)
    folds = np.array_split(np.arange(n), calibration.FOLDS)
    for k, fold in enumerate(folds):
        for rows in fitted[2 * k:2 * k + 2]:  # the flat and the shared head of fold k
            assert rows.size and not ((rows >= fold[0] - horizon) & (rows <= fold[-1] + horizon)).any()
            assert rows.size == n - fold.size - (horizon if k == 0 or k == len(folds) - 1 else 2 * horizon)


def test_network_logp_steps_a_long_market_in_bounded_chunks(tiny_prep: tuple[Config, Prepared],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """process_ticks answers one dict per tick: a market of millions of ticks stepped in one call held
    gigabytes of them. network_logp steps each market in chunks, with the same log-probabilities."""
    from cerebellar_norse.neurons.network import CerebellarNetwork

    cfg, prep = tiny_prep
    weights = generate_weights(cfg)
    whole = trainer.network_logp(cfg, weights, prep)
    calls: list[int] = []
    step = CerebellarNetwork.process_ticks

    def spy(self: CerebellarNetwork, ticks: Any, batch: bool = True) -> list[dict[str, Any]]:
        calls.append(len(ticks))
        return step(self, ticks, batch)

    monkeypatch.setattr(CerebellarNetwork, "process_ticks", spy)
    monkeypatch.setattr(trainer, "LOGP_CHUNK", 97, raising=False)
    chunked = trainer.network_logp(cfg, weights, prep)
    assert max(calls) <= 97
    assert sum(calls) == sum(len(pm.ticks) for pm in prep.markets)
    for a, b in zip(whole, chunked, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_logistic_baseline_copies_only_the_rows_it_fits_on(tmp_path: Path, make_config: ConfigFactory,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The test split's logistic baseline is fitted on at most MAX_LR_ROWS training rows: converting every
    training row to float64 before subsampling held two float64 copies of the whole training split (over 1 GB
    for 2 million ticks). Only the kept rows are copied, and the baseline is the same."""
    import tracemalloc

    from cerebellar_norse.training import scoring
    from cerebellar_norse.training.evaluation import fit_logistic

    prep = prepare(tiny(make_config), tick_data(tmp_path, 40_000, 2, seed=3))
    idx, _ = prep.rows(2)
    monkeypatch.setattr(scoring, "MAX_LR_ROWS", 500)
    train_rows = sum(int((pm.labels >= 0).sum()) for pm in prep.markets)
    full_float64 = train_rows * prep.markets[0].mossy.shape[1] * 8
    assert train_rows > 10 * scoring.MAX_LR_ROWS
    tracemalloc.start()
    try:
        got = scoring._logistic_from_train(prep, idx)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < full_float64, (peak, full_float64)  # before: two float64 copies of every training row
    # the same fit as on the whole float64 matrix subsampled
    x = np.concatenate([pm.mossy[pm.labels >= 0].astype(np.float64) for pm in prep.markets])
    y = np.concatenate([pm.labels[pm.labels >= 0] for pm in prep.markets]).astype(np.int64)
    keep = np.linspace(0, y.size - 1, scoring.MAX_LR_ROWS).astype(np.int64)
    want = fit_logistic(x[keep], y[keep], l2=scoring.choose_l2(x[keep], y[keep])).predict_proba(
        np.concatenate([pm.mossy[i].astype(np.float64) for pm, i in zip(prep.markets, idx, strict=True)]))
    assert got is not None and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)  # predicted in parts: the same up to rounding


def test_logistic_baseline_rows_filled_in_parts_fit_as_the_concatenated_rows(tmp_path: Path, make_config: ConfigFactory,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows the logistic baseline is fitted on are copied to float64 into one array a part at a time (parts
    smaller than a market, two markets): the fit is the one on the concatenated float64 rows, to the last bit."""
    from cerebellar_norse.training import scoring
    from cerebellar_norse.training.evaluation import fit_logistic

    prep = prepare(tiny(make_config), tick_data(tmp_path, 40_000, 2, seed=3))
    monkeypatch.setattr(scoring, "MAX_LR_ROWS", 20_000)
    monkeypatch.setattr(scoring, "PREDICT_ROWS", 1_000)
    rows = [np.flatnonzero(pm.labels >= 0) for pm in prep.markets]
    ys = [pm.labels[r] for pm, r in zip(prep.markets, rows, strict=True)]
    assert sum(r.size for r in rows) > scoring.MAX_LR_ROWS
    got = scoring._fit_on(prep.markets, rows, ys)
    x = np.concatenate([pm.mossy[r].astype(np.float64) for pm, r in zip(prep.markets, rows, strict=True)])
    y = np.concatenate(ys).astype(np.int64)
    keep = np.linspace(0, y.size - 1, scoring.MAX_LR_ROWS).astype(np.int64)
    want = fit_logistic(x[keep], y[keep], l2=scoring.choose_l2(x[keep], y[keep]))
    assert got is not None
    np.testing.assert_array_equal(got.coef, want.coef)
    np.testing.assert_array_equal(got.intercept, want.intercept)
    np.testing.assert_array_equal(got.scale, want.scale)


@pytest.mark.parametrize("n_lanes", [8, 111, 112, 65_536])
def test_more_lanes_asked_for_than_the_ticks_fill_train_on_fewer_not_on_none(n_lanes: int) -> None:
    """training.batch_markets (POST /training accepts up to 65536) larger than the ticks can fill: each market is
    cut into as many lanes longer than the burn-in as it holds, keeping every tick, rather than into lanes too short
    to keep, which failed the job with "no market has more than 17 training ticks" for a market of 2000."""
    n_train = 2000
    market = SimpleNamespace(n_train=n_train, mossy=np.ones((n_train, 3), dtype=np.float32),
                             labels=np.zeros(n_train, dtype=np.int64))
    lanes = trainer.make_lanes(SimpleNamespace(markets=[market]), n_lanes)  # type: ignore[arg-type]
    assert 1 <= lanes.labels.shape[0] <= min(n_lanes, n_train // (trainer.BURN_IN + 2))
    assert int((lanes.labels >= 0).sum()) == n_train - lanes.labels.shape[0] * trainer.BURN_IN  # every tick in a lane


def test_prepared_markets_hold_their_ticks_as_arrays_not_a_tick_object_per_row(tmp_path: Path,
                                                                                 make_config: ConfigFactory) -> None:
    """``prepare``'s peak memory (traced) per tick beyond the encoded inputs stays near the ~70 bytes of its labels,
    splits and returns: a list of one ``Tick`` per row added ~180 bytes more (0.9 GB for 5 million ticks). The
    ticks the network is driven with are still the series' values, one ``Tick`` each, by index or by slice."""
    import tracemalloc

    from cerebellar_norse.ticks import Tick

    cfg = tiny(make_config)
    data = tick_data(tmp_path, 30_000, 2, seed=5)
    prepare(cfg, data)  # warm the first call's caches
    tracemalloc.start()
    try:
        prep = prepare(cfg, data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    n = data.ticks
    mossy = sum(pm.mossy.nbytes for pm in prep.markets)
    assert (peak - mossy) / n < 150, f"{(peak - mossy) / n:.0f} bytes per tick beyond the encoded inputs"
    m, pm = data.markets[0], prep.markets[0]
    expected = [Tick(float(p), float(v), int(s), m.market_id) for p, v, s in zip(m.price, m.volume, m.timestamp,
                                                                                   strict=True)]
    assert len(pm.ticks) == len(m)
    assert pm.ticks[100:230] == expected[100:230] and pm.ticks[7] == expected[7] and list(pm.ticks) == expected
    assert all(type(t.price) is float and type(t.timestamp) is int for t in pm.ticks[:5])


def test_markets_of_one_period_are_not_independent_evidence_of_an_edge(tmp_path: Path,
                                                                      make_config: ConfigFactory) -> None:
    """Four copies of one market (markets of one period that move together, in the extreme) hold one market's
    evidence: the head's cross-validation runs over the validation ticks in time order, its folds periods of every
    market and its blocks every market's ticks of a horizon, so it finds what one market shows. Cut from the markets
    one after another, a fold's copies were fitted on in the other folds (a head scored on ticks it was fitted on) and
    the blocks counted four independent markets: a margin half as wide and a gain from the fit itself."""
    from dataclasses import replace

    cfg = make_config(neural={**TINY_NEURAL, "warmup_ticks": 50, "horizon_ticks": 20})
    one = tick_data(tmp_path, 2000, 1, seed=4)
    market = one.markets[0]
    copies = replace(one, markets=[replace(market, market_id=f"C{k}") for k in range(4)])
    weights = generate_weights(cfg)
    _, single, _ = trainer.validate_epoch(cfg, weights, prepare(cfg, one))
    prep = prepare(cfg, copies)
    order, horizon = trainer.validation_order(prep, prep.rows(1)[0])
    assert order is not None and horizon == 4 * 20
    _, several, _ = trainer.validate_epoch(cfg, weights, prep)
    cv_1, cv_4 = single["cv"], several["cv"]
    assert cv_4["samples"] == 4 * cv_1["samples"]
    assert cv_4["direction_margin"] == pytest.approx(cv_1["direction_margin"], rel=0.1)
    assert cv_4["flat_margin"] == pytest.approx(cv_1["flat_margin"], rel=0.1)
    assert cv_4["direction_gain"] == pytest.approx(cv_1["direction_gain"], abs=0.2 * cv_1["direction_margin"])
    assert cv_4["flat_gain"] == pytest.approx(cv_1["flat_gain"], abs=0.2 * cv_1["flat_margin"])
    assert several["edge"] == single["edge"]
