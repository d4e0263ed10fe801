"""What `train` and `evaluate` say beside figures that are no signal: a model without a directional edge, and a
series whose P&L is made by an unadjusted split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from training_helpers import tiny_cli_environ

from cerebellar_norse.cli import main
from cerebellar_norse.config import load_config
from cerebellar_norse.training.checkpoints import ModelStore
from cerebellar_norse.training.data import write_csv


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for k, v in tiny_cli_environ(tmp_path).items():
        monkeypatch.setenv(k, v)
    return tmp_path


def _split_walk(path: Path, n: int = 1300) -> None:
    """One market, a t(4) random walk whose price halves in one tick late in the series (an unadjusted 2:1 split)."""
    rng = np.random.default_rng(5)
    price = 180.0 * np.exp(np.cumsum(rng.standard_t(4, n) * 0.004))
    price[int(0.93 * n):] /= 2.0
    write_csv(path, [{"timestamp": 1_704_067_200_000 + 60_000 * k, "market_id": "AAPL", "price": float(p),
                      "volume": float(v)} for k, (p, v) in enumerate(zip(price, rng.lognormal(5, 1, n), strict=True))])


def _json(capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_an_unadjusted_split_in_the_scored_ticks_is_told_by_train_and_evaluate(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _split_walk(env / "split.csv")
    assert main(["train", "split.csv", "--epochs", "1", "--activate", "--json"]) == 0
    trained = _json(capsys)
    said = [w for w in trained["warnings"] if w.startswith("data check: AAPL: a move of -")]
    assert len(said) == 1 and "unadjusted split" in said[0], trained["warnings"]
    assert main(["evaluate", "split.csv", "--json", "--bootstrap", "0"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert any("unadjusted split" in c for c in summary["data_checks"]["AAPL"])
    assert any(line.startswith("warning: data check: AAPL: a move of -") for line in captured.err.splitlines())


def test_a_model_with_only_a_flat_edge_says_its_direction_is_no_signal(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _split_walk(env / "walk.csv")
    assert main(["train", "walk.csv", "--epochs", "1", "--json"]) == 0
    version = _json(capsys)["model_version"]
    store = ModelStore(env / "state")
    model = store.load(version)
    metrics = dict(model.metrics, edge="flat")
    # a flat head: only P(flat) listens to the network, P(up) / P(down) is fixed by the biases
    flat = store.save(model.weights.with_head(np.array([0.0, 1.5, 0.0]), np.array([-1.0, 0.0, -0.9])), load_config(None),
                      metrics)
    assert main(["evaluate", "walk.csv", "--model", flat, "--bootstrap", "0"]) == 0
    out = capsys.readouterr().out
    assert "NO DIRECTIONAL EDGE: " in out and "NO EDGE: " not in out
    assert main(["evaluate", "walk.csv", "--model", flat, "--json", "--bootstrap", "0"]) == 0
    summary = _json(capsys)
    always_up = summary["baselines"]["always_up"]["pnl"]  # a constant long position, no signal (the model's own P&L
    assert {k: summary["model"]["pnl"][k] for k in always_up} == always_up  # has its intervals besides)
