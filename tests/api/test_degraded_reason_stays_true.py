"""The reason of a "degraded" /health stays true: a model stored while the untrained network is served is named
(not "no trained model is stored"), and a corrupt active model with nothing else usable names the untrained network
beside it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import Config, load_checked_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.training.checkpoints import SETTLED_NS, ModelStore

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


def _settle(root: Path) -> None:
    """Date the models directory back beyond SETTLED_NS, as if its last change were a minute old."""
    old = time.time_ns() - 60_000_000_000
    os.utime(root, ns=(old, old))


def test_health_lists_the_models_again_only_when_another_process_stored_one(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(tmp_path)
    state = build_service(cfg)
    assert state.store is not None
    state.store.root.mkdir(parents=True, exist_ok=True)
    listings: list[list[str]] = []
    versions = state.store.versions

    def counted() -> list[str]:
        listings.append(versions())
        return listings[-1]

    monkeypatch.setattr(state.store, "versions", counted)
    with TestClient(make_app(state, restore=False, save_on_shutdown=False)) as tc:
        _settle(state.store.root)
        for _ in range(3):
            assert "no trained model is stored" in tc.get("/health").json()["reason"]
        assert listings == [[]]  # the directory did not change: listed once
        ModelStore(tmp_path).save(generate_weights(cfg), cfg, {"validation": {"loss": 0.5}}, version=V)  # another store
        _settle(state.store.root)
        assert V in tc.get("/health").json()["reason"]
        assert V in tc.get("/health").json()["reason"]
        assert listings == [[], [V]]


def test_a_listing_of_a_directory_changed_just_now_is_not_kept(tmp_path: Path) -> None:
    """A second change within the filesystem's timestamp tick can leave st_mtime_ns as it was: list again."""
    store = ModelStore(tmp_path)
    store.root.mkdir(parents=True)
    assert store.versions_now() == []
    (store.root / V).mkdir()
    now = time.time_ns() - SETTLED_NS // 2
    os.utime(store.root, ns=(now, now))
    assert store.versions_now() == [V]
    (store.root / "v2").mkdir()
    os.utime(store.root, ns=(now, now))  # the same mtime: the change does not show in it
    assert store.versions_now() == [V, "v2"]


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
