"""`cerebellar-norse train` and `evaluate` end to end (in process, tiny network, real files)."""

from __future__ import annotations

import html
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from training_helpers import tiny_cli_environ

from cerebellar_norse.cli import main
from cerebellar_norse.config import load_config
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training.checkpoints import ModelStore
from cerebellar_norse.training.data import write_csv
from cerebellar_norse.training.report import verdict


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for k, v in tiny_cli_environ(tmp_path).items():
        monkeypatch.setenv(k, v)
    ticks = generate_ticks(4000, 2, seed=4)
    write_csv(tmp_path / "ticks.csv", ticks)
    return tmp_path


def _json(capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_train_then_evaluate(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    trained = _json(capsys)
    assert trained["activated"] and trained["edge"] in ("none", "flat", "direction")
    assert trained["test"]["samples"] > 0 and "logistic" in trained["test"]["baselines"]
    # the test split's verdict, computed where the model is stored (so jobs and their records carry it too)
    stored = ModelStore(env / "state").load(trained["model_version"]).metrics["test"]
    assert trained["test"]["verdict"] == stored["verdict"] == verdict({**stored, "edge": trained["edge"]})
    assert trained["test"]["verdict"]["action"] != "trade"  # (no cost is charged on the test split)

    assert main(["evaluate", "ticks.csv", "--json", "--bootstrap", "200"]) == 0
    full = _json(capsys)
    assert full["model_version"] == trained["model_version"]
    assert full["samples"] > 1000
    assert set(full["baselines"]) == {"base_rates", "majority", "persistence", "mean_reversion", "always_up", "logistic"}
    for row in full["vs_baselines"].values():
        lo, hi = row["log_loss"]["ci95"]
        assert lo <= row["log_loss"]["diff"] <= hi
    assert full["base_rates_from"] == "the model's training and validation data"
    boot = full["bootstrap"]  # the intervals' small-sample quantile: Student t of 3·rows / (8·block) degrees of freedom
    for rows, count in (("all_rows", full["samples"]), ("moving_rows", full["moving_samples"])):
        assert boot["degrees_of_freedom"][rows] == pytest.approx(3 * count / (8 * boot["block_length"]), abs=0.01)
        assert boot["t_quantile"][rows] > 1.96
    assert main(["evaluate", "ticks.csv", "--json", "--bootstrap", "3"]) == 0
    few = _json(capsys)  # the bootstrap's variance is computed exactly: 3 resamples asked or 200, the same intervals
    assert few["vs_baselines"] == full["vs_baselines"] and few["model"]["pnl"] == full["model"]["pnl"]
    assert few["bootstrap"]["resamples"] == 3 and few["bootstrap"]["degrees_of_freedom"] == boot["degrees_of_freedom"]
    assert sum(full["model"]["confusion"][0]) + sum(full["model"]["confusion"][1]) + sum(full["model"]["confusion"][2]) == full["samples"]
    # the P&L: one book per market, costs on its turnover (always long: one round trip in each of the 2 markets)
    assert main(["evaluate", "ticks.csv", "--json", "--bootstrap", "100", "--cost-bp", "2"]) == 0
    costly = _json(capsys)
    pnl, long = costly["model"]["pnl"], costly["model"]["always_long"]
    assert long["turnover"] == pytest.approx(4.0) and long["costs_bp"] == pytest.approx(4.0)
    assert pnl["total_bp"] == pytest.approx(pnl["gross_bp"] - pnl["costs_bp"])
    assert pnl["costs_bp"] == pytest.approx(pnl["turnover"])  # 2 bp a round trip: 1 bp per unit bought or sold
    assert sum(r["total_bp"] for r in costly["per_market"]["table"]) == pytest.approx(pnl["total_bp"])
    assert pnl["total_bp_ci95"][0] <= pnl["total_bp"] <= pnl["total_bp_ci95"][1]
    assert costly["annualisation"]["note"] and costly["annualisation"]["span_days"] > 0

    mid = datetime.fromtimestamp(generate_ticks(4000, 2, seed=4)[2000]["timestamp"] / 1000, tz=UTC).isoformat()
    report = env / "report.html"
    assert main(["evaluate", "ticks.csv", "--since", mid, "--report", str(report), "--cost-bp", "1"]) == 0
    text = capsys.readouterr().out
    assert "base_rates" in text and "logistic" in text and f"report written to {report}" in text
    assert "model after costs (95% block-bootstrap CI): total " in text and "Sharpe/year: " in text
    assert "intervals: blocks of " in text and " degrees of freedom, t " in text
    mid_utc = datetime.fromisoformat(mid).strftime("%Y-%m-%dT%H:%M:%S")
    assert f"from --since {mid} = {mid_utc}" in text  # the time the ticks were cut at, as the service reads it
    html = report.read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") >= 3 and "http://" not in html and "https://" not in html
    assert "model after costs (95% block-bootstrap CI): total " in html and "Sharpe/year: " in html
    assert "intervals: blocks of " in html and " degrees of freedom, t " in html
    assert main(["evaluate", "ticks.csv", "--since", mid, "--json", "--bootstrap", "0"]) == 0
    later = _json(capsys)
    assert 0 < later["samples"] < full["samples"] and later["cost_bp"] == 0.0
    assert later["since"] == mid and later["since_utc"].startswith(mid_utc) and full["since_utc"] is None
    assert not any(line.startswith("[") for line in capsys.readouterr().err.splitlines())  # no terminal: no stages


def test_evaluate_on_a_terminal_says_what_it_does_next(env: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of millions of ticks is read, stepped and resampled for minutes: on a terminal each stage is said."""
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["evaluate", "ticks.csv", "--bootstrap", "50"]) == 0
    stages = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert len(stages) == 3 and stages[0].endswith("] reading 1 file(s)"), stages
    assert " over 4,000 ticks of 2 market(s), with bootstrap intervals" in stages[1] and stages[2].endswith("] scored")
    assert main(["evaluate", "ticks.csv", "--bootstrap", "0", "--json"]) == 0  # JSON for a program: no stage lines
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]


def test_evaluate_warns_before_the_work_when_the_ticks_need_more_memory_than_is_available(
        env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An out-of-memory kill minutes into a file of millions of ticks says nothing: the estimate is said first."""
    from cerebellar_norse import hostcheck
    from cerebellar_norse.training.commands import evaluate_memory_warning

    cfg = load_config(None)
    per_tick = cfg.neural.mossy_size * cfg.dtype_bytes + 360  # 48 float32 inputs: 552 bytes, as measured
    assert evaluate_memory_warning(1_000_000, cfg, None) is None  # unknown: no guess
    assert evaluate_memory_warning(1_000_000, cfg, 1_000_000 * per_tick) is None
    said = evaluate_memory_warning(5_000_000, cfg, 2 * 10**9)
    assert said is not None and said.startswith(f"evaluating 5,000,000 ticks needs about {5 * per_tick / 1000:.2f}GB")
    assert "this host has 2.00GB available" in said and "separate files" in said
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "ticks.csv", "--bootstrap", "0"]) == 0
    assert "warning: evaluating" not in capsys.readouterr().err
    monkeypatch.setattr(hostcheck, "available_ram_bytes", lambda: 100_000)
    assert main(["evaluate", "ticks.csv", "--bootstrap", "0"]) == 0  # a warning, not a refusal: the estimate is rough
    err = capsys.readouterr().err
    assert f"warning: evaluating 4,000 ticks needs about {4000 * per_tick / 1e6:.2f}MB of memory" in err
    assert "this host has 100.00KB available" in err


def test_evaluate_errors_name_what_is_wrong(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "ticks.csv"]) == 1
    assert "no active model" in capsys.readouterr().err
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "ticks.csv", "--model", "nope"]) == 1
    assert "no model 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # a value that is no time: a usage error (2), as argparse's own
        main(["evaluate", "ticks.csv", "--since", "yesterday"])
    assert usage.value.code == 2
    assert "argument --since: time 'yesterday' is not a time" in capsys.readouterr().err
    assert main(["evaluate", "ticks.csv", "--since", "2099-01-01"]) == 1  # after every tick: nothing to score
    err = capsys.readouterr().err
    assert "--since: 2099-01-01 (2099-01-01T00:00:00Z) is after the last tick of the files (" in err
    assert "--since: --since" not in err  # the option named once
    assert main(["evaluate", "ticks.csv", "--since", "1325500000", "--json", "--bootstrap", "0"]) == 0  # seconds, as ms
    err = capsys.readouterr().err
    assert "note: --since 1325500000 (1970-01-16T08:11:40Z) is not after the files' first tick" in err
    assert main(["evaluate", "missing.csv"]) == 1
    assert "missing.csv" in capsys.readouterr().err
    assert main(["evaluate", "ticks.csv", "--cost-bp", "-1"]) == 2
    capsys.readouterr()
    for bad in ("nan", "inf", "1e308", "10000.5"):  # refused before loading anything, as a usage error, not a traceback from scoring
        assert main(["evaluate", "ticks.csv", "--cost-bp", bad]) == 2
        assert f"--cost-bp must be a number from 0 to 10000 (100% per round trip; got {float(bad)})" in capsys.readouterr().err
    assert main(["evaluate", "ticks.csv", "--cost-bp", "-0", "--bootstrap", "0"]) == 0
    assert ", cost 0.00 bp" in capsys.readouterr().out


def _drifting_walk(path: Path, n: int = 1300) -> None:
    """One market, daily closes: a t(4) random walk, rising slightly in the first 70 %, falling in the next 15 %,
    rising after: the validation split's class mix differs from the training split's, and the test split's from both."""
    rng = np.random.default_rng(3)
    drift = np.where(np.arange(n) < 0.7 * n, 0.001, np.where(np.arange(n) < 0.85 * n, -0.002, 0.002))
    price = 75.0 * np.exp(np.cumsum(rng.standard_t(4, n) * 0.012 + drift))
    write_csv(path, [{"timestamp": 1_546_387_200_000 + 86_400_000 * k, "market_id": "AAPL", "price": float(p),
                      "volume": float(v)} for k, (p, v) in enumerate(zip(price, rng.lognormal(18, 0.4, n), strict=True))])


def test_a_model_without_an_edge_scores_exactly_as_the_base_rates(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The base-rate baseline is what a model without an edge serves (training + validation frequencies): on the
    test split and under ``evaluate`` the two agree on every figure, whatever the splits' class mixes."""
    _drifting_walk(env / "walk.csv")
    assert main(["train", "walk.csv", "--epochs", "1", "--activate", "--json"]) == 0
    trained = _json(capsys)
    assert trained["edge"] == "none"
    assert trained["activated"] is True  # --activate activates it all the same, and no warning says otherwise
    assert not any("not auto-activated" in w or "not activated" in w for w in trained["warnings"]), trained["warnings"]
    model = ModelStore(env / "state").load(trained["model_version"])
    data = model.metrics["data"]
    train = np.asarray(data["train_class_counts"])
    seen = train + np.asarray(data["validation_class_counts"])
    assert np.argmax(train) != np.argmax(seen)  # the splits' mixes differ enough to change the likeliest class
    served = np.exp(model.weights.head_bias) / np.exp(model.weights.head_bias).sum()
    assert (model.weights.head_gain == 0).all()
    np.testing.assert_allclose(served, (seen + 1.0) / (seen.sum() + 3.0), rtol=1e-12)
    np.testing.assert_allclose(model.metrics["base_rates"], served, rtol=1e-12)
    assert main(["evaluate", "walk.csv", "--bootstrap", "20"]) == 0
    assert "NO EDGE: " in capsys.readouterr().out  # its one-direction trades are not a signal, and it says so
    for summary in (trained["test"], None):
        if summary is None:
            assert main(["evaluate", "walk.csv", "--json", "--bootstrap", "50"]) == 0
            summary = _json(capsys)
            assert summary["base_rates_from"] == "the model's training and validation data"
        assert summary["samples"] > 100
        for figure in ("log_loss", "direction_log_loss", "accuracy", "directional_accuracy"):
            row = summary["vs_baselines"]["base_rates"][figure]
            assert row["diff"] == pytest.approx(0.0, abs=1e-12) and row["ci95"] == pytest.approx([0.0, 0.0], abs=1e-12), figure


def test_train_prints_how_the_files_were_read_as_notes_and_rare_classes_as_warnings(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _drifting_walk(env / "walk.csv")
    text = (env / "walk.csv").read_text().replace("market_id,", "").replace(",AAPL,", ",")  # no market column
    (env / "AAPL.csv").write_text(text)
    assert main(["train", "AAPL.csv", "--epochs", "1"]) == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert f"note: {env / 'AAPL.csv'}: no market column; market id 'AAPL' (from the file name) used" in err
    assert any(line.startswith("warning: class ") and "fewer than the recommended 10000" in line for line in err)
    said = [line for line in err if line.startswith(("warning: ", "note: "))]
    assert len(said) == len(set(said)), said  # each said once, not again after the run
    assert not any(line.startswith("warning: ") and "market id" in line for line in err)
    assert any(line.startswith("warning: models/ACTIVE names no model, so a service on this state dir serves the newest")
               for line in err)  # stored without --activate, and still what a service would serve
    # Validation's accuracies come with the baselines they must beat, as the stored model records them.
    version = captured.out.split()[1]
    v = ModelStore(env / "state").load(version).metrics["validation"]
    line = next(x for x in captured.out.splitlines() if x.startswith("validation (chose the epoch"))
    assert (f"accuracy {v['accuracy']:.3f} (majority baseline {v['majority_baseline_accuracy']:.3f}), "
            f"directional accuracy {v['directional_accuracy']:.3f} "
            f"(more common direction {v['directional_baseline_accuracy']:.3f})") in line


def test_evaluate_takes_the_training_base_rates_of_a_model_that_recorded_no_validation_counts(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    version = _json(capsys)["model_version"]
    store = ModelStore(env / "state")
    model = store.load(version)
    del model.metrics["data"]["validation_class_counts"]
    older = store.save(model.weights, load_config(None), model.metrics)
    assert main(["evaluate", "ticks.csv", "--model", older, "--json", "--bootstrap", "0"]) == 0
    summary = _json(capsys)
    assert summary["base_rates_from"] == "the model's training data"
    train = np.asarray(model.metrics["data"]["train_class_counts"], dtype=np.float64)
    assert [summary["base_rates"][c] for c in ("down", "flat", "up")] == pytest.approx(list((train + 1) / (train.sum() + 3)))


def test_evaluate_says_it_cannot_tell_what_is_in_sample_for_a_model_stored_without_its_data_period(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Models stored by earlier versions recorded neither their data's split times (data.splits) nor its fingerprint.
    Evaluated on the file they were trained on, their in-sample figures were reported as an estimate on unseen data,
    with no warning and a verdict that could say trade; now the summary says the check cannot be made, and so does
    the verdict."""
    assert main(["train", "ticks.csv", "--epochs", "1", "--json"]) == 0
    version = _json(capsys)["model_version"]
    store = ModelStore(env / "state")
    model = store.load(version)
    for key in ("splits", "fingerprint"):  # as a model of an earlier version has it
        model.metrics["data"].pop(key, None)
    model.metrics.pop("lineage", None)
    older = store.save(model.weights, load_config(None), model.metrics)
    assert main(["evaluate", "ticks.csv", "--model", older, "--json", "--bootstrap", "0"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["in_sample"] is None
    assert summary["in_sample_unknown"].startswith(f"model {older} records neither the period nor a fingerprint of the "
                                                   "data it was trained and validated on")
    assert f"warning: {summary['in_sample_unknown']}" in captured.err
    assert summary["verdict"]["action"] == "do_not_trade"
    assert summary["verdict"]["reason"].startswith("whether the scored ticks are in sample cannot be told")


def test_activate_is_refused_while_a_service_holds_the_state_dir(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cerebellar_norse.engine.state_dir import StateDirLock

    state = env / "state"
    state.mkdir()
    lock = StateDirLock(state).acquire()
    try:
        assert main(["train", "ticks.csv", "--epochs", "1", "--activate"]) == 1
        err = capsys.readouterr().err
        assert f"--activate refused: state dir {state} is in use by another cerebellar-norse process" in err
        assert "nothing was trained" in err and "/models/<version>/activate" in err and "next restart" in err
        assert ModelStore(state).versions() == [] and ModelStore(state).active_version() is None
        assert main(["train", "ticks.csv", "--epochs", "1", "--json"]) == 0  # storing only is fine beside a service
        assert ModelStore(state).active_version() is None
    finally:
        lock.release()


def test_evaluate_says_when_it_scores_ticks_the_model_was_trained_on(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`evaluate ticks.csv` on the file the model was trained on scores its training and validation ticks: the
    figures are in sample, and it says so, with the --since that leaves them out; `train` prints that --since, and
    scoring from there is not in sample."""
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    trained = _json(capsys)
    times = trained["splits"]
    assert times["train_until"] < times["validation_until"] <= times["test_from"]
    stored = ModelStore(env / "state").load(trained["model_version"]).metrics["data"]["splits"]
    assert stored == times

    report = env / "report.html"
    assert main(["evaluate", "ticks.csv", "--json", "--bootstrap", "0", "--report", str(report)]) == 0
    captured = capsys.readouterr()
    full = json.loads(captured.out.strip().splitlines()[-1])
    assert full["verdict"]["action"] == "do_not_trade" and "in-sample figures" in full["verdict"]["reason"]
    page = report.read_text(encoding="utf-8")  # a report read alone says so too, as the terminal does
    assert "IN SAMPLE: " + html.escape(full["in_sample"]["message"]) in page
    assert "VERDICT: do not trade: " in page
    ticks = generate_ticks(4000, 2, seed=4)
    assert full["in_sample"]["ticks"] > full["samples"] // 2 and full["in_sample"]["of"] == full["samples"]
    assert set(full["in_sample"]["markets"]) == {t["market_id"] for t in ticks}
    since = datetime.fromtimestamp((times["validation_until"] + 1) / 1000, tz=UTC).isoformat(timespec="milliseconds")
    since = since.replace("+00:00", "Z").replace(".000Z", "Z")
    assert f"score only later ticks with --since {since}" in captured.err

    assert main(["evaluate", "ticks.csv", "--since", since, "--json", "--bootstrap", "0"]) == 0
    captured = capsys.readouterr()
    later = json.loads(captured.out.strip().splitlines()[-1])
    assert later["in_sample"] is None and "in sample" not in captured.err and later["samples"] > 0

    # history from before the model's training data (another instrument's earlier years) was never seen: scored
    # out of sample, not refused as in sample with a --since after the file's last tick
    year = 365 * 86_400_000
    write_csv(env / "earlier.csv", [{**t, "market_id": f"OLD{t['market_id']}", "timestamp": t["timestamp"] - 10 * year}
                                    for t in generate_ticks(4000, 2, seed=5)])
    assert main(["evaluate", "earlier.csv", "--json", "--bootstrap", "0"]) == 0
    captured = capsys.readouterr()
    earlier = json.loads(captured.out.strip().splitlines()[-1])
    assert earlier["samples"] > 0 and earlier["in_sample"] is None and "in sample" not in captured.err
    assert "in-sample" not in earlier["verdict"]["reason"]
    assert times["train_from"] == min(t["timestamp"] for t in ticks)  # where the model's data start, recorded

    assert main(["train", "ticks.csv", "--epochs", "1"]) == 0
    assert f"test split (unseen, used for nothing; evaluate --since {since} scores only ticks after" in capsys.readouterr().out


def test_evaluate_counts_ticks_whose_horizon_reaches_the_training_period_as_in_sample(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model trained on the later half of a file, evaluated on the whole file: a tick just before its training
    period is labelled by a return that ends inside it, a return the model was fitted to predict in part. Those
    ticks (a horizon of them per market) are in sample as much as the training period's own; they were counted as
    unseen, since their own time lies before the model's data."""
    ticks = generate_ticks(4000, 2, seed=4)
    write_csv(env / "later.csv", ticks[2000:])
    assert main(["train", "later.csv", "--epochs", "1", "--activate", "--json"]) == 0
    splits = _json(capsys)["splits"]
    start, until = splits["train_from"], splits["validation_until"]
    assert main(["evaluate", "ticks.csv", "--json", "--bootstrap", "0"]) == 0
    got = _json(capsys)["in_sample"]
    h, warmup = 5, 50  # the tiny network's horizon and warm-up (tiny_cli_environ)
    expected = {}
    for market in sorted({t["market_id"] for t in ticks}):
        times = [t["timestamp"] for t in ticks if t["market_id"] == market]
        # scored: past the warm-up, with an end tick h later; in sample: up to the validation end, ending at or after
        # the start of the training data
        expected[market] = sum(1 for i in range(warmup, len(times) - h) if times[i] <= until and times[i + h] >= start)
        before = sum(1 for i in range(warmup, len(times) - h) if times[i] < start <= times[i + h])
        assert before == h  # the horizon's worth of ticks before the period
    assert got["markets"] == expected and got["ticks"] == sum(expected.values())
    assert "or their horizon ends in it" in got["message"]


def test_evaluate_counts_a_copy_of_the_training_data_under_other_dates_and_names_as_in_sample(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The ticks a model was trained on, moved ten years back and saved under other market names, are the same data:
    by time alone they read as another instrument's unseen history, and the model scored what it fitted. The model
    keeps a sample of its data's stretches of returns, and `evaluate` counts a market that repeats them in sample;
    another series of the same dates and names is not."""
    year = 365 * 86_400_000
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    version = _json(capsys)["model_version"]
    kept = ModelStore(env / "state").load(version).metrics["data"]["fingerprint"]
    assert kept["window"] == 16 and 100 < len(kept["hashes"]) <= 4096
    ticks = generate_ticks(4000, 2, seed=4)
    write_csv(env / "moved.csv", [{**t, "market_id": f"OLD{t['market_id']}", "timestamp": t["timestamp"] - 10 * year,
                                   "price": float(t["price"]) * 2.5} for t in ticks])  # another currency, too
    assert main(["evaluate", "moved.csv", "--json", "--bootstrap", "0"]) == 0
    captured = capsys.readouterr()
    got = json.loads(captured.out.strip().splitlines()[-1])
    assert got["in_sample"] is not None and set(got["in_sample"]["repeats"]) == {"OLDM000", "OLDM001"}
    # the copy's training and validation part (85 %, to the sampled stretches' spacing), not its test split
    assert 0.75 * got["samples"] < got["in_sample"]["ticks"] < 0.9 * got["samples"] and got["in_sample"]["since"] is None
    assert got["in_sample"]["of"] == got["samples"]
    said = "repeat the ticks the model (or one it started from) was trained and validated on under other dates or names"
    assert said in captured.err
    assert got["verdict"]["action"] == "do_not_trade" and "repeat the ticks the model" in got["verdict"]["reason"]

    write_csv(env / "other.csv", [{**t, "market_id": f"OLD{t['market_id']}", "timestamp": t["timestamp"] - 5 * year}
                                  for t in generate_ticks(4000, 2, seed=5)])
    assert main(["evaluate", "other.csv", "--json", "--bootstrap", "0"]) == 0
    assert _json(capsys)["in_sample"] is None

    # a model trained from this one on other data holds what this one learnt: the copy is in sample for it too
    assert main(["train", "other.csv", "--epochs", "1", "--activate", "--json"]) == 0
    assert _json(capsys)["started"] == f"from the active model {version}"
    assert main(["evaluate", "moved.csv", "--json", "--bootstrap", "0"]) == 0
    child = _json(capsys)["in_sample"]
    assert child is not None and set(child["repeats"]) == {"OLDM000", "OLDM001"}
    assert child["repeats"] == got["in_sample"]["repeats"]


def test_evaluate_names_the_markets_it_could_not_score(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file too short to get past the warm-up is read but has no scored tick: it is named, not silently absent."""
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    capsys.readouterr()
    write_csv(env / "short.csv", [{**t, "market_id": "SHORT"} for t in generate_ticks(45, 1, seed=9)])
    assert main(["evaluate", "ticks.csv", "short.csv", "--json", "--bootstrap", "0"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["unscored_markets"] == {"SHORT": 45}
    assert "note: 1 market(s) have no scored tick and are not in the figures: 'SHORT' (45 ticks)" in captured.err


def test_evaluate_counts_the_period_of_the_model_training_started_from_as_in_sample(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`train` starts from the active model: a model trained on the first half of a file from a model trained on the
    whole file has seen the second half through its weights. Its test split is not unseen, and `evaluate` from its
    own validation end on is in sample up to the parent's validation end."""
    ticks = generate_ticks(4000, 2, seed=4)
    write_csv(env / "head.csv", ticks[:2000])
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    parent = _json(capsys)
    assert main(["train", "head.csv", "--epochs", "1", "--activate"]) == 0
    captured = capsys.readouterr()
    assert "training starts from the active model " + parent["model_version"] in captured.err
    assert "test split (partly in sample" in captured.out and "unseen, used for nothing" not in captured.out
    store = ModelStore(env / "state")
    child = store.active_version()
    assert child != parent["model_version"]
    metrics = store.load(child).metrics
    assert metrics["parent_version"] == parent["model_version"]
    assert metrics["lineage"] == {"seen_until": parent["splits"]["validation_until"], "from": parent["model_version"]}
    assert metrics["test"]["verdict"]["action"] == "do_not_trade" and "in-sample figures" in metrics["test"]["verdict"]["reason"]
    own_until = metrics["data"]["splits"]["validation_until"]
    assert own_until < parent["splits"]["validation_until"]

    since = str(own_until + 1)  # what the model's own splits would call unseen
    assert main(["evaluate", "ticks.csv", "--since", since, "--json", "--bootstrap", "0"]) == 0
    captured = capsys.readouterr()
    got = json.loads(captured.out.strip().splitlines()[-1])
    assert got["in_sample"] is not None and got["in_sample"]["from_model"] == parent["model_version"]
    assert got["in_sample"]["validation_until"] == parent["splits"]["validation_until"]
    assert "in sample" in captured.err
    # an older model without the recorded lineage: the stored parent is followed
    del metrics["lineage"]
    from cerebellar_norse.training.commands import seen_until

    assert seen_until(metrics, store) == (parent["splits"]["validation_until"], parent["model_version"])
    assert seen_until(metrics, None) == (own_until, None)
    # trained from scratch, the active model at the time (still its parent_version) lent it nothing
    assert main(["train", "head.csv", "--epochs", "1", "--from-scratch", "--json"]) == 0
    fresh = _json(capsys)
    assert fresh["lineage"] is None and not any("training starts from" in w for w in fresh["warnings"])
    fresh_metrics = store.load(fresh["model_version"]).metrics
    assert fresh_metrics["parent_version"] == child
    assert seen_until(fresh_metrics, store) == (fresh["splits"]["validation_until"], None)


def test_the_generated_ticks_of_the_first_run_put_no_real_period_in_sample(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first run's default model is trained on generated ticks dated by the generator. A model trained from it on
    a market's earlier real ticks saw nothing of their period: its test split is unseen, and `evaluate` after its own
    validation period counts no tick in sample (they were called partly in sample, `do_not_trade`, with a --since
    after every tick of the file)."""
    import os

    from cerebellar_norse.training.checkpoints import seen_from, seen_until, trained_on_generated
    from cerebellar_norse.training.jobs import run_training

    cfg = load_config(None, environ=os.environ)
    first_run = env / "state" / "bootstrap" / "ticks.csv"
    write_csv(first_run, generate_ticks(3000, 2, seed=11))
    store = ModelStore(env / "state")
    generated = run_training(cfg, [first_run], 1, lambda d: None, None, generated=True)
    store.set_active(generated["model_version"])
    years = 3 * 365 * 86_400_000
    earlier = [{**t, "timestamp": t["timestamp"] - years, "market_id": f"REAL{t['market_id']}"}
               for t in generate_ticks(4000, 2, seed=4)]
    write_csv(env / "earlier.csv", earlier)

    assert main(["train", "earlier.csv", "--epochs", "1", "--activate", "--json"]) == 0
    child = _json(capsys)
    assert child["lineage"] is None and not any("partly in sample" in w for w in child["warnings"])
    assert "in-sample" not in child["test"]["verdict"]["reason"]
    metrics = store.load(child["model_version"]).metrics
    assert metrics["parent_version"] == generated["model_version"]  # trained from it, all the same
    own = metrics["data"]["splits"]
    assert seen_until(metrics, store) == (own["validation_until"], None)
    assert seen_from(metrics, store) == own["train_from"]

    assert main(["evaluate", "earlier.csv", "--since", str(own["validation_until"] + 1), "--json", "--bootstrap", "0"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["in_sample"] is None and "in sample" not in captured.err

    # a default model stored before `generated` was recorded is known by its file, <state_dir>/bootstrap/ticks.csv
    first_metrics = store.load(generated["model_version"]).metrics
    assert first_metrics["data"]["generated"] is True and metrics["data"]["generated"] is False
    older = {**first_metrics, "data": {k: v for k, v in first_metrics["data"].items() if k != "generated"}}
    assert trained_on_generated(older) and not trained_on_generated(metrics)


def test_the_period_of_a_model_trained_from_on_later_dates_leaves_an_earlier_test_split_unseen(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Training starts from the active model, fitted on another market's later years: the new model's test split,
    before those years and after its own validation period, was seen by neither model. `train` calls it unseen (no
    `--since` after the other model's years, which would be after the file's last tick), and `evaluate` from the new
    model's own validation end on finds nothing in sample; the other model's years still are."""
    later = [{**t, "timestamp": t["timestamp"] + 10 * 365 * 86_400_000} for t in generate_ticks(4000, 2, seed=9)]
    write_csv(env / "later.csv", later)
    assert main(["train", "later.csv", "--epochs", "1", "--activate", "--json"]) == 0
    parent = _json(capsys)
    assert main(["train", "ticks.csv", "--epochs", "1", "--json"]) == 0
    child = _json(capsys)
    assert child["lineage"] == {"seen_until": parent["splits"]["validation_until"], "from": parent["model_version"]}
    assert not any("partly in sample" in w for w in child["warnings"])
    assert "in-sample" not in child["test"]["verdict"]["reason"]
    own_until = child["splits"]["validation_until"]
    assert main(["evaluate", "ticks.csv", "--model", child["model_version"], "--since", str(own_until + 1), "--json",
                 "--bootstrap", "0"]) == 0
    assert _json(capsys)["in_sample"] is None
    assert main(["evaluate", "later.csv", "--model", child["model_version"], "--json", "--bootstrap", "0"]) == 0
    got = _json(capsys)["in_sample"]
    assert got is not None and got["from_model"] == parent["model_version"] and got["train_from"] == parent["splits"]["train_from"]


def test_evaluate_reads_the_spread_a_bounce_between_bid_and_ask_implies(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The scored prices' bid-ask bounce (Roll's spread from their lag-1 autocovariance) is in evaluate's JSON, which
    the verdict holds the cost charged against; prices without a bounce get none."""
    rng = np.random.default_rng(5)
    n = 1500
    logp = np.log(40.0) + np.cumsum(rng.normal(0, 0.5e-4, n)) + 4e-4 * rng.choice([-1.0, 1.0], n)  # half-spread 4 bp
    write_csv(env / "bounce.csv", [{"timestamp": 1_700_000_000_000 + 1000 * k, "market_id": "XYZ", "price": float(p),
                                    "volume": 100.0} for k, p in enumerate(np.exp(logp))])
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    _json(capsys)
    assert main(["evaluate", "bounce.csv", "--json", "--bootstrap", "20", "--cost-bp", "1"]) == 0
    got = _json(capsys)
    assert got["bounce"]["spread_bp"] == pytest.approx(8.0, rel=0.1)
    assert got["bounce"]["returns"] == got["samples"] - 1 and got["bounce"]["lag1_autocorrelation"] < -0.4
    # beside a market moving 30 bp a tick at random, pooled, its bounce drowns; each market is tested on its own
    busy = np.log(40.0) + np.cumsum(rng.normal(0, 30e-4, n))
    write_csv(env / "two.csv", [{"timestamp": 1_700_000_000_000 + 1000 * k, "market_id": m, "price": float(np.exp(p)),
                                 "volume": 100.0} for k in range(n) for m, p in (("XYZ", logp[k]), ("ABC", busy[k]))])
    assert main(["evaluate", "two.csv", "--json", "--bootstrap", "20", "--cost-bp", "1"]) == 0
    got = _json(capsys)["bounce"]
    assert list(got["markets"]) == ["XYZ"] and got["spread_bp"] == pytest.approx(8.0, rel=0.1)
    assert got["pooled_spread_bp"] is None
    # prices the user says are mids (or index levels) have no spread to bounce across: none is read from them
    assert main(["evaluate", "bounce.csv", "--json", "--bootstrap", "20", "--cost-bp", "1", "--mid-prices"]) == 0
    got = _json(capsys)["bounce"]
    assert got["mid_prices"] is True and got["spread_bp"] is None and got["lag1_autocorrelation"] < -0.4
    assert main(["evaluate", "bounce.csv", "--bootstrap", "0", "--mid-prices"]) == 0
    text = capsys.readouterr().out
    assert "bid-ask bounce: not read, the prices are mids" in text and "effective spread" not in text
    _drifting_walk(env / "walk.csv")
    assert main(["evaluate", "walk.csv", "--json", "--bootstrap", "20"]) == 0
    assert _json(capsys)["bounce"]["spread_bp"] is None


def test_since_written_as_the_files_yyyymmdd_dates_is_read_as_that_date(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file of dates written ``YYYYMMDD`` (stockstats' test data, stooq's files): ``--since 20130305``, copied from
    the file, was read as 20,130,305 ms (1970-01-01T05:35Z), so every tick was scored, the model's own training
    period too. It is read as the files' dates are, the same as ``--since 2013-03-05``; a number stays ms in a file
    of other times."""
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    capsys.readouterr()
    rng = np.random.default_rng(5)
    days = np.arange(np.datetime64("2010-01-04"), np.datetime64("2014-06-30"))
    days = days[np.is_busday(days)]
    price = 30.0 * np.exp(np.cumsum(rng.normal(0.0, 0.015, len(days))))
    lines = ["date,close,volume"] + [f"{str(d).replace('-', '')},{p:.2f},{rng.integers(10**5, 10**6)}"
                                     for d, p in zip(days, price, strict=True)]
    (env / "daily.csv").write_text("\n".join(lines) + "\n")
    scored = {}
    for since in ("20130305", "2013-03-05"):
        assert main(["evaluate", "daily.csv", "--since", since, "--json", "--bootstrap", "0"]) == 0
        captured = capsys.readouterr()
        scored[since] = json.loads(captured.out.strip().splitlines()[-1])
        assert scored[since]["since_utc"] == "2013-03-05T00:00:00Z"
        assert "every tick is scored" not in captured.err
    assert scored["20130305"]["samples"] == scored["2013-03-05"]["samples"]
    later = int(np.sum(days >= np.datetime64("2013-03-05")))
    assert 0 < scored["20130305"]["samples"] <= later
    assert main(["evaluate", "ticks.csv", "--since", "20130305", "--json", "--bootstrap", "0"]) == 0  # ms times: ms
    assert _json(capsys)["since_utc"] == "1970-01-01T05:35:30.305Z"


def _slash_dates(path: Path, day_first: bool) -> np.ndarray:
    """A daily file (``Date,Close``) of 2010-2012 business days written ``3/8/2011`` (month first, as ffn's and
    Excel's US exports) or ``8/3/2011`` (day first); returns the days."""
    rng = np.random.default_rng(6)
    days = np.arange(np.datetime64("2010-01-04"), np.datetime64("2012-12-31"))
    days = days[np.is_busday(days)]
    price = 30.0 * np.exp(np.cumsum(rng.normal(0.0, 0.015, len(days))))
    lines = ["Date,Close"]
    for d, p in zip(days, price, strict=True):
        y, m, dd = str(d).split("-")
        lines.append(f"{int(dd)}/{int(m)}/{y},{p:.2f}" if day_first else f"{int(m)}/{int(dd)}/{y},{p:.2f}")
    path.write_text("\n".join(lines) + "\n")
    return days


def test_since_written_as_the_files_slash_dates_is_read_in_their_order(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user of a file of ``3/8/2011`` dates (month first; ffn's test data) types ``--since 3/8/2011``: it was
    refused as no time (ms or ISO 8601). It is read in the order of the files' dates, the same as ``--since
    2011-03-08``; in a file of day-first dates ``8/3/2011`` is that day too. Where the files' dates do not say the
    order, an ambiguous one is refused naming both ISO 8601 forms, an unambiguous one read."""
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    capsys.readouterr()
    days = _slash_dates(env / "us.csv", day_first=False)
    _slash_dates(env / "eu.csv", day_first=True)
    scored = {}
    for file, since in (("us.csv", "3/8/2011"), ("us.csv", "2011-03-08"), ("eu.csv", "8/3/2011"), ("eu.csv", "08.03.2011")):
        assert main(["evaluate", file, "--since", since, "--json", "--bootstrap", "0"]) == 0
        captured = capsys.readouterr()
        scored[since] = json.loads(captured.out.strip().splitlines()[-1])
        assert scored[since]["since_utc"] == "2011-03-08T00:00:00Z", since
        assert "every tick is scored" not in captured.err
    assert len({scored[s]["samples"] for s in scored}) == 1
    assert 0 < scored["3/8/2011"]["samples"] <= int(np.sum(days >= np.datetime64("2011-03-08")))
    # the order of the files' dates decides, not what the text could be alone
    assert main(["evaluate", "us.csv", "--since", "8/3/2011", "--json", "--bootstrap", "0"]) == 0
    assert _json(capsys)["since_utc"] == "2011-08-03T00:00:00Z"
    assert main(["evaluate", "us.csv", "--since", "13/8/2011", "--bootstrap", "0"]) == 1
    assert "--since: '13/8/2011' is not a valid date read as M/D/YYYY, as the files' dates are written" in (
        capsys.readouterr().err)
    # files of ms times: 3/8/2011 could be either; 13/8/2011 and 3/3/2011 only one day
    assert main(["evaluate", "ticks.csv", "--since", "3/8/2011", "--bootstrap", "0"]) == 1
    err = capsys.readouterr().err
    assert "'3/8/2011' could be day/month or month/day (the files' dates do not say which comes first)" in err
    assert "write it as ISO 8601, 2011-03-08 (month/day) or 2011-08-03 (day/month)" in err
    assert main(["evaluate", "ticks.csv", "--since", "13/8/2011", "--json", "--bootstrap", "0"]) == 0
    assert _json(capsys)["since_utc"] == "2011-08-13T00:00:00Z"
    # no date in either order: a usage error before any file is read
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "us.csv", "--since", "13/13/2011"])
    assert exit_.value.code == 2
    assert "'13/13/2011' is not a valid date read as D/M/YYYY or as M/D/YYYY" in capsys.readouterr().err
