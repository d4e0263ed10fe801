"""The reason of a "degraded" /health stays true: a model stored while the untrained network is served is named
(not "no trained model is stored"), and a corrupt active model with nothing else usable names the untrained network
beside it."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import Config, load_checked_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.training.checkpoints import ModelStore

V = "20250101T000000Z-stored"


def _cfg(tmp_path: Path) -> Config:
    env = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path), **NO_BOOTSTRAP}
    return load_checked_config(None, environ=env)


def test_a_model_stored_while_the_untrained_network_is_served_is_named(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    with TestClient(make_app(build_service(cfg), restore=False, save_on_shutdown=False)) as tc:
        assert "no trained model is stored" in tc.get("/health").json()["reason"]
        # a job with activate "never", or PUT /models/{version}: stored, not activated
        ModelStore(tmp_path).save(generate_weights(cfg), cfg, {"validation": {"loss": 0.5}}, version=V)
        body = tc.get("/health").json()
        assert body["status"] == "degraded" and body["model_version"] == f"seed-{cfg.neural.seed}", body
        assert "no trained model is stored" not in body["reason"], body
        assert "carry no information" in body["reason"] and V in body["reason"], body


def test_corrupt_active_model_and_nothing_else_names_the_untrained_network(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    store = ModelStore(tmp_path)
    store.save(generate_weights(cfg), cfg, {"validation": {"loss": 0.5}}, version=V)
    store.set_active(V)
    weights = store.root / V / "weights.npz"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0xFF
    weights.write_bytes(bytes(data))
    with TestClient(make_app(build_service(cfg), restore=False, save_on_shutdown=False)) as tc:
        body = tc.get("/health").json()
        assert body["status"] == "degraded" and body["model_version"] == f"seed-{cfg.neural.seed}", body
        reason = body["reason"]
        assert reason.startswith(f"active model {V} is corrupt"), body  # docs/operations.md: that reason first
        # the model is stored but was refused: neither "never activated" nor "a restart would serve it"
        assert "no stored model can be served" in reason and "refused at start" in reason, body
        assert "none activated" not in reason and "a restart would serve" not in reason, body
        assert "untrained network of seed" in reason and "carry no information" in reason, body
