"""The order of day and month in tick files' dates with slashes or dots: ``training.date_order`` and ``--date-order``
(the CSV reader's side is in test_data.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from training_helpers import FILE_COMMANDS, training_seen

from cerebellar_norse.cli import main
from cerebellar_norse.config import load_config
from cerebellar_norse.errors import ConfigError
from cerebellar_norse.training.jobs import TrainingRequest, job_config

QUOTES = "datetime,bid,ask\n02/03/2010 16:53:50,0.5,0.6\n02/03/2010 16:53:51,0.51,0.61\n"  # one day: either order


def test_the_config_key_is_checked_at_load() -> None:
    assert load_config(environ={}).training.day_first is None
    assert load_config(environ={"CEREBELLAR_NORSE_TRAINING__DATE_ORDER": '"day_first"'}).training.day_first is True
    assert load_config(environ={"CEREBELLAR_NORSE_TRAINING__DATE_ORDER": '"month_first"'}).training.day_first is False
    with pytest.raises(ConfigError) as info:
        load_config(environ={"CEREBELLAR_NORSE_TRAINING__DATE_ORDER": '"dd/mm"'})
    (problem,) = info.value.problems
    assert problem.key == "training.date_order"


@pytest.fixture
def cli_env(cli_dirs: Path) -> Path:
    (cli_dirs / "bidask.csv").write_text(QUOTES)
    return cli_dirs


@pytest.mark.parametrize(("name", "command"), FILE_COMMANDS)
def test_the_option_overrides_the_config_key(name: str, command: str, cli_env: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CEREBELLAR_NORSE_TRAINING__DATE_ORDER", '"month_first"')
    argv = [name, "bidask.csv"]
    assert training_seen(monkeypatch, command, "date_order", [*argv, "--date-order", "day-first"], argv) == [
        "day_first", "month_first"]


def test_a_bad_option_is_a_usage_error(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["inspect-data", "bidask.csv", "--date-order", "dd/mm"])
    assert info.value.code == 2
    assert "--date-order: invalid choice: 'dd/mm'" in capsys.readouterr().err


def test_inspect_data_reads_a_file_that_cannot_tell_once_told(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect-data", "bidask.csv"]) != 0
    assert "say which with training.date_order (or --date-order day-first|month-first)" in capsys.readouterr().err
    assert main(["inspect-data", "bidask.csv", "--date-order", "day-first"]) == 0
    out = capsys.readouterr().out
    assert "2010-03-02T16:53:50Z" in out and "dates read as day/month/year (training.date_order)" in out
    assert main(["inspect-data", "bidask.csv", "--date-order", "month-first"]) == 0
    assert "2010-02-03T16:53:50Z" in capsys.readouterr().out


def test_a_training_request_overrides_the_order_and_refuses_a_bad_one() -> None:
    cfg = load_config(environ={"CEREBELLAR_NORSE_TRAINING__DATE_ORDER": '"month_first"'})
    req = TrainingRequest.model_validate({"files": ["a.csv"], "date_order": "day_first"})
    assert job_config(cfg, req).training.day_first is True
    assert job_config(cfg, TrainingRequest.model_validate({"files": ["a.csv"]})).training.date_order == "month_first"
    with pytest.raises(ValidationError) as info:
        TrainingRequest.model_validate({"files": ["a.csv"], "date_order": "dd/mm"})
    assert info.value.errors()[0]["loc"] == ("date_order",)
