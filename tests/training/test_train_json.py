"""train --json is JSON: a validation without moving labels has no directional accuracy (null, not NaN)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cerebellar_norse.cli import main


def _refuse(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def test_train_json_of_a_price_that_never_moves_has_no_nan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "FLAT.csv"
    data.write_text("timestamp,close,volume\n" + "".join(f"{1700000000000 + i * 1000},100.0,1\n" for i in range(6000)))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\ndata_dir = "{tmp_path}"\n')
    assert main(["--config", str(cfg), "train", str(data), "--epochs", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out, parse_constant=_refuse)
    assert res["edge"] == "none" and res["validation"]["directional_accuracy"] is None


def test_train_without_a_terminal_prints_a_progress_line_during_a_long_epoch(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Under systemd, nohup or CI stderr is no terminal: an epoch of millions of ticks ran for minutes with no
    line at all. A plain progress line is printed every PLAIN_PROGRESS_S seconds (a fake clock here)."""
    from cerebellar_norse.training import commands

    clock = [1000.0]
    monkeypatch.setattr(commands.time, "monotonic", lambda: clock[0])
    show = commands._progress_printer(False, set())
    step = {"epoch": 1, "epochs": 2, "steps": 400, "loss": 1.0987, "ticks_per_second": 3100.0}
    show({**step, "step": 1})
    assert capsys.readouterr().err == ""  # not at once: short runs print only their epoch lines, as before
    clock[0] += commands.PLAIN_PROGRESS_S
    show({**step, "step": 100})
    err = capsys.readouterr().err
    assert "\r" not in err and err.count("\n") == 1
    assert "epoch 1/2: step 100/400 (25%)" in err and "1.0987" in err and "3100 ticks/s" in err
    clock[0] += 1.0
    show({**step, "step": 101})
    assert capsys.readouterr().err == ""  # at most one line per interval


def test_an_epoch_line_without_a_figure_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """An epoch whose windows had no label has no train loss, and a validation split without a moving label no
    directional figure (None): the epoch line failed with a TypeError formatting None."""
    from cerebellar_norse.training import commands

    show = commands._progress_printer(False, set())
    show({"epoch": 1, "epochs": 3, "step": 5, "steps": 5, "loss": None, "epoch_done": True,
          "validation": {"loss": 1.05, "accuracy": 0.61, "majority_baseline_accuracy": 0.6,
                         "directional_accuracy": None, "directional_baseline_accuracy": None}})
    err = capsys.readouterr().err
    assert err == ("epoch 1/3: train loss n/a, validation loss 1.0500, accuracy 0.610 (majority baseline 0.600),"
                   " directional n/a (more common direction n/a)\n")
