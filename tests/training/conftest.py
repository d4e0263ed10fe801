"""Fixtures of the training tests: configs built through environment overrides, CSV files of ticks.

``make_config(neural={...}, training={...}, state_dir=...)`` is the built-in default
config with the overrides applied through ``CEREBELLAR_NORSE_*`` variables (the
caller's environment is not read) and ``paths.state_dir`` under the test's tmp_path.
``TINY_NEURAL`` is a network small enough for the Norse reference to train in
fractions of a second.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from cerebellar_norse.config import Config, consistency_problems, load_config
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training.data import write_csv

ConfigFactory = Callable[..., Config]
CsvFactory = Callable[..., Path]

TINY_NEURAL: dict[str, Any] = {
    "mossy_size": 12,
    "granule_size": 64,
    "granule_dendrites": 3,
    "purkinje_size": 6,
    "connections_per_neuron": 16,
    "dcn_size": 6,
    "target_sparsity": 0.1,
    "horizon_ticks": 5,
}


def config_environ(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """``{"neural": {"granule_size": 64}}`` -> ``{"CEREBELLAR_NORSE_NEURAL__GRANULE_SIZE": "64"}``."""
    return {f"CEREBELLAR_NORSE_{section.upper()}__{key.upper()}": str(value).lower() if isinstance(value, bool) else str(value)
            for section, keys in sections.items() for key, value in keys.items()}


@pytest.fixture
def make_config(tmp_path: Path) -> ConfigFactory:
    """Build a checked config from the built-in default plus ``neural=``/``training=``/``paths=`` overrides."""

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
def ticks_csv(tmp_path: Path) -> CsvFactory:
    """Write ``generate_ticks(n, markets, seed)`` as a CSV: ``ticks_csv(n, markets, seed, name=..., folder=...)``."""

    def make(n: int, markets: int = 4, seed: int = 0, name: str = "ticks.csv", folder: Path | None = None) -> Path:
        path = (folder or tmp_path / "data") / name
        write_csv(path, generate_ticks(n, markets, seed))
        return path

    return make
