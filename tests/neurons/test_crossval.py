"""Cross-validation of the fused kernel against the Norse reference, and proof that the check can fail."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from cerebellar_norse.config import Config
from cerebellar_norse.neurons import crossval as crossval_module
from cerebellar_norse.neurons.crossval import POPULATION_FIELDS, TOLERANCE, crossval, run_crossval_command
from cerebellar_norse.neurons.network import CerebellarNetwork
from cerebellar_norse.neurons.topology import Weights
from cerebellar_norse.synthetic import generate_ticks

ConfigFactory = Any


def _assert_batches_repeat_markets(ticks: int, markets: int, seed: int, batch: int) -> None:
    stream = generate_ticks(ticks, markets, seed)
    repeated = sum(
        1 for start in range(0, ticks, batch)
        if len({t["market_id"] for t in stream[start:start + batch]}) < len(stream[start:start + batch])
    )
    assert repeated > 0


@pytest.mark.parametrize(("seed", "markets"), [(1, 3), (2, 5), (3, 7)])
def test_float64_crossval_passes(small_config: Config, seed: int, markets: int) -> None:
    _assert_batches_repeat_markets(240, markets, seed, 8)
    rep = crossval(small_config, ticks=240, markets=markets, precision="float64", seed=seed, batch=8)
    assert rep.passed and rep.first_divergence is None, rep.first_divergence
    assert set(rep.max_abs_diff) == set(POPULATION_FIELDS)
    assert max(rep.max_abs_diff.values()) < 1e-4
    assert max(rep.max_abs_diff.values()) < 1e-9  # float64: only rounding of different summation orders
    assert rep.spike_flips == {"granule": 0, "purkinje": 0, "dcn": 0}


def test_float64_crossval_passes_on_the_default_network(make_config: ConfigFactory) -> None:
    rep = crossval(make_config(), ticks=200, markets=4, precision="float64", seed=11, batch=16)
    assert rep.passed, rep.first_divergence
    assert max(rep.max_abs_diff.values()) < 1e-4


@pytest.mark.parametrize("config_name", ["small_config", "default"])
def test_float32_drift_before_any_spike_flip_is_within_tolerance(config_name: str, small_config: Config,
                                                                   make_config: ConfigFactory) -> None:
    cfg = small_config if config_name == "small_config" else make_config()
    rep = crossval(cfg, ticks=200, markets=4, precision="float32", seed=5, batch=8)
    assert rep.precision == "float32"
    for pop, d in rep.max_abs_diff_before_flip.items():
        assert d < TOLERANCE, f"{pop}: float32 drift {d:.3e} before the first spike flip"
    if rep.first_spike_flip is None:
        assert rep.passed and rep.max_abs_diff == rep.max_abs_diff_before_flip


def test_cli_crossval_json(run_cli: Any) -> None:
    proc = run_cli("crossval", "--ticks", "300", "--json")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    out = json.loads(lines[0])
    assert isinstance(out, dict)
    assert {"ticks", "max_abs_diff", "first_divergence"} <= set(out)
    assert out["ticks"] == 300
    assert set(out["max_abs_diff"]) == {"granule", "purkinje", "dcn", "outputs"}
    assert all(isinstance(v, float) and 0.0 <= v < TOLERANCE for v in out["max_abs_diff"].values())
    assert out["first_divergence"] is None


def _perturbed(w: Weights, scale: float = 1.05) -> Weights:
    bad = w.copy()
    bad.pf_w *= scale
    bad.w_pd *= scale
    return bad


def test_networks_with_different_weights_are_told_apart(small_config: Config) -> None:
    """The comparison the crossval makes can fail: a reference with perturbed weights drifts away."""
    cfg = small_config.model_copy(update={"neural": small_config.neural.model_copy(update={"precision": "float64"})})
    fused = CerebellarNetwork(cfg, backend="fused", max_markets=4)
    good = CerebellarNetwork(cfg, backend="reference", weights=fused.weights, max_markets=4)
    bad = CerebellarNetwork(cfg, backend="reference", weights=_perturbed(fused.weights), max_markets=4)
    stream = generate_ticks(40, 3, 9)
    for start in range(0, len(stream), 8):
        chunk = stream[start:start + 8]
        fused.process_batch(chunk)
        good.process_batch(chunk)
        bad.process_batch(chunk)

    def worst(other: CerebellarNetwork) -> float:
        return max(
            float(np.max(np.abs(getattr(fused.pool.arrays, name) - getattr(other.pool.arrays, name))))
            for names in POPULATION_FIELDS.values() for name in names
        )

    assert worst(good) < 1e-9
    assert worst(bad) > TOLERANCE


@pytest.fixture
def broken_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make crossval build its reference network from perturbed weights."""
    real = CerebellarNetwork

    def build(cfg: Config, backend: str = "fused", weights: Weights | None = None, **kw: Any) -> CerebellarNetwork:
        if backend == "reference" and weights is not None:
            weights = _perturbed(weights)
        return real(cfg, backend=backend, weights=weights, **kw)

    monkeypatch.setattr(crossval_module, "CerebellarNetwork", build)


@pytest.mark.usefixtures("broken_reference")
def test_crossval_reports_a_broken_reference(small_config: Config, capsys: pytest.CaptureFixture[str]) -> None:
    rep = crossval(small_config, ticks=80, markets=3, precision="float64", seed=1, batch=8)
    assert not rep.passed
    assert rep.first_divergence is not None
    assert rep.first_divergence["abs_diff"] > TOLERANCE
    assert rep.first_divergence["population"] in POPULATION_FIELDS
    assert rep.first_divergence["market_id"].startswith("M")
    assert run_crossval_command(small_config, 80, 3, "float64", 1, as_json=True) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is False and out["first_divergence"] is not None
