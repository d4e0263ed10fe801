"""Fixtures of the training tests: configs built through environment overrides, CSV files of ticks.

``make_config(neural={...}, training={...})`` is the built-in default config with the
overrides applied through ``CEREBELLAR_NORSE_*`` variables (the caller's environment
is not read), ``paths.state_dir`` and ``paths.data_dir`` under the test's tmp_path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from training_helpers import TINY_NEURAL, ConfigFactory, CsvFactory, config_environ

from cerebellar_norse.config import Config, consistency_problems, load_config
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training.data import write_csv


@pytest.fixture
def cli_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A command line's environment: none of the caller's ``CEREBELLAR_NORSE_*`` variables, the state dir under
    ``tmp_path`` and ``tmp_path`` the data dir (returned)."""
    for k in list(os.environ):
        if k.startswith("CEREBELLAR_NORSE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__DATA_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def make_config(tmp_path: Path) -> ConfigFactory:
    """Build a checked config from the built-in default plus ``neural=``/``training=``/``performance=`` overrides."""

    def make(*, neural: Mapping[str, Any] | None = None, training: Mapping[str, Any] | None = None,
             performance: Mapping[str, Any] | None = None, state_dir: Path | None = None,
             data_dir: Path | None = None) -> Config:
        paths = {"state_dir": state_dir or tmp_path / "state", "data_dir": data_dir or tmp_path / "data"}
        env = config_environ({"neural": neural or {}, "training": training or {}, "performance": performance or {},
                              "paths": {k: f'"{v}"' for k, v in paths.items()}})
        cfg = load_config(None, environ=env)
        problems = consistency_problems(cfg)
        assert not problems, problems
        return cfg

    return make


@pytest.fixture
def cfg(make_config: ConfigFactory) -> Config:
    """The built-in config with the tiny network (``TINY_NEURAL``), its paths under the test's tmp_path."""
    return make_config(neural=TINY_NEURAL)


@pytest.fixture
def ticks_csv(tmp_path: Path) -> CsvFactory:
    """Write ``generate_ticks(n, markets, seed)`` as a CSV: ``ticks_csv(n, markets, seed, name=..., folder=...)``."""

    def make(n: int, markets: int = 4, seed: int = 0, name: str = "ticks.csv", folder: Path | None = None) -> Path:
        path = (folder or tmp_path / "data") / name
        write_csv(path, generate_ticks(n, markets, seed))
        return path

    return make
