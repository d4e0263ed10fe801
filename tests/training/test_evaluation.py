"""Scoring against baselines: the logistic baseline fit, the metrics, the P&L, the block bootstrap."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cerebellar_norse.training import evaluation
from cerebellar_norse.training.evaluation import (
    ScoreInputs,
    baseline_probs,
    block_length,
    cumulative_pnl,
    fit_logistic,
    rule_tilts,
    score,
)
from cerebellar_norse.training.labels import LabelSpec, label_series, past_returns
from cerebellar_norse.training.report import format_summary


def block_variance(series: np.ndarray, block: int) -> np.ndarray:
    """The moving-block bootstrap's variance (k,) of the mean of each row of ``series`` (k, m), as ``score`` computes it."""
    return evaluation._block_variance(evaluation._prefix_sums(series), block)


def interval_variance(series: np.ndarray, block: int) -> np.ndarray:
    """The same freed of the block length's bias, the variance ``score``'s intervals are made of."""
    return evaluation._interval_variance(evaluation._prefix_sums(series), block)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def sample_classes(rng: np.random.Generator, p: np.ndarray) -> np.ndarray:
    return (rng.random(p.shape[0])[:, None] > p.cumsum(axis=1)).sum(axis=1).clip(0, 2)


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    return float(-np.mean(np.log(p[np.arange(y.shape[0]), y])))


def planted(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = np.array([[1.5, 0.0, -1.5], [-0.8, 0.4, 0.4], [0.0, 0.0, 0.0]])
    b = np.array([0.0, 0.3, -0.2])
    X = rng.standard_normal((n, 3)) * np.array([1.0, 3.0, 0.5]) + np.array([0.0, 10.0, -2.0])
    true_p = softmax(((X - np.array([0.0, 10.0, -2.0])) / np.array([1.0, 3.0, 0.5])) @ w + b)
    return X, sample_classes(rng, true_p), true_p


def inputs(probs: np.ndarray, labels: np.ndarray, rng: np.random.Generator | None = None, **kw: object) -> ScoreInputs:
    n = labels.shape[0]
    rng = rng or np.random.default_rng(5)
    fwd = np.where(labels == 2, 1e-3, np.where(labels == 0, -1e-3, 0.0)) + rng.normal(0, 1e-5, n)
    args: dict[str, object] = {"probs": probs, "labels": labels, "fwd_ret": fwd, "past_ret": rng.normal(0, 1e-3, n),
                               "base_rates": np.array([0.3, 0.4, 0.3]), "horizon": 1}
    args.update(kw)
    return ScoreInputs(**args)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- logistic


def test_logistic_recovers_a_planted_signal() -> None:
    rng = np.random.default_rng(0)
    X, y, _ = planted(rng, 20_000)
    model = fit_logistic(X, y)
    assert model.converged
    X_test, y_test, p_true = planted(rng, 20_000)
    p_fit = model.predict_proba(X_test)
    assert p_fit.shape == (20_000, 3)
    np.testing.assert_allclose(p_fit.sum(axis=1), 1.0)
    acc_true = float(np.mean(p_true.argmax(axis=1) == y_test))
    acc_fit = float(np.mean(p_fit.argmax(axis=1) == y_test))
    assert acc_true > 0.55
    assert abs(acc_fit - acc_true) < 0.01
    assert log_loss(p_fit, y_test) < log_loss(p_true, y_test) + 0.005
    # the irrelevant third feature gets (almost) no weight, the first the planted contrast
    assert np.abs(model.coef[2]).max() < 0.05
    assert model.coef[0, 0] - model.coef[0, 2] == pytest.approx(3.0, abs=0.2)


def test_logistic_on_noise_gives_the_class_frequencies() -> None:
    rng = np.random.default_rng(1)
    n = 20_000
    X = rng.standard_normal((n, 5))
    y = rng.choice(3, size=n, p=[0.2, 0.5, 0.3])
    freq = np.bincount(y, minlength=3) / n
    p = fit_logistic(X, y).predict_proba(X)
    base_loss = float(-(freq * np.log(freq)).sum())
    assert abs(log_loss(p, y) - base_loss) < 0.01
    np.testing.assert_allclose(p.mean(axis=0), freq, atol=0.01)


def test_logistic_constant_columns_and_absent_classes_stay_finite() -> None:
    rng = np.random.default_rng(2)
    n = 500
    X = np.column_stack([rng.standard_normal(n), np.full(n, 7.0), rng.standard_normal(n)])
    y = (X[:, 0] > 0).astype(np.int64)  # only down and flat, separable by the first feature
    model = fit_logistic(X, y)
    p = model.predict_proba(X)
    assert np.isfinite(p).all()
    assert (p[:, 2] > 0).all() and p[:, 2].max() < 0.01
    assert model.coef[1].tolist() == [0.0, 0.0, 0.0]
    assert float(np.mean(p.argmax(axis=1) == y)) > 0.97
    single = fit_logistic(X[:1], y[:1])
    assert np.isfinite(single.predict_proba(X)).all()


def test_logistic_two_stage_fit_matches_exact_newton(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    X, y, _ = planted(rng, 6_000)
    exact = fit_logistic(X, y)
    monkeypatch.setattr(evaluation, "HESSIAN_ROWS", 1_000)
    staged = fit_logistic(X, y)
    again = fit_logistic(X, y)
    assert staged.converged
    np.testing.assert_allclose(staged.coef, exact.coef, atol=1e-4)
    np.testing.assert_allclose(staged.predict_proba(X), exact.predict_proba(X), atol=1e-5)
    assert staged.loss == pytest.approx(exact.loss, abs=1e-9)
    np.testing.assert_array_equal(staged.coef, again.coef)


def test_logistic_rejects_bad_input() -> None:
    X = np.zeros((4, 2))
    with pytest.raises(ValueError):
        fit_logistic(X, np.array([0, 1, 3, 0]))
    with pytest.raises(ValueError):
        fit_logistic(np.array([[0.0, np.nan]] * 4), np.zeros(4, dtype=int))
    with pytest.raises(ValueError):
        fit_logistic(X, np.zeros(3, dtype=int))
    with pytest.raises(ValueError):
        fit_logistic(X, np.zeros(4, dtype=int)).predict_proba(np.zeros((2, 3)))


# --------------------------------------------------------------------------- score


def test_perfect_predictor() -> None:
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 3, 3_000)
    s = score(inputs(np.eye(3)[labels], labels), bootstrap=50)
    m = s["model"]
    assert m["accuracy"] == 1.0 and m["directional_accuracy"] == 1.0
    assert m["log_loss"] == pytest.approx(0.0, abs=1e-12)
    assert m["direction_log_loss"] == pytest.approx(0.0, abs=1e-12)
    assert m["brier"] == 0.0 and m["ece"] == 0.0 and m["direction_ece"] == 0.0
    assert m["recall"] == {"down": 1.0, "flat": 1.0, "up": 1.0}
    assert m["pnl"]["hit_rate"] == 1.0
    assert s["vs_baselines"]["base_rates"]["log_loss"]["diff"] < -1.0


def test_constant_base_rates_predictor_scores_the_entropy() -> None:
    rng = np.random.default_rng(5)
    labels = rng.choice(3, size=10_000, p=[0.25, 0.45, 0.30])
    freq = np.bincount(labels, minlength=3) / labels.shape[0]
    probs = np.tile(freq, (labels.shape[0], 1))
    s = score(inputs(probs, labels, base_rates=freq), bootstrap=20)
    m = s["model"]
    assert m["log_loss"] == pytest.approx(float(-(freq * np.log(freq)).sum()), rel=1e-12)
    assert m["ece"] == pytest.approx(0.0, abs=1e-12)
    assert m["direction_ece"] == pytest.approx(0.0, abs=1e-12)
    assert m["accuracy"] == pytest.approx(freq.max())
    # the model is the base-rates baseline: every difference is 0 with a degenerate interval
    for cell in s["vs_baselines"]["base_rates"].values():
        assert cell["diff"] == pytest.approx(0.0, abs=1e-12)
        assert cell["ci95"] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert s["class_counts"] == {"down": int((labels == 0).sum()), "flat": int((labels == 1).sum()),
                                 "up": int((labels == 2).sum())}
    assert s["moving_samples"] == int((labels != 1).sum())


def test_random_predictor_is_worse_than_base_rates() -> None:
    rng = np.random.default_rng(6)
    n = 30_000
    labels = rng.integers(0, 3, n)
    probs = rng.dirichlet([1.0, 1.0, 1.0], n)
    s = score(inputs(probs, labels, base_rates=np.full(3, 1 / 3)), bootstrap=200)
    m = s["model"]
    assert abs(m["accuracy"] - 1 / 3) < 0.02
    assert abs(m["directional_accuracy"] - 0.5) < 0.02
    assert m["log_loss"] > math.log(3) + 0.1
    diff = s["vs_baselines"]["base_rates"]["log_loss"]
    assert diff["ci95"][0] > 0
    acc = s["vs_baselines"]["base_rates"]["accuracy"]
    assert acc["ci95"][0] < acc["diff"] < acc["ci95"][1]


def test_hand_computed_small_case() -> None:
    labels = np.array([2, 0, 1, 2, 0])
    probs = np.array([[.1, .2, .7], [.6, .3, .1], [.2, .5, .3], [.5, .3, .2], [.3, .4, .3]])
    fwd = np.array([0.002, -0.001, 0.0005, 0.001, -0.003])
    inp = ScoreInputs(probs=probs, labels=labels, fwd_ret=fwd, past_ret=np.full(5, np.nan),
                      base_rates=np.array([0.3, 0.4, 0.3]), horizon=2)
    s = score(inp, cost_bp=2.0, bootstrap=0)
    m = s["model"]
    assert m["confusion"] == [[1, 1, 0], [0, 1, 0], [1, 0, 1]]
    assert m["recall"] == {"down": 0.5, "flat": 1.0, "up": 0.5}
    assert m["accuracy"] == pytest.approx(0.6)
    assert m["directional_accuracy"] == pytest.approx(2.5 / 4)  # the tie on the last row counts half
    assert m["log_loss"] == pytest.approx(-np.log([.7, .6, .5, .2, .3]).mean())
    assert m["direction_log_loss"] == pytest.approx(-np.log([7 / 8, 6 / 7, 2 / 7, 0.5]).mean())
    assert m["brier"] == pytest.approx(0.5)
    assert m["ece"] == pytest.approx(0.22)
    # signs +1, −1, +1, −1, 0, each trade 1/2 held 2 ticks: the book is +1/2, 0, 0, 0, −1/2, then closed, a turnover
    # of 1/2 at rows 0, 1 and 4 and 1/2 closing after the last (charged there): 2.0 units at 2 bp / 2 each
    pnl = m["pnl"]
    assert pnl["trades"] == 4
    assert pnl["hit_rate"] == pytest.approx(0.75)
    assert pnl["mean_trade_bp"] == pytest.approx((20 + 10 + 5 - 10) / 4)  # before costs
    assert pnl["gross_bp"] == pytest.approx(12.5)
    assert pnl["turnover"] == pytest.approx(2.0) and pnl["costs_bp"] == pytest.approx(2.0)
    assert pnl["total_bp"] == pytest.approx(10.5)
    net = np.array([10 - 0.5, 5 - 0.5, 2.5, -5, -1.0])  # bp per row: the trade's return / 2 less the row's costs
    assert pnl["net_per_tick_bp"] == pytest.approx(net.mean())
    assert pnl["sharpe_per_trade"] == pytest.approx(net.mean() / net.std(ddof=1))
    long = m["always_long"]
    assert long["trades"] == 5 and long["hit_rate"] == pytest.approx(0.6)
    assert long["costs_bp"] == pytest.approx(2.0)  # one round trip, as buy and hold
    assert long["total_bp"] == pytest.approx(-2.5 - 2.0)
    cum = cumulative_pnl(inp, cost_bp=2.0)
    np.testing.assert_allclose(cum["model"], np.cumsum(net))
    assert cum["always_long"][-1] == pytest.approx(-4.5)
    assert s["vs_baselines"]["base_rates"]["accuracy"]["ci95"] is None
    bins = {b["lo"]: b for b in m["reliability"] if b["count"]}
    assert bins[0.8]["count"] == 1 and bins[0.8]["mean_predicted"] == pytest.approx(7 / 8)
    assert bins[0.8]["observed"] == 1.0
    assert sum(b["count"] for b in m["reliability"]) == 4


def test_baseline_probabilities_are_label_free_and_documented() -> None:
    tilts = {"persistence": 0.1, "mean_reversion": 0.1, "always_up": 0.1}  # the moving mass split 0.6 / 0.4
    p = baseline_probs(np.array([0.25, 0.5, 0.25]), np.array([0.01, -0.01, np.nan, 0.0]), tilts)
    np.testing.assert_allclose(p["persistence"], [[.2, .5, .3], [.3, .5, .2], [.25, .5, .25], [.25, .5, .25]])
    np.testing.assert_allclose(p["mean_reversion"], [[.3, .5, .2], [.2, .5, .3], [.25, .5, .25], [.25, .5, .25]])
    np.testing.assert_allclose(p["always_up"], np.tile([.2, .5, .3], (4, 1)))  # buy and hold, whatever came before
    np.testing.assert_allclose(p["majority"][0], np.array([1e-4, 1.0, 1e-4]) / (1 + 2e-4))
    np.testing.assert_allclose(p["base_rates"], np.tile([0.25, 0.5, 0.25], (4, 1)))


def test_persistence_baseline_trades_the_past_direction() -> None:
    labels = np.array([2, 2, 0, 0])
    past = np.array([0.01, -0.01, -0.01, np.nan])
    fwd = np.array([0.001, 0.002, -0.001, -0.004])
    inp = ScoreInputs(probs=np.full((4, 3), 1 / 3), labels=labels, fwd_ret=fwd, past_ret=past,
                      base_rates=np.array([0.25, 0.5, 0.25]), horizon=1)
    s = score(inp, bootstrap=0)
    pers, rev = s["baselines"]["persistence"], s["baselines"]["mean_reversion"]
    assert pers["pnl"]["trades"] == 3 and rev["pnl"]["trades"] == 3
    assert pers["pnl"]["total_bp"] == pytest.approx(10.0 - 20.0 + 10.0)
    assert rev["pnl"]["total_bp"] == pytest.approx(-pers["pnl"]["total_bp"])
    assert pers["directional_accuracy"] == pytest.approx((1 + 0 + 1 + 0.5) / 4)
    assert s["model"]["pnl"]["trades"] == 0 and s["model"]["pnl"]["sharpe_per_trade"] is None
    assert s["baselines"]["majority"]["log_loss"] == pytest.approx(-math.log(1e-4 / (1 + 2e-4)))
    assert "logistic" not in s["baselines"]


def informative(rng: np.random.Generator, n: int) -> ScoreInputs:
    labels = rng.integers(0, 3, n)
    probs = np.where(np.eye(3)[labels] > 0, 0.45, 0.275)
    probs = np.where(rng.random(n)[:, None] < 0.5, probs, rng.dirichlet([5, 5, 5], n))
    return inputs(probs, labels, rng, base_rates=np.full(3, 1 / 3), horizon=5,
                  lr_probs=rng.dirichlet([20, 20, 20], n))


def test_bootstrap_interval_contains_the_difference_and_narrows_with_n() -> None:
    rng = np.random.default_rng(7)
    small = score(informative(rng, 2_000), bootstrap=300, seed=1)
    large = score(informative(rng, 50_000), bootstrap=300, seed=1)
    for s in (small, large):
        for name in ("base_rates", "persistence", "logistic"):
            for cell in s["vs_baselines"][name].values():
                lo, hi = cell["ci95"]
                assert lo <= cell["diff"] <= hi
    width_small = np.diff(small["vs_baselines"]["base_rates"]["log_loss"]["ci95"])[0]
    width_large = np.diff(large["vs_baselines"]["base_rates"]["log_loss"]["ci95"])[0]
    assert 0 < width_large < width_small / 2.5
    assert large["vs_baselines"]["base_rates"]["accuracy"]["ci95"][0] > 0
    assert large["bootstrap"]["block_length"] == block_length(50_000, 5) == 37
    again = score(informative(np.random.default_rng(7), 2_000), bootstrap=300, seed=1)
    assert again["vs_baselines"] == small["vs_baselines"]


def test_interval_variance_is_freed_of_the_block_length_bias() -> None:
    """For rows correlated over 13 lags (a moving sum, as overlapping horizons make them), blocks of 20 rows cut the
    covariances near their length: the plain moving-block variance of the mean falls about a quarter short of the
    truth, (q + 1)^2 / n; the extrapolated one, which the intervals use, is within a few percent."""
    rng = np.random.default_rng(3)
    q, n, block = 12, 6000, 20
    plain, extrapolated = [], []
    for _ in range(40):
        x = np.convolve(rng.standard_normal(n + q), np.ones(q + 1), "valid")[None, :]
        plain.append(block_variance(x, block)[0])
        extrapolated.append(interval_variance(x, block)[0])
    truth = (q + 1) ** 2 / n
    assert np.mean(plain) < 0.85 * truth
    assert np.mean(extrapolated) == pytest.approx(truth, rel=0.08)


@pytest.mark.parametrize(("dof", "want"), [(1, 12.7062), (2, 4.3027), (5, 2.5706), (10, 2.2281), (28, 2.0484),
                                          (30, 2.0423), (100, 1.9840), (1_000, 1.9623), (1e6, 1.9600)])
def test_student_t_quantile_matches_the_tables(dof: float, want: float) -> None:
    assert evaluation.student_t_quantile(0.975, dof) == pytest.approx(want, abs=1e-4)
    assert evaluation.student_t_quantile(0.975, dof) > evaluation.student_t_quantile(0.975, dof * 1.01)


def test_student_t_quantile_other_levels_and_bad_arguments() -> None:
    assert evaluation.student_t_quantile(0.995, 5) == pytest.approx(4.0321, abs=1e-4)
    assert evaluation.student_t_quantile(0.9, 1) == pytest.approx(3.0777, abs=1e-4)
    assert evaluation.student_t_quantile(0.75, 3) == pytest.approx(0.7649, abs=1e-4)
    for p, dof in ((0.5, 10), (1.0, 10), (0.975, 0.5), (0.975, float("nan"))):
        with pytest.raises(ValueError, match="student_t_quantile"):
            evaluation.student_t_quantile(p, dof)


def test_interval_dof_is_that_of_the_flat_top_window() -> None:
    assert evaluation.interval_dof(740, 10) == pytest.approx(27.75)
    assert evaluation.interval_dof(8_000, 20) == pytest.approx(150.0)
    assert evaluation.interval_dof(20, 10) == 1.0  # fewer than 8/3 blocks: at least one degree of freedom


def _no_skill_walk(seed: int, n: int = 740, horizon: int = 10) -> ScoreInputs:
    """An hourly file's test split: a Gaussian random walk of ``n`` scored ticks labelled with ``horizon``, the base
    rates from the ``n`` before, scored for a model leaning 5 % of its moving mass on the last 3 ticks' return (no
    information), as benchmarks/interval_coverage.py draws them."""
    from cerebellar_norse.training.labels import LabelSpec, label_series, past_returns
    rng = np.random.default_rng(seed)
    price = 100.0 * np.exp(np.cumsum(rng.standard_normal(2 * n + 200) * 1e-3))
    lab = label_series(np.arange(price.size, dtype=np.int64) * 1000, price, LabelSpec(horizon_ticks=horizon))
    train = np.arange(100, n)
    base = np.bincount(lab.labels[train[lab.end[train] >= 0]], minlength=3) / train.size
    rows = np.arange(n + 100, 2 * n + 100)
    rows = rows[lab.end[rows] >= 0]
    lean = np.sign(np.log(price[rows]) - np.log(price[rows - 3]))
    probs = np.tile(base / base.sum(), (rows.size, 1))
    moving = probs[0, 0] + probs[0, 2]
    probs[:, 2] = moving * (0.5 + 0.05 * lean)
    probs[:, 0] = moving * (0.5 - 0.05 * lean)
    return ScoreInputs(probs, lab.labels[rows], lab.fwd_ret[rows], past_returns(price, lab.end)[rows],
                       base / base.sum(), None, horizon)


def test_short_file_intervals_are_widened_by_the_student_t_of_their_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """On 20 no-skill walks of 740 scored ticks (horizon 10: about 74 horizons) every interval is the point ± t·√v,
    1.96·√v made wider by t/1.96, t the Student quantile of 3·rows / (8·block) degrees of
    freedom (about 17 for the moving rows' directional accuracy: 6 % wider; 28 for the P&L's 740 rows: 4.5 %)."""
    for seed in range(20):
        inp = _no_skill_walk(seed)
        s = score(inp, bootstrap=200, seed=seed)
        boot = s["bootstrap"]
        block, moving, n = boot["block_length"], s["moving_samples"], s["samples"]
        assert block == 10 and n == 740
        want = {"all_rows": 3 * n / 80, "moving_rows": 3 * moving / 80}
        assert boot["degrees_of_freedom"] == pytest.approx(want, abs=0.01)
        assert boot["t_quantile"]["moving_rows"] == pytest.approx(
            evaluation.student_t_quantile(0.975, want["moving_rows"]), abs=1e-4)
        if seed == 0:  # no resamples, no intervals: no quantile either
            none = score(inp, bootstrap=0)["bootstrap"]
            assert none["degrees_of_freedom"] == none["t_quantile"] == {"all_rows": None, "moving_rows": None}
        with monkeypatch.context() as m:  # the same variance, the normal quantile
            m.setattr(evaluation, "student_t_quantile", lambda p, dof: 1.959964)
            plain = score(inp, bootstrap=200, seed=seed)
        for rows, metric in (("moving_rows", "directional_accuracy"), ("moving_rows", "direction_log_loss"),
                             ("all_rows", "log_loss")):
            factor = evaluation.student_t_quantile(0.975, want[rows]) / 1.959964
            got, was = s["vs_baselines"]["base_rates"][metric], plain["vs_baselines"]["base_rates"][metric]
            assert got["diff"] == was["diff"]
            for k in (0, 1):
                assert got["ci95"][k] - got["diff"] == pytest.approx((was["ci95"][k] - was["diff"]) * factor, rel=1e-6)
        got_pnl, was_pnl = s["model"]["pnl"], plain["model"]["pnl"]
        factor = evaluation.student_t_quantile(0.975, want["all_rows"]) / 1.959964
        assert 1.04 < factor < 1.05
        for k in (0, 1):
            assert got_pnl["total_bp_ci95"][k] - got_pnl["total_bp"] == pytest.approx(
                (was_pnl["total_bp_ci95"][k] - was_pnl["total_bp"]) * factor, rel=1e-6)


@pytest.mark.parametrize(("m", "block"), [(100, 1), (450, 10), (450, 20), (40, 10), (39, 10), (1_000, 999)])
def test_block_shortfall_is_the_exact_moving_block_variance_of_independent_rows(m: int, block: int) -> None:
    """The moving-block bootstrap's variance of the mean of m independent rows over the truth, 1/m, computed from
    every start's block sum (the bootstrap's own distribution, exactly, for unit-variance rows: E over the rows of the
    variance of k drawn block sums / (k·block)), against :func:`evaluation._block_shortfall`."""
    n_starts = m - block + 1
    k = math.ceil(m / block)
    # block sums S_j = Σ_i A[j, i] x_i; E[Var_j(S_j)] = (trace(A Aᵀ) − 1ᵀA Aᵀ1 / N) / N for unit-variance rows
    a = np.zeros((n_starts, m))
    for j in range(n_starts):
        a[j, j:j + block] = 1.0
    gram = a @ a.T
    e_var = (np.trace(gram) - gram.sum() / n_starts) / n_starts
    want = e_var / (k * block * block) / (1.0 / m)
    assert evaluation._block_shortfall(m, block) == pytest.approx(want, rel=1e-12)
    assert evaluation._block_shortfall(m, m) == 0.0


def test_short_series_variance_is_freed_of_the_blocks_shortfall() -> None:
    """450 rows correlated over 10 lags (about the moving rows of an hourly file's test split with horizon 10),
    blocks of 10 and 20: from the raw variances the extrapolation fell about 11 % short of the truth, (q + 1)^2 / n;
    each divided by its blocks' shortfall, it is within a few percent."""
    rng = np.random.default_rng(5)
    q, n, block = 9, 450, 10
    got, raw = [], []
    for _ in range(400):
        x = np.convolve(rng.standard_normal(n + q), np.ones(q + 1), "valid")[None, :]
        got.append(interval_variance(x, block)[0])
        v1, v2 = block_variance(x, block)[0], block_variance(x, 2 * block)[0]
        raw.append(max(2 * v2 - v1, v2))
    truth = (q + 1) ** 2 / n
    assert np.mean(raw) < 0.93 * truth
    assert np.mean(got) == pytest.approx(truth, rel=0.05)


def test_block_length() -> None:
    assert block_length(1_000, 1) == 10
    assert block_length(1_001, 1) == 11
    assert block_length(200_000, 100) == 100
    assert block_length(3, 10) == 3
    assert block_length(1, 1) == 1


def test_confidence_quartiles_split_rows_by_confidence() -> None:
    rng = np.random.default_rng(8)
    n = 4_000
    labels = rng.integers(0, 3, n)
    sure = np.arange(n) % 2 == 0
    probs = np.where(sure[:, None], np.eye(3)[labels] * 0.9 + 0.1 / 3, rng.dirichlet([50, 50, 50], n))
    quart = score(inputs(probs, labels), bootstrap=0)["model"]["confidence_quartiles"]
    q = quart["quartiles"]
    assert sum(x["count"] for x in q) == n
    assert quart["edges"] == sorted(quart["edges"])
    assert q[3]["accuracy"] == 1.0 and q[3]["directional_accuracy"] == 1.0
    assert abs(q[0]["accuracy"] - 1 / 3) < 0.06


@pytest.mark.parametrize("case", ["no_moving", "one_class", "single_row", "ties"])
def test_degenerate_inputs_are_json_safe(case: str) -> None:
    rng = np.random.default_rng(9)
    n = 1 if case == "single_row" else 50
    labels = {"no_moving": np.ones(n, int), "one_class": np.full(n, 2), "single_row": np.array([0]),
              "ties": rng.integers(0, 3, n)}[case]
    probs = np.full((n, 3), 1 / 3) if case == "ties" else rng.dirichlet([1, 1, 1], n)
    inp = ScoreInputs(probs=probs, labels=labels, fwd_ret=np.zeros(n), past_ret=np.full(n, np.nan),
                      base_rates=np.array([0.0, 1.0, 0.0]), lr_probs=probs, horizon=3,
                      markets=np.array(["m"] * n))
    s = score(inp, cost_bp=1.0, bootstrap=20)
    json.dumps(s, allow_nan=False)
    assert s["samples"] == n
    if case == "no_moving":
        assert s["model"]["directional_accuracy"] is None and s["model"]["direction_log_loss"] is None
        assert s["model"]["direction_ece"] is None
        assert s["vs_baselines"]["persistence"]["directional_accuracy"] == {"diff": None, "ci95": None}
    if case == "single_row":
        assert s["model"]["pnl"]["sharpe_per_trade"] is None
        assert s["vs_baselines"]["base_rates"]["log_loss"]["ci95"][0] == s["vs_baselines"]["base_rates"][
            "log_loss"]["diff"]
    if case == "ties":
        assert s["model"]["pnl"]["trades"] == 0 and s["model"]["pnl"]["hit_rate"] is None
        assert s["model"]["directional_accuracy"] == 0.5
    assert len(cumulative_pnl(inp)["model"]) == n


def test_per_market_table_and_json() -> None:
    rng = np.random.default_rng(10)
    n = 300
    labels = rng.integers(0, 3, n)
    markets = np.array(["BTC-USD"] * 200 + ["<x>&y"] * 100)
    s = score(inputs(np.eye(3)[labels] * 0.7 + 0.1, labels, markets=markets), bootstrap=10)
    table = s["per_market"]["table"]
    assert [r["market"] for r in table] == ["BTC-USD", "<x>&y"]
    assert [r["samples"] for r in table] == [200, 100]
    assert all(r["accuracy"] == 1.0 for r in table)
    json.dumps(s, allow_nan=False)


def test_score_rejects_bad_input() -> None:
    labels = np.array([0, 1, 2])
    good = inputs(np.full((3, 3), 1 / 3), labels)
    with pytest.raises(ValueError):
        score(ScoreInputs(**{**good.__dict__, "labels": np.array([0, 1, 3])}))
    with pytest.raises(ValueError):
        score(ScoreInputs(**{**good.__dict__, "probs": np.full((3, 2), 0.5)}))
    with pytest.raises(ValueError):
        score(ScoreInputs(**{**good.__dict__, "fwd_ret": np.array([0.0, np.nan, 0.0])}))
    with pytest.raises(ValueError):
        score(ScoreInputs(**{**good.__dict__, "horizon": 0}))
    with pytest.raises(ValueError):
        score(ScoreInputs(**{**good.__dict__, "labels": np.zeros(0, int), "probs": np.zeros((0, 3))}))
    with pytest.raises(ValueError):
        score(good, cost_bp=-1.0)


def test_a_model_serving_the_base_rates_up_to_rounding_is_no_difference() -> None:
    """A model without an edge serves softmax(log base rates), the baseline (counts + 1) / (n + 3): the two differ
    by rounding only (~1e-16 nats a row). That must read as no difference, not as an interval excluding 0 that
    says the model is significantly better (or worse) than the base rates."""
    from cerebellar_norse.training.calibration import apply_head, base_rates, prior_head

    counts = np.array([4907, 4430, 1539])  # counts whose softmax(log p) rounds above p for every class
    head = prior_head(counts)
    served = apply_head(np.zeros((1, 3)), head.gain, head.bias)[0]
    base = base_rates(counts)
    assert (-np.log(served) + np.log(base / base.sum()) < 0).all()  # the rounding the test is about
    rng = np.random.default_rng(2)
    labels = rng.choice(3, size=3000, p=base / base.sum())
    s = score(inputs(np.tile(served, (3000, 1)), labels, rng, base_rates=base, horizon=5), bootstrap=100)
    for figure, cell in s["vs_baselines"]["base_rates"].items():
        assert cell["diff"] == 0.0 and cell["ci95"] == [0.0, 0.0], (figure, cell)


def _noise_inputs(seed: int, n: int = 20_000, follow: float = 0.5) -> ScoreInputs:
    """Labels 30 % down / 40 % flat / 30 % up; a moving label follows the previous return's sign with probability
    ``follow`` (0.5: no rule has skill); the model serves the base rates (no skill at all)."""
    rng = np.random.default_rng(seed)
    past = rng.standard_normal(n) * 1e-3
    moving = rng.random(n) < 0.6
    same = rng.random(n) < follow
    up = np.where(same, past > 0, past <= 0)
    labels = np.where(moving, np.where(up, 2, 0), 1)
    fwd = np.where(labels == 2, 1e-3, np.where(labels == 0, -1e-3, 0.0))
    br = np.array([0.3, 0.4, 0.3])
    return ScoreInputs(probs=np.tile(br, (n, 1)), labels=labels, fwd_ret=fwd, past_ret=past, base_rates=br, horizon=1)


def test_rules_without_skill_are_no_bar_a_forecast_without_skill_clears() -> None:
    """A fixed 0.6/0.4 split lost about 0.02 nats of direction log loss to any calibrated forecast on noise, so a model
    with no skill "beat" persistence and always_up with intervals excluding 0; the fitted tilt is the rule's best."""
    for seed in range(3):
        s = score(_noise_inputs(seed), bootstrap=300, seed=seed)
        for rule in ("persistence", "mean_reversion", "always_up"):
            assert s["rule_tilts"][rule] < 0.02, s["rule_tilts"]
            diff = s["vs_baselines"][rule]["direction_log_loss"]
            assert diff["diff"] > -1e-3, (seed, rule, diff)  # was about -0.02 with the fixed split
            assert diff["ci95"][1] >= 0.0, (seed, rule, diff)  # no-skill model is not "better" than the rule


def test_a_rule_with_skill_gets_its_tilt_and_beats_the_base_rates() -> None:
    inp = _noise_inputs(7, follow=0.62)
    tilts = rule_tilts(inp.past_ret, inp.labels)
    assert tilts["persistence"] == pytest.approx(0.12, abs=0.015)
    assert tilts["mean_reversion"] == 1e-6  # wrong more often than not: no tilt beyond keeping its direction
    s = score(inp, bootstrap=300)
    diff = s["vs_baselines"]["persistence"]["direction_log_loss"]
    assert diff["ci95"][0] > 0.0, diff  # the base-rate forecast is worse than the rule that has an edge
    assert s["baselines"]["persistence"]["directional_accuracy"] == pytest.approx(0.62, abs=0.02)
    assert s["baselines"]["mean_reversion"]["directional_accuracy"] == pytest.approx(0.38, abs=0.02)


@pytest.mark.parametrize(("m", "block"), [(20, 10), (30, 15), (30, 10), (39, 10)])
def test_interval_of_a_short_series_keeps_its_spread(m: int, block: int) -> None:
    """Blocks of twice the length as long as the series have one start: every resample was the series' mean, and a
    zero-width interval excluded 0 (``score`` on 20 rows of horizon 10). Short series get the plain blocks' variance,
    divided by the blocks' shortfall."""
    x = np.random.default_rng(4).standard_normal((1, m)) + 0.3
    shortfall = evaluation._block_shortfall(m, block)
    assert 0 < shortfall < 0.75
    plain = block_variance(x, block)
    assert plain[0] > 0
    np.testing.assert_allclose(interval_variance(x, block), plain / shortfall, rtol=1e-12)
    s = score(informative(np.random.default_rng(1), 20), bootstrap=300, seed=1)  # horizon 5: block 5, 4 blocks
    short = score(ScoreInputs(**{**vars(informative(np.random.default_rng(1), 20)), "horizon": 10}), bootstrap=300, seed=1)
    for result in (s, short):
        for name, cells in result["vs_baselines"].items():
            for metric, cell in cells.items():
                if cell["ci95"] is not None and cell["diff"] != 0.0:
                    lo, hi = cell["ci95"]
                    assert lo < hi, (name, metric, cell)


def whole_array_block_bootstrap(series: np.ndarray, block: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Means (k, resamples) of moving-block resamples of each row of ``series`` (k, m), drawn from the (k, N) array of
    every block's sum: ceil(m / block) blocks a resample, starts uniform over the N = m − block + 1 (paired)."""
    k, m = series.shape
    n_blocks = math.ceil(m / block)
    prefix = np.zeros((k, m + 1))
    np.cumsum(series, axis=1, out=prefix[:, 1:])
    sums = prefix[:, block:] - prefix[:, :m - block + 1]
    starts = rng.integers(0, m - block + 1, size=(resamples, n_blocks))
    return sums[:, starts].sum(axis=2) / (n_blocks * block)


def whole_array_block_variance(series: np.ndarray, block: int) -> np.ndarray:
    """The variance (k,) of those resample means, exactly: the variance of the N block sums / (k_blocks · block²)."""
    m = series.shape[1]
    sums = np.stack([np.convolve(row, np.ones(block), "valid") for row in series])
    return sums.var(axis=1) / (math.ceil(m / block) * block * block)


@pytest.mark.parametrize(("k", "m", "block"), [(1, 5_000, 17), (3, 20_000, 30), (12, 9_001, 21), (2, 9, 9), (2, 10, 9)])
def test_block_variance_is_the_exact_variance_of_the_resample_means(k: int, m: int, block: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The intervals' variance is the moving-block bootstrap's, computed exactly: the variance of the block sums over
    every start / (blocks a resample · block²), from the prefix sums a few thousand elements at a time (several
    passes here), whatever the rows' magnitudes; 20,000 resamples drawn come within Monte-Carlo error of it."""
    rng = np.random.default_rng(k * m)
    series = rng.standard_normal((k, m)) * np.exp(3.0 * rng.standard_normal((k, m)))
    monkeypatch.setattr(evaluation, "_VARIANCE_CHUNK", 3_000)
    got = block_variance(series, block)
    np.testing.assert_allclose(got, whole_array_block_variance(series, block), rtol=1e-9)
    if m - block + 1 > 1:
        drawn = whole_array_block_bootstrap(series, block, 20_000, np.random.default_rng(1)).var(axis=1)
        np.testing.assert_allclose(drawn, got, rtol=0.06)
    else:  # one start: every resample is the series' mean
        assert got == pytest.approx(np.zeros(k), abs=1e-12 * np.abs(series).sum())


def whole_array_vs_baselines(inp: ScoreInputs) -> dict[str, dict[str, object]]:
    """``vs_baselines`` from every baseline's per-row contributions stacked into one (k, m) array per metric group, the
    intervals made from every block's sum: point ± t·√(2·v(2b) − v(b)), each v divided by its shortfall."""
    c = evaluation._check(inp)
    _, model = evaluation._evaluate(c.probs, c, 0.0)
    probs = baseline_probs(c.base_rates, c.past_ret, rule_tilts(c.past_ret, c.labels))
    if c.lr_probs is not None:
        probs["logistic"] = c.lr_probs
    rows = {name: evaluation._evaluate(p, c, 0.0)[1] for name, p in probs.items()}
    block_all = block_length(c.labels.shape[0], c.horizon)
    out: dict[str, dict[str, object]] = {name: {} for name in rows}
    for fields in (("log_loss", "correct"), ("direction_log_loss", "direction_correct")):
        keys = [(name, f) for name in rows for f in fields]
        series = np.vstack([getattr(model, f) - getattr(rows[name], f) for name, f in keys])
        series[np.abs(series) < evaluation.ROUNDING] = 0.0
        point = series.mean(axis=1)
        block = min(block_all, series.shape[1])
        m = series.shape[1]
        assert 4 * block <= m
        v_short = whole_array_block_variance(series, block) / evaluation._block_shortfall(m, block)
        v_long = whole_array_block_variance(series, 2 * block) / evaluation._block_shortfall(m, 2 * block)
        half = evaluation.student_t_quantile(0.975, 3 * m / (8 * block)) * np.sqrt(np.maximum(2 * v_long - v_short,
                                                                                              v_long))
        for j, (name, f) in enumerate(keys):
            metric = {"correct": "accuracy", "direction_correct": "directional_accuracy"}.get(f, f)
            out[name][metric] = {"diff": float(point[j]), "ci95": [float(point[j] - half[j]), float(point[j] + half[j])]}
    return out


def test_vs_baselines_reduced_baseline_by_baseline_equal_the_whole_array_computation() -> None:
    """``score`` reduces each baseline's per-row differences as it goes and takes block sums from prefix sums; the
    figures are those of the stacked arrays of every block's sum (to rounding), whatever the resamples and seed."""
    inp = informative(np.random.default_rng(11), 30_000)
    want = whole_array_vs_baselines(inp)
    for resamples, seed in ((200, 4), (1_000, 9)):
        got = score(inp, bootstrap=resamples, seed=seed)["vs_baselines"]
        assert got.keys() == want.keys()
        for name, cells in want.items():
            for metric, cell in cells.items():
                assert got[name][metric]["diff"] == pytest.approx(cell["diff"], rel=1e-12, abs=1e-15)
                assert got[name][metric]["ci95"] == pytest.approx(cell["ci95"], rel=1e-9, abs=1e-12), (name, metric)


def test_score_holds_no_stacked_copies_of_the_per_row_differences() -> None:
    """The memory ``score`` allocates at its peak (numpy arrays included, traced by tracemalloc) per scored row: the
    per-row differences of every baseline are reduced as each is scored, not stacked and copied (which took more than
    550 bytes a row without intervals and 700 with them)."""
    import tracemalloc

    n = 300_000
    peaks = {}
    for resamples in (0, 20):
        inp = informative(np.random.default_rng(5), n)
        tracemalloc.start()
        try:
            score(inp, bootstrap=resamples)
            peaks[resamples] = tracemalloc.get_traced_memory()[1] / n
        finally:
            tracemalloc.stop()
    assert peaks[0] < 350, peaks
    assert peaks[20] < 500, peaks


def test_the_logistic_baseline_of_a_few_hundred_rows_is_not_overfitted() -> None:
    """The logistic baseline fitted on a daily file's few hundred scored ticks of the 48 mossy inputs: its penalty
    is chosen by cross-validation in time, so on inputs without signal it scores about ln 3 on new rows, not the
    2-3.5 nats of the weakest penalty that made any model "beat" it with an interval far below 0."""
    from types import SimpleNamespace

    from cerebellar_norse.training.scoring import _fit_on

    rng = np.random.default_rng(5)
    mossy = rng.random((600, 48)).astype(np.float32)
    labels = rng.integers(0, 3, 600)
    market = SimpleNamespace(mossy=mossy)
    fitted = _fit_on([market], [np.arange(300)], [labels[:300]])  # type: ignore[list-item]
    assert fitted is not None
    p = fitted.predict_proba(mossy[300:].astype(np.float64))
    held_out = float(-np.log(p[np.arange(300), labels[300:]]).mean())
    assert held_out < math.log(3) + 0.02
    weakest = fit_logistic(mossy[:300].astype(np.float64), labels[:300]).predict_proba(mossy[300:].astype(np.float64))
    assert float(-np.log(weakest[np.arange(300), labels[300:]]).mean()) > 1.3  # what it was


def book_by_hand(signs: list[float], fwd: list[float], horizon: int, cost_bp: float,
                 spans: list[int] | None = None) -> tuple[float, float, float]:
    """(gross bp, turnover, costs bp) of one market's book, tick by tick: the position at each tick is the sum of the
    trades open then (sign / horizon each, opened at their row, closed ``span`` ticks later)."""
    k = len(signs)
    spans = spans or [horizon] * k
    ticks = k + max(spans) + 1
    position = [sum(s / horizon for i, s in enumerate(signs) if i <= t < i + spans[i]) for t in range(ticks)]
    turnover = sum(abs(b - a) for a, b in zip([0.0, *position], position, strict=False))
    gross = sum(s * r for s, r in zip(signs, fwd, strict=True)) / horizon
    return gross * 1e4, turnover, cost_bp / 2 * turnover


@pytest.mark.parametrize("horizon", [1, 3])
def test_costs_are_paid_on_each_markets_turnover(horizon: int) -> None:
    """Two markets interleaved, each with flips and holds: every market's book is its own, trades netting against
    each other cost nothing, and the costs are cost_bp / 2 per unit of position bought or sold."""
    # P(up) − P(down) signs: A holds long, flips short, holds, goes flat, long again; B holds short, then long
    signs = {"A": [1, 1, 1, -1, -1, 0, 1, 1], "B": [-1, -1, -1, -1, 1, 1, 1]}
    rng = np.random.default_rng(3)
    fwd = {m: list(rng.normal(0, 1e-3, len(s))) for m, s in signs.items()}
    order = ["A", "B", "B", "A", "A", "B", "A", "B", "A", "A", "B", "B", "A", "B", "A"]  # rows interleaved in time
    seen = {"A": 0, "B": 0}
    rows = []
    for m in order:
        rows.append((m, signs[m][seen[m]], fwd[m][seen[m]]))
        seen[m] += 1
    sign = np.array([s for _, s, _ in rows], dtype=float)
    probs = np.tile([0.3, 0.4, 0.3], (len(rows), 1))
    probs[:, 2] += 0.1 * sign
    probs[:, 0] -= 0.1 * sign
    inp = ScoreInputs(probs=probs, labels=np.where(sign > 0, 2, 0), fwd_ret=np.array([r for _, _, r in rows]),
                      past_ret=np.full(len(rows), np.nan), base_rates=np.array([0.3, 0.4, 0.3]), horizon=horizon,
                      markets=np.array([m for m, _, _ in rows]))
    s = score(inp, cost_bp=2.0, bootstrap=0)
    hand = {m: book_by_hand(signs[m], fwd[m], horizon, 2.0) for m in signs}
    pnl = s["model"]["pnl"]
    assert pnl["gross_bp"] == pytest.approx(sum(h[0] for h in hand.values()))
    assert pnl["turnover"] == pytest.approx(sum(h[1] for h in hand.values()))
    assert pnl["costs_bp"] == pytest.approx(sum(h[2] for h in hand.values()))
    assert pnl["total_bp"] == pytest.approx(pnl["gross_bp"] - pnl["costs_bp"])
    per_market = {r["market"]: r for r in s["per_market"]["table"]}
    for m, (gross, _, costs) in hand.items():
        assert per_market[m]["costs_bp"] == pytest.approx(costs)
        assert per_market[m]["total_bp"] == pytest.approx(gross - costs)
    if horizon == 1:  # the usual |pos_t − pos_{t−1}| turnover, opening and closing included
        assert pnl["turnover"] == pytest.approx(1 + 2 + 1 + 1 + 1 + 1 + 2 + 1)
    assert cumulative_pnl(inp, cost_bp=2.0)["model"][-1] == pytest.approx(pnl["total_bp"])
    # charged per tick as before, every trade would pay: 15 trades a round trip each (of size 1 / horizon)
    assert pnl["costs_bp"] < 14 * 2.0 / horizon


def test_trades_of_a_horizon_in_time_close_when_their_span_ends() -> None:
    """With a horizon in ms each row's trade is held its own span of ticks: the book closes each when it ends."""
    sign, spans = [1.0, 1.0, -1.0, 1.0], [2, 3, 1, 2]
    fwd = [1e-3, -2e-3, 5e-4, 1e-3]
    probs = np.tile([0.3, 0.4, 0.3], (4, 1))
    probs[:, 2] += 0.1 * np.array(sign)
    probs[:, 0] -= 0.1 * np.array(sign)
    inp = ScoreInputs(probs=probs, labels=np.array([2, 0, 2, 2]), fwd_ret=np.array(fwd), past_ret=np.full(4, np.nan),
                      base_rates=np.array([0.3, 0.4, 0.3]), horizon=2, spans=np.array(spans))
    pnl = score(inp, cost_bp=1.0, bootstrap=0)["model"]["pnl"]
    gross, turnover, costs = book_by_hand(sign, fwd, 2, 1.0, spans)
    assert (pnl["gross_bp"], pnl["turnover"], pnl["costs_bp"]) == pytest.approx((gross, turnover, costs))
    with pytest.raises(ValueError, match="spans"):
        score(ScoreInputs(**{**inp.__dict__, "spans": np.array([2, 0, 1, 2])}))


def test_always_long_pays_its_round_trip_once_per_market() -> None:
    n = 400
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 3, n)
    for horizon in (1, 10):
        s = score(inputs(np.tile([0.2, 0.3, 0.5], (n, 1)), labels, rng, horizon=horizon,
                         markets=np.array(["A", "B"] * (n // 2))), cost_bp=3.0, bootstrap=0)
        for pnl in (s["model"]["pnl"], s["model"]["always_long"], s["model"]["always_short"],
                    s["baselines"]["always_up"]["pnl"]):
            assert pnl["turnover"] == pytest.approx(4.0)  # in and out of each market's book: buy and hold, twice
            assert pnl["costs_bp"] == pytest.approx(2 * 3.0)
        assert s["model"]["pnl"]["total_bp"] == pytest.approx(s["model"]["always_long"]["total_bp"])
        assert s["model"]["pnl"]["vs_always_long"]["diff_bp"] == 0.0
        long, short = s["model"]["always_long"], s["model"]["always_short"]
        assert short["gross_bp"] == pytest.approx(-long["gross_bp"])


def test_pnl_interval_holds_its_point_estimate_and_widens_with_fewer_ticks() -> None:
    widths = {}
    for n in (8_000, 1_000):
        rng = np.random.default_rng(11)
        labels = rng.integers(0, 3, n)
        probs = np.where(np.eye(3)[labels] > 0, 0.4, 0.3)
        probs = np.where(rng.random(n)[:, None] < 0.6, probs, probs[::-1])
        fwd = rng.normal(0, 1e-3, n) + np.where(labels == 2, 3e-4, np.where(labels == 0, -3e-4, 0.0))
        inp = ScoreInputs(probs=probs, labels=labels, fwd_ret=fwd, past_ret=rng.normal(0, 1e-3, n),
                          base_rates=np.full(3, 1 / 3), horizon=5)
        pnl = score(inp, cost_bp=1.0, bootstrap=300)["model"]["pnl"]
        for key in ("total_bp", "net_per_tick_bp", "sharpe_per_trade"):
            lo, hi = pnl[f"{key}_ci95"]
            assert lo < pnl[key] < hi, key
        for key in ("vs_always_long", "vs_always_short"):
            lo, hi = pnl[key]["ci95"]
            assert lo < pnl[key]["diff_bp"] < hi
        lo, hi = pnl["net_per_tick_bp_ci95"]
        widths[n] = hi - lo
    assert widths[1_000] > 2 * widths[8_000]


def _skewed_long(n: int, seed: int) -> tuple[ScoreInputs, np.ndarray]:
    """A model long at every tick (horizon 1, no cost: its net P&L per tick is the tick's return) on independent
    returns of Sharpe ratio 0.5 a tick, skew −2 and kurtosis 9 (a short-volatility seller's: 0.5 − (E − 1), E
    exponential), and those returns."""
    rng = np.random.default_rng(seed)
    x = 1e-3 * (0.5 - (rng.exponential(1.0, n) - 1.0))
    probs = np.tile([0.2, 0.3, 0.5], (n, 1))
    return ScoreInputs(probs=probs, labels=np.where(x > 0, 2, 0), fwd_ret=x, past_ret=rng.normal(0, 1e-3, n),
                       base_rates=np.array([0.3, 0.4, 0.3]), horizon=1), x


def test_pnl_interval_is_the_exact_bootstrap_variance_whatever_the_resamples() -> None:
    """The P&L's interval is its mean ± t·√v, v the moving-block bootstrap's variance computed from every block's sum
    (2·v(2b) − v(b), each over its shortfall), not estimated from resamples: 50 resamples and 3,000, other seeds, give
    the same intervals. Estimated from 400 resamples, the width moved by about ± 7 % from seed to seed, noise that
    made a no-skill model's P&L interval exclude 0 for 7 % of GARCH series of 2,000 ticks, against 5 % nominal."""
    n = 2_000
    inp, x = _skewed_long(n, 2)  # long at every row, horizon 1: the net P&L per row is x
    few, many = score(inp, bootstrap=50, seed=1), score(inp, bootstrap=3_000, seed=2)
    for key in ("total_bp_ci95", "net_per_tick_bp_ci95", "sharpe_per_trade_ci95"):
        assert few["model"]["pnl"][key] == pytest.approx(many["model"]["pnl"][key], rel=1e-12)
    block = few["bootstrap"]["block_length"]
    assert block == block_length(n, 1) == 13
    rows = x[None, :]
    v_short = whole_array_block_variance(rows, block)[0] / evaluation._block_shortfall(n, block)
    v_long = whole_array_block_variance(rows, 2 * block)[0] / evaluation._block_shortfall(n, 2 * block)
    half = evaluation.student_t_quantile(0.975, 3 * n / (8 * block)) * math.sqrt(max(2 * v_long - v_short, v_long))
    lo, hi = few["model"]["pnl"]["total_bp_ci95"]
    assert lo == pytest.approx((x.mean() - half) * n * 1e4, rel=1e-9)
    assert hi == pytest.approx((x.mean() + half) * n * 1e4, rel=1e-9)


def test_sharpe_interval_counts_the_sd_uncertainty_as_the_delta_method_does() -> None:
    """For independent returns the Sharpe ratio's variance is (1 − S·skew + S²·(kurtosis − 1)/4) / n (Mertens 2002,
    from the sample moments here, independent of the bootstrap): its interval is S ± t·√that, 1.58 times as wide as
    the mean's interval over the sample sd for these returns (which left the sd's uncertainty out)."""
    n = 50_000
    inp, x = _skewed_long(n, 1)
    s = score(inp, bootstrap=2000, seed=3)
    pnl = s["model"]["pnl"]
    sd = x.std(ddof=1)
    sharpe = x.mean() / sd
    z = (x - x.mean()) / sd
    var = 1.0 - sharpe * np.mean(z ** 3) + sharpe ** 2 * (np.mean(z ** 4) - 1.0) / 4.0
    assert var == pytest.approx(2.5, rel=0.05)
    block = s["bootstrap"]["block_length"]
    assert block == block_length(n, 1) == 37
    t = evaluation.student_t_quantile(0.975, 3 * n / (8 * block))
    half = t * math.sqrt(var / n)
    lo, hi = pnl["sharpe_per_trade_ci95"]
    assert pnl["sharpe_per_trade"] == pytest.approx(sharpe)
    assert lo == pytest.approx(sharpe - half, abs=0.1 * half)
    assert hi == pytest.approx(sharpe + half, abs=0.1 * half)
    mean_lo, mean_hi = pnl["net_per_tick_bp_ci95"]
    assert (hi - lo) / ((mean_hi - mean_lo) / 1e4 / sd) == pytest.approx(math.sqrt(var), rel=0.1)


def test_annualised_sharpe_interval_is_the_per_trade_one_scaled() -> None:
    n = 4_000
    inp, _ = _skewed_long(n, 2)
    hours = np.arange(n, dtype=np.float64) * 3_600_000.0
    s = score(ScoreInputs(**{**vars(inp), "times_ms": hours}), bootstrap=300, seed=1)
    pnl, per_year = s["model"]["pnl"], s["annualisation"]["horizons_per_year"]
    assert per_year
    lo, hi = pnl["sharpe_per_trade_ci95"]
    assert lo < pnl["sharpe_per_trade"] < hi
    assert pnl["sharpe_annualised_ci95"] == pytest.approx([lo * math.sqrt(per_year), hi * math.sqrt(per_year)])


def test_sharpe_is_annualised_by_the_span_of_the_scored_ticks() -> None:
    n = 2_000
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 3, n)
    probs = np.eye(3)[labels] * 0.5 + 0.5 / 3
    hour = 3_600_000
    long = score(inputs(probs, labels, rng, horizon=4, times_ms=np.arange(n) * float(hour)), cost_bp=1.0, bootstrap=50)
    ann = long["annualisation"]
    per_year = (n / 4) / ((n - 1) / 24 / 365.25)  # non-overlapping horizons a year of the file's own calendar
    assert ann["horizons_per_year"] == pytest.approx(per_year) and ann["span_days"] == pytest.approx((n - 1) / 24)
    assert "annualised by the square root of" in ann["note"]
    pnl = long["model"]["pnl"]
    assert pnl["sharpe_annualised"] == pytest.approx(pnl["sharpe_per_trade"] * math.sqrt(per_year))
    assert pnl["sharpe_annualised_ci95"][0] == pytest.approx(pnl["sharpe_per_trade_ci95"][0] * math.sqrt(per_year))
    # the same ticks a minute apart span 33 hours: too short a span to say what a year holds
    short = score(inputs(probs, labels, rng, horizon=4, times_ms=np.arange(n) * 60_000.0), cost_bp=1.0, bootstrap=50)
    assert short["model"]["pnl"]["sharpe_annualised"] is None and short["model"]["pnl"]["sharpe_annualised_ci95"] is None
    assert short["annualisation"]["horizons_per_year"] is None and "under 30" in short["annualisation"]["note"]
    # daily ticks over a year but fewer than 20 horizons of 20 days
    few = score(inputs(probs[:300], labels[:300], rng, horizon=20, times_ms=np.arange(300) * 86_400_000.0),
                bootstrap=0)
    assert few["model"]["pnl"]["sharpe_annualised"] is None and "fewer than 20" in few["annualisation"]["note"]
    untimed = score(inputs(probs, labels, rng, horizon=4), bootstrap=0)
    assert untimed["model"]["pnl"]["sharpe_annualised"] is None and "not known" in untimed["annualisation"]["note"]


def test_markets_scored_over_different_periods_are_annualised_each_over_its_own_span() -> None:
    # A: 2,000 hourly ticks in 2017; B: 2,000 daily ticks from 2004 on; C: 40 hourly ticks, under 30 days
    rng = np.random.default_rng(3)
    hour, day = 3_600_000.0, 86_400_000.0
    t_a = 1_483_228_800_000.0 + np.arange(2_000) * hour
    t_b = 1_072_915_200_000.0 + np.arange(2_000) * day
    t_c = 1_483_228_800_000.0 + np.arange(40) * hour
    times = np.concatenate([t_b, t_a, t_c])
    markets = np.array(["B"] * 2_000 + ["A"] * 2_000 + ["C"] * 40)
    n = times.shape[0]
    labels = rng.integers(0, 3, n)
    probs = np.eye(3)[labels] * 0.5 + 0.5 / 3
    out = score(inputs(probs, labels, rng, horizon=10, times_ms=times, markets=markets), cost_bp=1.0, bootstrap=50)
    ann = out["annualisation"]
    whole = (times.max() - times.min()) / day
    own_a = 200 / (1_999 / 24 / 365.25)  # A's horizons a year of its own 83 days, not of the 13 years of all three
    own_b = 200 / (1_999 / 365.25)
    pooled_c = 4 / (whole / 365.25)  # C cannot tell its own rate: counted over the whole span, as before
    assert ann["horizons_per_year"] == pytest.approx(own_a + own_b + pooled_c)
    assert ann["span_days"] == pytest.approx(whole)
    assert ann["markets"]["A"]["horizons_per_year"] == pytest.approx(own_a) and ann["markets"]["A"]["own_span"]
    assert not ann["markets"]["C"]["own_span"]
    assert "summed over the 3 markets" in ann["note"] and "A 877.0 (200 over 83 days)" in ann["note"]
    assert "1 market spanning under 30 days or holding fewer than 20 horizons counted over the whole span" in ann["note"]
    pnl = out["model"]["pnl"]
    assert pnl["sharpe_annualised"] == pytest.approx(pnl["sharpe_per_trade"] * math.sqrt(own_a + own_b + pooled_c))
    # markets scored over one period: each market's own span is the whole span, as pooled before
    same = score(inputs(probs[:4_000], labels[:4_000], rng, horizon=10, times_ms=np.concatenate([t_a, t_a]),
                        markets=markets[:4_000]), bootstrap=0)
    assert same["annualisation"]["horizons_per_year"] == pytest.approx(400 / (1_999 / 24 / 365.25))


def _walk_inputs(seed: int, n: int, horizon: int) -> ScoreInputs:
    """One market's random walk scored with a no-skill momentum lean (its own past return's sign), every minute."""
    rng = np.random.default_rng(seed)
    price = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 1e-3, n + 2 * horizon)))
    times = 1_700_000_000_000 + 60_000 * np.arange(price.size)
    lab = label_series(times, price, LabelSpec(horizon_ticks=horizon))
    past = past_returns(price, lab.end)
    rows = np.arange(horizon, horizon + n)
    base = np.array([0.33, 0.34, 0.33])
    view = np.sign(past[rows])
    probs = np.tile(base, (n, 1))
    probs[:, 2], probs[:, 0] = 0.33 + 0.05 * view, 0.33 - 0.05 * view
    return ScoreInputs(probs, lab.labels[rows], lab.fwd_ret[rows], past[rows], base, None, horizon,
                       np.array(["M"] * n, dtype=object), times[rows].astype(np.float64))


def test_markets_of_one_period_are_not_counted_as_independent_evidence() -> None:
    # four markets that move together (here: four copies of one series, as one index's ETFs or one pair's feeds) hold
    # the evidence of one market, not four: the total P&L is four times one market's, and so is its uncertainty; the
    # mean differences are one market's, and so are their intervals. Blocks cut from the markets one after another
    # scored them as independent: intervals half as wide as the evidence allows.
    n, h, k = 3_000, 20, 4
    one = _walk_inputs(11, n, h)
    cat = np.concatenate
    copies = ScoreInputs(cat([one.probs] * k), cat([one.labels] * k), cat([one.fwd_ret] * k), cat([one.past_ret] * k),
                         one.base_rates, None, h, cat([np.array([f"M{i}"] * n, dtype=object) for i in range(k)]),
                         cat([one.times_ms] * k))
    single, several = score(one, cost_bp=1.0, bootstrap=1), score(copies, cost_bp=1.0, bootstrap=1)

    def half(ci: list[float]) -> float:
        return (ci[1] - ci[0]) / 2

    pnl_1, pnl_k = single["model"]["pnl"], several["model"]["pnl"]
    assert pnl_k["total_bp"] == pytest.approx(k * pnl_1["total_bp"])
    assert half(pnl_k["total_bp_ci95"]) == pytest.approx(k * half(pnl_1["total_bp_ci95"]), rel=0.1)
    assert half(pnl_k["vs_always_long"]["ci95"]) == pytest.approx(k * half(pnl_1["vs_always_long"]["ci95"]), rel=0.1)
    for metric in ("direction_log_loss", "directional_accuracy", "log_loss"):
        cell_1, cell_k = single["vs_baselines"]["base_rates"][metric], several["vs_baselines"]["base_rates"][metric]
        assert cell_k["diff"] == pytest.approx(cell_1["diff"])
        assert half(cell_k["ci95"]) == pytest.approx(half(cell_1["ci95"]), rel=0.1)
    assert several["bootstrap"]["horizon_rows"] == k * h and several["bootstrap"]["time_ordered"]
    assert single["bootstrap"]["horizon_rows"] == h and not single["bootstrap"]["time_ordered"]
    assert several["bootstrap"]["degrees_of_freedom"]["all_rows"] == pytest.approx(
        single["bootstrap"]["degrees_of_freedom"]["all_rows"])
    assert "(about 150 non-overlapping horizons of time, every market's ticks in one horizon counted once)" in format_summary(
        several)
    assert "about 150 non-overlapping horizons)" in format_summary(single)


def test_markets_of_successive_periods_keep_their_blocks() -> None:
    # a file a month read as a market each: the rows are in time order already, the blocks are one market's
    n, h = 2_000, 10
    a, b = _walk_inputs(12, n, h), _walk_inputs(13, n, h)
    later = b.times_ms + (a.times_ms[-1] - b.times_ms[0]) + 60_000
    cat = np.concatenate
    two = ScoreInputs(cat([a.probs, b.probs]), cat([a.labels, b.labels]), cat([a.fwd_ret, b.fwd_ret]),
                      cat([a.past_ret, b.past_ret]), a.base_rates, None, h,
                      np.array(["A"] * n + ["B"] * n, dtype=object), cat([a.times_ms, later]))
    s = score(two, cost_bp=1.0, bootstrap=1)
    assert s["bootstrap"]["horizon_rows"] == h
    assert s["bootstrap"]["block_length"] == block_length(2 * n, h)
