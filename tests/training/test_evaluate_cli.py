"""`cerebellar-norse train` and `evaluate` end to end (in process, tiny network, real files)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from training_helpers import TINY_NEURAL, config_environ

from cerebellar_norse.cli import main
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training.data import write_csv


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for k, v in config_environ({"neural": TINY_NEURAL, "training": {"threads": 1}}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__DATA_DIR", str(tmp_path))
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

    assert main(["evaluate", "ticks.csv", "--json", "--bootstrap", "200"]) == 0
    full = _json(capsys)
    assert full["model_version"] == trained["model_version"]
    assert full["samples"] > 1000
    assert set(full["baselines"]) == {"base_rates", "majority", "persistence", "mean_reversion", "logistic"}
    for row in full["vs_baselines"].values():
        lo, hi = row["log_loss"]["ci95"]
        assert lo <= row["log_loss"]["diff"] <= hi
    assert full["base_rates_from"] == "the model's training data"
    assert sum(full["model"]["confusion"][0]) + sum(full["model"]["confusion"][1]) + sum(full["model"]["confusion"][2]) == full["samples"]

    mid = datetime.fromtimestamp(generate_ticks(4000, 2, seed=4)[2000]["timestamp"] / 1000, tz=UTC).isoformat()
    report = env / "report.html"
    assert main(["evaluate", "ticks.csv", "--since", mid, "--report", str(report), "--cost-bp", "1"]) == 0
    text = capsys.readouterr().out
    assert "base_rates" in text and "logistic" in text and f"report written to {report}" in text
    html = report.read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") >= 3 and "http://" not in html and "https://" not in html
    assert main(["evaluate", "ticks.csv", "--since", mid, "--json", "--bootstrap", "0"]) == 0
    later = _json(capsys)
    assert 0 < later["samples"] < full["samples"] and later["cost_bp"] == 0.0


def test_evaluate_errors_name_what_is_wrong(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "ticks.csv"]) == 1
    assert "no active model" in capsys.readouterr().err
    assert main(["train", "ticks.csv", "--epochs", "1", "--activate", "--json"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "ticks.csv", "--model", "nope"]) == 1
    assert "no model 'nope'" in capsys.readouterr().err
    assert main(["evaluate", "ticks.csv", "--since", "yesterday"]) == 1
    assert "--since" in capsys.readouterr().err
    assert main(["evaluate", "missing.csv"]) == 1
    assert "missing.csv" in capsys.readouterr().err
    assert main(["evaluate", "ticks.csv", "--cost-bp", "-1"]) == 2
