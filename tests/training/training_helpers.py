"""Helpers of the training tests: a tiny network, config overrides, the live server of the API tests."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cerebellar_norse.config import Config

# The API tests' server launcher (tests/api/live_helpers.py) is reused as is.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import REPO_ROOT, LiveServer, free_port, server_environ, start

__all__ = ["FILE_COMMANDS", "REPO_ROOT", "TINY_NEURAL", "ConfigFactory", "CsvFactory", "LiveServer", "config_environ",
           "free_port", "server_environ", "start", "tiny_cli_environ", "training_seen", "utc_ms", "write_text_file"]

ConfigFactory = Callable[..., Config]
CsvFactory = Callable[..., Path]

# The commands that read tick files, each with the function of training.commands it calls.
FILE_COMMANDS = (("train", "cmd_train"), ("evaluate", "cmd_evaluate"), ("inspect-data", "cmd_inspect_data"),
                 ("replay", "cmd_replay"))


def training_seen(monkeypatch: pytest.MonkeyPatch, command: str, field: str, *argvs: list[str]) -> list[Any]:
    """``cfg.training.<field>`` as each command line of ``argvs`` hands it to ``commands.<command>`` (not run: each
    line must exit 0)."""
    from cerebellar_norse.cli import main
    from cerebellar_norse.training import commands

    seen: list[Any] = []
    monkeypatch.setattr(commands, command, lambda cfg, *a, **k: seen.append(getattr(cfg.training, field)) or 0)
    for argv in argvs:
        assert main(argv) == 0, argv
    return seen

# Small enough for the Norse reference to train a window in milliseconds.
TINY_NEURAL: dict[str, Any] = {
    "mossy_size": 12,
    "granule_size": 64,
    "granule_dendrites": 3,
    "purkinje_size": 6,
    "connections_per_neuron": 16,
    "dcn_size": 6,
    "target_sparsity": 0.1,
    "horizon_ticks": 5,
    "warmup_ticks": 50,  # short series: the default warm-up would leave nothing to score
}


def config_environ(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """``{"neural": {"granule_size": 64}}`` -> ``{"CEREBELLAR_NORSE_NEURAL__GRANULE_SIZE": "64"}``."""
    return {f"CEREBELLAR_NORSE_{section.upper()}__{key.upper()}": str(value).lower() if isinstance(value, bool) else str(value)
            for section, keys in sections.items() for key, value in keys.items()}


def tiny_cli_environ(tmp_path: Path) -> dict[str, str]:
    """The environment of a CLI run on the tiny network, one thread, state dir ``tmp_path/state``, data dir
    ``tmp_path``."""
    return {**config_environ({"neural": TINY_NEURAL, "training": {"threads": 1}}),
            "CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), "CEREBELLAR_NORSE_PATHS__DATA_DIR": str(tmp_path)}


def write_text_file(tmp_path: Path, text: str, name: str = "ticks.csv") -> Path:
    """``text`` written as UTF-8 to ``tmp_path / name``."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def utc_ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    """ms since the epoch of that UTC wall-clock time."""
    return round(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)
