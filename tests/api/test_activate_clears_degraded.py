"""Activating a model ends a "degraded" /health, also when it is the model already served as the fallback."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.training.checkpoints import ModelStore

TOKEN = "degraded-token-1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
V = "20250101T000000Z-only00"


def test_activating_the_served_fallback_clears_degraded(tmp_path: Path) -> None:
    env = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path), "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN, **NO_BOOTSTRAP}
    cfg = load_checked_config(None, environ=env)
    store = ModelStore(tmp_path)
    store.save(generate_weights(cfg), cfg, {"validation": {"loss": 0.5}}, version=V)
    (store.root / "ACTIVE").write_text("garbage!!\n")  # damaged: the only (newest) model is served, degraded
    with TestClient(make_app(build_service(cfg), restore=False, save_on_shutdown=False)) as tc:
        body = tc.get("/health").json()
        assert body["status"] == "degraded" and body["model_version"] == V, body
        r = tc.post(f"/models/{V}/activate", headers=AUTH)
        assert r.status_code == 200, r.text
        body = tc.get("/health").json()
        assert body["status"] == "ok", body  # docs/operations.md: activating a model clears it
    assert ModelStore(tmp_path).active_version() == V
