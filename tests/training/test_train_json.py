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
