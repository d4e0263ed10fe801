"""Activating a model ends a "degraded" /health, also when it is the model already served as the fallback."""

from __future__ import annotations

import shutil
from pathlib import Path

from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP
from prometheus_client.parser import text_string_to_metric_families

from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.training.checkpoints import ModelStore

TOKEN = "degraded-token-1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
V = "20250101T000000Z-only00"


def _gauges(tc: TestClient) -> dict[str, float]:
    """The /health gauges of GET /metrics, by name."""
    families = text_string_to_metric_families(tc.get("/metrics").text)
    wanted = ("cerebellar_norse_ready", "cerebellar_norse_degraded")
    return {s.name: s.value for f in families for s in f.samples if s.name in wanted}


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


def test_untrained_network_is_degraded_until_a_model_is_activated(tmp_path: Path) -> None:
    env = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path), "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN, **NO_BOOTSTRAP}
    cfg = load_checked_config(None, environ=env)
    with TestClient(make_app(build_service(cfg), restore=False, save_on_shutdown=False)) as tc:
        r = tc.get("/health")
        body = r.json()
        assert r.status_code == 200  # still ready: load balancers keep it, operators see why it is degraded
        assert body["status"] == "degraded" and body["model_version"] == f"seed-{cfg.neural.seed}", body
        assert "untrained network of seed" in body["reason"] and "carry no information" in body["reason"], body
        assert _gauges(tc) == {"cerebellar_norse_ready": 1.0, "cerebellar_norse_degraded": 1.0}
        ModelStore(tmp_path).save(generate_weights(cfg), cfg, {"validation": {"loss": 0.5}}, version=V)
        r = tc.post(f"/models/{V}/activate", headers=AUTH)
        assert r.status_code == 200, r.text
        body = tc.get("/health").json()
        assert body["status"] == "ok" and body["model_version"] == V and "reason" not in body, body
        assert _gauges(tc) == {"cerebellar_norse_ready": 1.0, "cerebellar_norse_degraded": 0.0}


def test_untrained_network_and_lost_market_state_both_named(tmp_path: Path) -> None:
    env = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path), "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN, **NO_BOOTSTRAP}
    cfg = load_checked_config(None, environ=env)
    ModelStore(tmp_path).save(generate_weights(cfg), cfg, {"validation": {"loss": 0.5}}, version=V)
    tick = {"price": 100.0, "volume": 1000.0, "timestamp": 1640995200000, "market_id": "LOST"}
    with TestClient(make_app(build_service(cfg))) as tc:  # serves V, saves the market's state with V at shutdown
        assert tc.get("/health").json()["model_version"] == V
        assert tc.post("/neural/process", json=tick).status_code == 200
    shutil.rmtree(tmp_path / "models")  # V is gone: the untrained network is served, the saved states cannot be
    with TestClient(make_app(build_service(cfg), save_on_shutdown=False)) as tc:
        body = tc.get("/health").json()
        assert body["status"] == "degraded" and body["model_version"] == f"seed-{cfg.neural.seed}", body
        assert "untrained network of seed" in body["reason"], body
        assert f"market state was saved with model {V}" in body["reason"], body
        later = "20250102T000000Z-later0"  # stored meanwhile (activation off): the reason names it, beside the state
        ModelStore(tmp_path).save(generate_weights(cfg), cfg, {"validation": {"loss": 0.5}}, version=later)
        reason = tc.get("/health").json()["reason"]
        assert "no trained model is stored" not in reason and later in reason, reason
        assert f"market state was saved with model {V}" in reason, reason


def test_a_stored_model_never_activated_is_served_degraded(tmp_path: Path) -> None:
    """A model stored without activation (a job with ``activate: never``, a staged upload) is served when nothing is
    active, as the newest valid one, and /health says that no model was chosen."""
    env = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path), "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN, **NO_BOOTSTRAP}
    cfg = load_checked_config(None, environ=env)
    ModelStore(tmp_path).save(generate_weights(cfg), cfg, {"validation": {"loss": 0.5}}, version=V)
    assert not (tmp_path / "models" / "ACTIVE").exists()
    with TestClient(make_app(build_service(cfg), restore=False, save_on_shutdown=False)) as tc:
        body = tc.get("/health").json()
        assert body["status"] == "degraded" and body["model_version"] == V, body
        assert "no model was activated" in body["reason"] and V in body["reason"], body
        assert tc.post(f"/models/{V}/activate", headers=AUTH).status_code == 200
        assert tc.get("/health").json()["status"] == "ok"
    assert ModelStore(tmp_path).active_version() == V
