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
