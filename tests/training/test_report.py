"""Reports of an evaluation: the terminal table and the self-contained HTML page."""

from __future__ import annotations

import base64
import html
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from cerebellar_norse.training.evaluation import ScoreInputs, bid_ask_bounce, cumulative_pnl, score
from cerebellar_norse.training.report import format_summary, headline, pnl_lines, render_html, verdict

IMG = '<img src="data:image/png;base64,'
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def evaluated() -> tuple[dict, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    n = 3_000
    labels = rng.integers(0, 3, n)
    probs = np.where(rng.random(n)[:, None] < 0.4, np.eye(3)[labels] * 0.6 + 0.4 / 3, rng.dirichlet([4, 4, 4], n))
    fwd = np.where(labels == 2, 1e-3, np.where(labels == 0, -1e-3, 0.0)) + rng.normal(0, 2e-4, n)
    markets = np.array(["BTC-USD", "<b>evil</b>&co"])[np.arange(n) % 2]
    inp = ScoreInputs(probs=probs, labels=labels, fwd_ret=fwd, past_ret=rng.normal(0, 1e-3, n),
                      base_rates=np.array([0.3, 0.4, 0.3]), lr_probs=rng.dirichlet([30, 30, 30], n), horizon=4,
                      markets=markets)
    return score(inp, cost_bp=0.5, bootstrap=100), cumulative_pnl(inp, cost_bp=0.5)


CURVE = [{"epoch": 1, "train_loss": 1.0912, "validation": {"loss": 1.0871, "accuracy": 0.4}},
         {"epoch": 2, "train_loss": 1.0533, "validation": {"loss": 1.0702, "accuracy": 0.42}}]


def images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_html_is_self_contained_with_every_plot(evaluated: tuple[dict, dict[str, np.ndarray]]) -> None:
    summary, cum = evaluated
    page = render_html(summary, cum, CURVE)
    assert page.count(IMG) == 4
    pngs = images(page)
    assert len(pngs) == 4 and all(p.startswith(PNG_MAGIC) for p in pngs)
    lowered = page.lower()
    for forbidden in ("http://", "https://", "<script", "<link", "@import", "url("):
        assert forbidden not in lowered
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")


def test_html_shows_the_metric_values(evaluated: tuple[dict, dict[str, np.ndarray]]) -> None:
    summary, cum = evaluated
    page = render_html(summary, cum, CURVE)
    model = summary["model"]
    for key in ("accuracy", "directional_accuracy", "log_loss", "direction_log_loss", "brier", "ece"):
        assert f"<td>{model[key]:.4f}</td>" in page
    for name, metrics in summary["baselines"].items():
        assert f"<td>{name}</td>" in page
        assert f"<td>{metrics['log_loss']:.4f}</td>" in page
    assert f"<td>{model['pnl']['total_bp']:.2f}</td>" in page
    assert f"<td>{model['always_long']['total_bp']:.2f}</td>" in page
    cell = summary["vs_baselines"]["logistic"]["log_loss"]
    assert f"{cell['diff']:+.4f} [{cell['ci95'][0]:+.4f}, {cell['ci95'][1]:+.4f}]" in page
    assert "<td>1.0871</td>" in page  # learning-curve validation loss
    assert f"<td>{model['confusion'][0][0]}</td>" in page


def test_html_escapes_strings(evaluated: tuple[dict, dict[str, np.ndarray]]) -> None:
    summary, _ = evaluated
    page = render_html(summary, title="report <i>x</i> & more")
    assert "&lt;b&gt;evil&lt;/b&gt;&amp;co" in page
    assert "<b>evil" not in page
    assert "<title>report &lt;i&gt;x&lt;/i&gt; &amp; more</title>" in page
    assert "<i>x</i>" not in page


def test_html_skips_absent_plots(evaluated: tuple[dict, dict[str, np.ndarray]]) -> None:
    summary, _ = evaluated
    page = render_html(summary, None, [])
    assert page.count(IMG) == 2  # reliability and confusion only
    assert "Learning curve" not in page


@pytest.mark.parametrize("history", [
    5, {"epoch": 1}, "epochs",  # not a list
    [{"epoch": 1, "train_loss": 1.0, "validation": [1]}],  # an epoch's validation not an object
    [{"epoch": "one", "train_loss": "x", "validation": {"loss": None}}, 7, {"epoch": True, "train_loss": float("nan")}],
], ids=["int", "object", "string", "validation a list", "odd values"])
def test_html_of_a_stored_history_that_is_not_a_learning_curve(evaluated: tuple[dict, dict[str, np.ndarray]],
                                                              history: object) -> None:
    """``evaluate --report`` passes the stored model's metrics.json "history" as it is: an int or an epoch whose
    validation was a list ended the command in a traceback (TypeError, AttributeError)."""
    summary, cum = evaluated
    page = render_html(summary, cum, history)  # type: ignore[arg-type]
    assert page.startswith("<!DOCTYPE html>") and page.count(IMG) in (3, 4)


def test_html_of_a_degenerate_summary() -> None:
    inp = ScoreInputs(probs=np.array([[0.2, 0.5, 0.3]]), labels=np.array([1]), fwd_ret=np.zeros(1),
                      past_ret=np.full(1, np.nan), base_rates=np.array([0.2, 0.6, 0.2]), horizon=1)
    summary = score(inp, bootstrap=10)
    page = render_html(summary, cumulative_pnl(inp), CURVE[:1])
    assert page.count(IMG) == 4
    assert "<td>—</td>" in page  # undefined directional metrics


def test_format_summary_table(evaluated: tuple[dict, dict[str, np.ndarray]]) -> None:
    summary, _ = evaluated
    text = format_summary(summary)
    model = summary["model"]
    for name in ("model", "base_rates", "majority", "persistence", "mean_reversion", "always_up", "logistic"):
        assert name in text
    pnl = text.split("\nP&L ", 1)[1].split("\n\n", 1)[0]
    assert "always_long" not in pnl  # the always_up baseline's row is the same trades
    up = next(line for line in pnl.splitlines() if line.startswith("always_up "))
    assert f"{model['always_long']['total_bp']:.2f}" in up
    model_line = next(line for line in text.splitlines() if line.startswith("model "))  # the metrics table
    for key in ("accuracy", "directional_accuracy", "log_loss", "direction_log_loss", "brier", "ece"):
        assert f"{model[key]:.4f}" in model_line
    assert f"{model['recall']['down']:.4f}" in text
    assert f"{model['pnl']['total_bp']:.2f}" in text
    cell = summary["vs_baselines"]["base_rates"]["accuracy"]
    assert f"{cell['diff']:+.4f} [{cell['ci95'][0]:+.4f}, {cell['ci95'][1]:+.4f}]" in text
    assert "samples 3000" in text
    # overlapping horizons: 3000 labels of a 4-tick horizon are about 750 independent ones, and the report says so
    assert "horizon 4 ticks (about 750 non-overlapping horizons)" in text
    assert "horizon 4 ticks (about 750 non-overlapping horizons)" in render_html(summary)


def test_importing_the_report_does_not_import_matplotlib() -> None:
    code = "import sys, cerebellar_norse.training.report; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _scored(skill: float, n: int = 4_000, seed: int = 1, cost_bp: float = 0.0, bootstrap: int = 200,
            right: float = 1.0, noise: float = 1e-4) -> dict:
    """The summary of a model that puts ``skill`` more mass on the true class of random labels at a share ``right``
    of the rows (on the opposite direction elsewhere; 0: noise around the base rates), the P&L of its labels' returns."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    fwd = np.where(labels == 2, 1e-3, np.where(labels == 0, -1e-3, 0.0)) + rng.normal(0, noise, n)
    probs = np.full((n, 3), (1.0 - skill) / 3.0)
    probs[np.arange(n), np.where(rng.random(n) < right, labels, 2 - labels)] += skill
    if skill == 0:
        probs = rng.dirichlet([50, 50, 50], n)  # no skill: noise around the base rates
    inp = ScoreInputs(probs=probs, labels=labels, fwd_ret=fwd, past_ret=rng.normal(0, 1e-3, n),
                      base_rates=np.array([1, 1, 1]) / 3, lr_probs=rng.dirichlet([50, 50, 50], n), horizon=1)
    return score(inp, cost_bp=cost_bp, bootstrap=bootstrap)


def test_verdict_says_what_the_figures_support() -> None:
    skilled = _scored(0.3, cost_bp=1.0)
    assert all(c["direction_log_loss"]["ci95"][1] < 0 for name, c in skilled["vs_baselines"].items()
               if name != "majority")
    v = verdict(skilled)
    assert v["action"] == "trade" and "better than every baseline" in v["reason"]
    assert skilled["model"]["pnl"]["total_bp_ci95"][0] > 0 and "95 % interval) is above 0" in v["reason"]
    # the independent outcomes it rests on, counted as the figures' first line counts them
    assert f"{skilled['moving_samples']} moving labels over about 4000 non-overlapping horizons" in v["reason"]
    assert verdict({**skilled, "edge": "direction"})["action"] == "trade"
    # the same figures in sample, from a model without an edge, without a cost or without intervals: not a trade
    in_sample = verdict({**skilled, "in_sample": {"ticks": 10, "of": 4000, "since": "2020-01-02T00:00:00Z"}})
    assert in_sample["action"] == "do_not_trade" and "--since 2020-01-02T00:00:00Z" in in_sample["reason"]
    assert verdict({**skilled, "edge": "none"})["action"] == "do_not_trade"
    assert verdict({**skilled, "edge": "flat"})["action"] == "do_not_trade"
    free = verdict(_scored(0.3))
    assert free["action"] == "do_not_trade" and "--cost-bp" in free["reason"]
    assert verdict(_scored(0.3, cost_bp=1.0, bootstrap=0))["action"] == "do_not_trade"
    # a market that fell: always short's P&L (always long's mirror, at the same cost) above the model's is no edge
    pnl = skilled["model"]["pnl"]
    fell = {**skilled, "model": {**skilled["model"], "pnl": {**pnl, "vs_always_short": {"diff_bp": -1.0, "ci95": [-9.0, 7.0]}}}}
    short = verdict(fell)
    assert short["action"] == "do_not_trade" and "no better than always short's" in short["reason"]
    costly = verdict(_scored(0.3, cost_bp=50.0))
    assert costly["action"] == "do_not_trade" and "does not pay its costs" in costly["reason"]
    noise = verdict(_scored(0.0, cost_bp=1.0))
    assert noise["action"] == "do_not_trade" and "worse than base_rates" in noise["reason"]


def test_verdict_is_no_trade_while_the_pnl_interval_includes_0() -> None:
    """Better than every baseline on direction log loss, a positive P&L after costs above the constant positions' by
    its point estimates, but returns so noisy that its 95 % interval includes 0: no profit shown, not a trade."""
    for seed in range(1, 40):
        summary = _scored(0.3, seed=seed, cost_bp=1.0, noise=0.03)
        pnl = summary["model"]["pnl"]
        if (pnl["total_bp"] > 0 > pnl["total_bp_ci95"][0] and pnl["vs_always_long"]["diff_bp"] > 0
                and pnl["vs_always_short"]["diff_bp"] > 0):
            break
    else:
        raise AssertionError("no seed gave a positive P&L with an interval including 0")
    v = verdict(summary)
    assert v["action"] == "collect_more_data" and "its 95 % interval includes 0" in v["reason"]
    assert f"{pnl['total_bp']:.2f} bp [" in v["reason"]
    # the same P&L with an interval above 0, and above always short's by its point estimate only, is not a trade
    sure = {**summary, "model": {**summary["model"], "pnl": {**pnl, "total_bp_ci95": [1.0, 2 * pnl["total_bp"]],
                                                              "vs_always_long": {"diff_bp": 5.0, "ci95": [1.0, 9.0]},
                                                              "vs_always_short": {"diff_bp": 5.0, "ci95": [-3.0, 13.0]}}}}
    v = verdict(sure)
    assert v["action"] == "collect_more_data" and "not distinguishable from always short's" in v["reason"]
    assert "always long's" not in v["reason"]


def test_verdict_of_a_hint_too_small_for_its_interval_is_collect_more_data() -> None:
    hint = verdict(_scored(0.1, n=600, cost_bp=1.0, right=0.58))
    assert hint["action"] == "collect_more_data" and "intervals include 0" in hint["reason"]


def test_html_says_what_the_text_says_above_the_figures(evaluated: tuple[dict, dict[str, np.ndarray]]) -> None:
    """The in-sample warning, the no-edge note, the verdict and the data checks the terminal prints above the
    figures are in the HTML report too: a report read alone does not pass in-sample figures off as unseen."""
    summary, cum = evaluated
    summary = {**summary, "edge": "none", "model_version": "20260101T000000Z-abcdef", "labels": "horizon 4 ticks",
               "warmup_ticks": 500, "since": None, "base_rates_from": "the model's training and validation data",
               "in_sample": {"ticks": 2000, "of": 3000, "since": "2020-01-02T00:00:00Z",
                             "message": "2000 of the 3000 scored ticks are from the period <x> the model was trained on"},
               "data_checks": {"EURUSD": ["a gap of 3d 01:00:00 before 2017-12-25T22:00:00Z"]}}
    summary["verdict"] = verdict(summary)
    lines = headline(summary)
    assert [line.split(":", 1)[0] for line in lines] == ["IN SAMPLE", "NO EDGE", "VERDICT"]
    assert lines[2].startswith("VERDICT: do not trade: 2000 of the 3000 scored ticks")
    page = render_html(summary, cum, CURVE)
    for line in lines:
        assert html.escape(line) in page
    assert "EURUSD: a gap of 3d 01:00:00 before 2017-12-25T22:00:00Z" in page
    assert "model 20260101T000000Z-abcdef on 3000 ticks (horizon 4 ticks; first 500 ticks" in page


def _bounce_scored(cost_bp: float, seed: int = 0) -> tuple[dict, np.ndarray, np.ndarray]:
    """A quiet mid (0.5 bp a tick) printed at its bid or ask (3 bp either side, at random): no edge a taker can
    trade. The model leans against the print's side (below or above the last 8 prints' mean), which is right about
    the next prints; its summary at ``cost_bp``, the prints' and the mid's per-tick log returns."""
    rng = np.random.default_rng(seed)
    n, horizon = 6_000, 10
    mid = np.cumsum(rng.normal(0, 0.5e-4, n))
    logp = mid + 3e-4 * rng.choice([-1.0, 1.0], n)
    labels_all = np.full(n, -1)
    fwd_all = np.full(n, np.nan)
    fwd_all[:-horizon] = logp[horizon:] - logp[:-horizon]
    band = 0.43 * np.std(np.diff(logp)) * np.sqrt(horizon)
    labels_all[:-horizon] = np.where(fwd_all[:-horizon] > band, 2, np.where(fwd_all[:-horizon] < -band, 0, 1))
    base = np.bincount(labels_all[100:n // 2 - horizon], minlength=3) / (n // 2 - horizon - 100)
    rows = np.arange(n // 2, n - horizon)
    view = -np.sign(logp[rows] - np.array([logp[r - 8:r].mean() for r in rows]))
    probs = np.tile(base, (rows.size, 1))
    moving = base[0] + base[2]
    probs[:, 2], probs[:, 0] = moving * (0.5 + 0.1 * view), moving * (0.5 - 0.1 * view)
    past = logp[rows] - logp[rows - horizon]
    inp = ScoreInputs(probs=probs, labels=labels_all[rows], fwd_ret=fwd_all[rows], past_ret=past, base_rates=base,
                      horizon=horizon)
    span = slice(rows[0], rows[-1] + 1)
    return (score(inp, cost_bp=cost_bp, bootstrap=200), np.diff(logp[span]), np.diff(mid[span]))


def test_a_bounce_between_bid_and_ask_is_no_trade_below_the_spread_it_implies() -> None:
    """Prints alternating between bid and ask make a direction that leans against the last print right, and at the
    printed prices it earns the half-spread a taker pays: charged a round trip below the spread (here the
    half-spread, 3 bp), the P&L and every interval pass, but it is no trade; the verdict names the spread."""
    summary, prints, mid = _bounce_scored(3.0)
    bounce = bid_ask_bounce([prints])
    assert bounce is not None and bounce["spread_bp"] == pytest.approx(6.0, rel=0.1)
    assert bounce["lag1_autocorrelation"] < -0.4
    # the same figures on prices without a bounce would be a trade: the P&L's gate passes at 3 bp
    assert bid_ask_bounce([mid])["spread_bp"] is None
    assert verdict({**summary, "bounce": bid_ask_bounce([mid])})["action"] == "trade"
    v = verdict({**summary, "bounce": bounce})
    assert v["action"] == "do_not_trade"
    assert "less than the spread its prices imply" in v["reason"] and f"{bounce['spread_bp']:.2f} bp" in v["reason"]
    assert f"--cost-bp {math.ceil(bounce['spread_bp'] * 100) / 100:.2f}" in v["reason"]
    # no cost charged: not a trade, and the reason says what to charge
    free, _, _ = _bounce_scored(0.0)
    v = verdict({**free, "bounce": bounce})
    assert v["action"] == "do_not_trade" and "charges no cost" in v["reason"] and "bounce between bid and ask" in v["reason"]
    # charged the whole spread, the bounce does not pay
    full, _, _ = _bounce_scored(6.5)
    assert verdict({**full, "bounce": bounce})["action"] == "do_not_trade"


def test_the_pnl_lines_say_the_spread_a_bounce_implies() -> None:
    summary, prints, mid = _bounce_scored(3.0)
    lines = pnl_lines({**summary, "bounce": bid_ask_bounce([prints])})
    assert any(line.startswith("bid-ask bounce: the scored prices bounce") and "the 3 bp charged pays less" in line
               for line in lines)
    assert not any("bounce" in line for line in pnl_lines({**summary, "bounce": bid_ask_bounce([mid])}))


def test_a_reversal_in_a_few_large_moves_is_no_bounce() -> None:
    """Daily closes of a liquid index fund: a martingale of 1 % days, but a crash whose big days overreact and turn
    back (−8 % then +7 %, a dozen times). The lag-1 autocovariance is below 0 by more than 1.96 standard errors and
    Roll's estimate would be a spread of tens of bp, but the signs of the moves turn back no more often than a coin's:
    that is no bounce between bid and ask, and no spread is set. A bounce of 3 bp on the same calm days is one."""
    rng = np.random.default_rng(7)
    calm = rng.normal(0.0, 0.01, 2000)
    days = calm.copy()
    for k in range(12):
        days[1000 + 8 * k:1002 + 8 * k] = (-0.08, 0.07)
    assert bid_ask_bounce([calm])["spread_bp"] is None
    crash = bid_ask_bounce([days])
    assert crash["z"] < -1.96 and crash["lag1_autocorrelation"] < -0.05
    assert crash["spread_bp"] is None
    assert crash["reversal_z"] < 1.96
    prints = np.diff(np.cumsum(rng.normal(0.0, 0.5e-4, 2001)) + 3e-4 * rng.choice([-1.0, 1.0], 2001))
    bounce = bid_ask_bounce([prints])
    assert bounce["reversals"] > 0.6 and bounce["spread_bp"] == pytest.approx(6.0, rel=0.1)


def test_a_market_that_bounces_is_not_drowned_by_a_busier_one() -> None:
    """Two markets in one file: prints of a quiet one bouncing between bid and ask 2 bp apart, and a busy one moving
    20 bp a tick at random. Pooled, the busy market's products drown the quiet one's and no bounce shows; each tested
    on its own, the quiet one bounces, the spread to charge is its own (about 2 bp), and the words name it."""
    rng = np.random.default_rng(3)
    n = 1500
    quiet = np.diff(np.cumsum(rng.normal(0.0, 0.3e-4, n + 1)) + 1e-4 * rng.choice([-1.0, 1.0], n + 1))
    busy = rng.normal(0.0, 20e-4, n)
    assert bid_ask_bounce([quiet, busy])["spread_bp"] is None  # pooled only
    bounce = bid_ask_bounce([quiet, busy], ["EURUSD", "BTCUSD"])
    assert list(bounce["markets"]) == ["EURUSD"]
    assert bounce["spread_bp"] == pytest.approx(2.0, rel=0.15) and bounce["pooled_spread_bp"] is None
    assert bounce["market_z"] == pytest.approx(2.2414, abs=1e-3)  # two markets tested as one family at 2.5 %
    summary, _, _ = _bounce_scored(1.5)
    assert verdict({**summary, "bounce": bid_ask_bounce([quiet, busy])})["action"] == "trade"
    v = verdict({**summary, "bounce": bounce})
    assert v["action"] == "do_not_trade" and "of 1 of the markets" in v["reason"] and "EURUSD:" in v["reason"]
    # a market too quiet to show a bounce on its own is not flagged: the markets' test keeps its 2.5 %
    calm = [rng.normal(0.0, 1e-4, 300) for _ in range(40)]
    assert not bid_ask_bounce(calm, [f"M{k}" for k in range(40)])["markets"]
