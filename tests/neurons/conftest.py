"""Fixtures of the network tests: configurations built from environment overrides, tick streams."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
from network_sizes import SMALL_NEURAL

from cerebellar_norse.config import Config, consistency_problems, load_config
from cerebellar_norse.neurons.network import CerebellarNetwork
from cerebellar_norse.synthetic import generate_ticks

# A network small enough to re-implement and check by hand, with spikes in every population.
# Every value is pinned (not left to the defaults), so the golden numbers frozen in
# test_golden.py change only when the topology generation or the dynamics change.
TINY_NEURAL: dict[str, Any] = {
    "mossy_size": 6,
    "granule_size": 16,
    "granule_dendrites": 2,
    "purkinje_size": 3,
    "connections_per_neuron": 4,
    "dcn_size": 6,
    "steps_per_tick": 4,
    "dt_ms": 1.0,
    "seed": 42,
    "target_sparsity": 0.125,
    "golgi_rate": 2.0,
    "mossy_gain": 1.0,
    "feature_clip": 4.0,
    "norm_window": 1000,
    "readout_scale": 1.0,
    "precision": "float64",
    # nested tables: CEREBELLAR_NORSE_NEURAL__<POPULATION>__<KEY>
    **{f"{pop}__{key}": value
       for pop, (tau_syn, tau_mem) in {"granule": (2.0, 2.0), "purkinje": (2.0, 4.0), "dcn": (2.0, 4.0),
                                       "readout": (5.0, 10.0)}.items()
       for key, value in {"tau_syn_ms": tau_syn, "tau_mem_ms": tau_mem, "v_leak": 0.0, "v_th": 1.0, "v_reset": 0.0}.items()},
}


ConfigFactory = Callable[..., Config]
TickFactory = Callable[..., list[dict[str, Any]]]


def config_environ(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """``{"neural": {"granule_size": 64}}`` -> ``{"CEREBELLAR_NORSE_NEURAL__GRANULE_SIZE": "64"}``.

    Keys of nested tables use ``__``: ``{"neural": {"readout__tau_mem_ms": 2.0}}``.
    """
    return {f"CEREBELLAR_NORSE_{section.upper()}__{key.upper()}": str(value)
            for section, keys in sections.items() for key, value in keys.items()}


@pytest.fixture
def make_config() -> ConfigFactory:
    """Build a checked config from the built-in default plus overrides.

    ``make_config(neural={...}, performance={...})``: the overrides go through the
    environment-override path of ``load_config`` (the caller's environment is not read).
    """

    def make(neural: Mapping[str, Any] | None = None, performance: Mapping[str, Any] | None = None) -> Config:
        cfg = load_config(None, environ=config_environ({"neural": neural or {}, "performance": performance or {}}))
        problems = consistency_problems(cfg)
        assert not problems, problems
        return cfg

    return make


@pytest.fixture
def tiny_config(make_config: ConfigFactory) -> Config:
    """The tiny float64 network of :data:`TINY_NEURAL`."""
    return make_config(TINY_NEURAL)


@pytest.fixture
def small_config(make_config: ConfigFactory) -> Config:
    """The small network of :data:`SMALL_NEURAL` (float32, the default precision)."""
    return make_config(SMALL_NEURAL)


@pytest.fixture
def ticks() -> TickFactory:
    """Synthetic tick dicts: ``ticks(n, markets=4, seed=0)``."""

    def make(n: int, markets: int = 4, seed: int = 0) -> list[dict[str, Any]]:
        return generate_ticks(n, markets, seed)

    return make


def without_time(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results without ``processing_time_ns`` (the only field that may differ between equal runs)."""
    return [{k: v for k, v in r.items() if k != "processing_time_ns"} for r in results]


def pool_copy(net: CerebellarNetwork) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Every bit of a network's market state: the flat neuron buffer, the encoder states, the markets."""
    return net.pool.arrays.flat.copy(), net.pool.arrays.enc.copy(), net.markets


def assert_same_pool(a: tuple[np.ndarray, np.ndarray, list[str]], b: tuple[np.ndarray, np.ndarray, list[str]]) -> None:
    """Two :func:`pool_copy` results are bit-identical (NaN-free states compare with ==)."""
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2] == b[2]


@pytest.fixture
def helpers() -> Any:
    """Module-free access to the helper functions above (tests/ is not a package)."""

    class _H:
        without_time = staticmethod(without_time)
        pool_copy = staticmethod(pool_copy)
        assert_same_pool = staticmethod(assert_same_pool)
        config_environ = staticmethod(config_environ)
        TINY_NEURAL = TINY_NEURAL
        SMALL_NEURAL = SMALL_NEURAL

    return _H
