"""A degraded /health whose stored models were all refused at start (a corrupt active model; models of the old size
after a change of [neural], the operations guide's emergency procedure) does not claim that they were never activated,
nor that activating one or a restart would serve it: neither would."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.degradation import untrained_reason
from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import Config, load_checked_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.training.checkpoints import ModelStore

V = "20250101T000000Z-stored"


def _cfg(tmp_path: Path, **env: str) -> Config:
    return load_checked_config(None, environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path), **NO_BOOTSTRAP, **env})


def _stored_active(tmp_path: Path, cfg: Config) -> ModelStore:
    store = ModelStore(tmp_path)
    store.save(generate_weights(cfg), cfg, {"validation": {"loss": 0.5}}, version=V)
    store.set_active(V)
    return store


def _assert_refused_reason(reason: str) -> None:
    assert "none activated" not in reason and "a restart would serve" not in reason, reason
    assert "no stored model can be served" in reason and V in reason and "refused at start" in reason, reason
    assert "untrained network of seed" in reason and "carry no information" in reason, reason


def test_model_of_another_network_size_is_not_called_never_activated(tmp_path: Path) -> None:
    _stored_active(tmp_path, _cfg(tmp_path))
    smaller = _cfg(tmp_path, CEREBELLAR_NORSE_NEURAL__GRANULE_SIZE="256")
    with TestClient(make_app(build_service(smaller), restore=False, save_on_shutdown=False)) as tc:
        body = tc.get("/health").json()
        assert body["status"] == "degraded" and body["model_version"] == f"seed-{smaller.neural.seed}", body
        assert body["reason"].startswith(f"active model {V} does not fit this config"), body
        _assert_refused_reason(body["reason"])
        assert tc.post(f"/models/{V}/activate").status_code == 422  # what the old reason told operators to do


def test_a_usable_model_stored_later_is_still_named_beside_the_refused_ones() -> None:
    reason = untrained_reason(42, "seed-42", ["a", "b"], refused=("a",))
    assert "1 trained model is stored (newest b), none activated (1 more refused at start" in reason, reason
    assert untrained_reason(42, "seed-42", ["a"]).startswith("no trained model is activated")  # unchanged otherwise


def test_a_corrupt_active_model_is_not_replaced_by_first_run_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With training.bootstrap_on_first_run on (the built-in default), a state dir whose only model is corrupt is no
    first run: no model is trained on generated data and activated over it; models/ACTIVE is left as it was."""
    import cerebellar_norse.api.server as server_mod

    def no_bootstrap(*args: object) -> None:
        raise AssertionError("first-run training on a state dir that holds models")

    monkeypatch.setattr(server_mod, "bootstrap_model", no_bootstrap)
    cfg = _cfg(tmp_path, CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN="true")
    assert cfg.training.bootstrap_on_first_run
    store = _stored_active(tmp_path, cfg)
    weights = store.root / V / "weights.npz"
    weights.write_bytes(weights.read_bytes()[:-10])  # cut short
    with TestClient(make_app(build_service(cfg), restore=False, save_on_shutdown=False)) as tc:
        body = tc.get("/health").json()
        assert body["status"] == "degraded" and body["model_version"] == f"seed-{cfg.neural.seed}", body
        _assert_refused_reason(body["reason"])
    assert ModelStore(tmp_path).active_version() == V
    assert ModelStore(tmp_path).versions() == [V]
