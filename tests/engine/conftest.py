"""Fixtures of the engine tests: configs built through environment overrides, tick streams.

``engine_config(queue_size=4, neural={"seed": 7})`` builds the built-in default config
with ``[performance]`` (keyword arguments) and ``[neural]``, ``[training]``, ``[debug]`` overrides applied through
``CEREBELLAR_NORSE_*`` variables, and ``paths.state_dir`` under the test's tmp_path.
The caller's environment is never read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import ConfigFactory, StreamFactory, crash

from cerebellar_norse.config import Config, load_config
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.ticks import Tick, validate_ticks


@pytest.fixture
def engine_config(tmp_path: Path) -> ConfigFactory:
    """Build a config: keyword arguments are ``[performance]`` keys; ``neural=``, ``training=``, ``debug=`` dicts of those sections."""

    def make(*, state_dir: Path | None = None, neural: Mapping[str, Any] | None = None,
             training: Mapping[str, Any] | None = None, debug: Mapping[str, Any] | None = None, **performance: Any) -> Config:
        env = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(state_dir or tmp_path / "state")}
        for section, keys in (("performance", performance), ("neural", neural), ("training", training), ("debug", debug)):
            env.update({f"CEREBELLAR_NORSE_{section.upper()}__{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v)
                        for k, v in (keys or {}).items()})
        return load_config(None, environ=env)

    return make


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    """A TOML config with the state dir under tmp_path and ``debug.record_requests`` on."""
    path = tmp_path / "config.toml"
    path.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n\n[debug]\nrecord_requests = true\n', encoding="utf-8")
    return path


@pytest.fixture
def cfg(config_file: Path) -> Config:
    """The config of ``config_file`` (the caller's environment is never read)."""
    return load_config(config_file, environ={})


@pytest.fixture
def streams() -> StreamFactory:
    """``streams(n_ticks, n_markets, seed)``: synthetic ticks grouped by market, each list in time order."""

    def make(n_ticks: int, n_markets: int, seed: int = 0) -> dict[str, list[Tick]]:
        by_market: dict[str, list[Tick]] = defaultdict(list)
        for t in validate_ticks(generate_ticks(n_ticks, n_markets, seed)):
            by_market[t.market_id].append(t)
        return dict(by_market)

    return make


@pytest.fixture
def journaled(engine_config: ConfigFactory, tmp_path: Path) -> Iterator[tuple[Config, list[Durability]]]:
    """(config with a state dir, list to register Durability objects for cleanup)."""
    cfg = engine_config(state_dir=tmp_path / "state", max_markets=16)
    opened: list[Durability] = []
    yield cfg, opened
    for d in opened:
        crash(d)
