"""GET /models and a model's activation read and hash stored models in a worker thread, not on the event loop.

(A production network's model is tens of MB: verifying a few of them on the event loop
held every tick for as long.)
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.training.checkpoints import ModelStore

VA, VB = "20240101T000000Z-aaaaaa", "20240102T000000Z-bbbbbb"


def test_stored_models_are_verified_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path), **NO_BOOTSTRAP}
    cfg = load_checked_config(None, environ=environ)
    store = ModelStore(tmp_path)
    w = generate_weights(cfg)
    for version in (VA, VB):
        store.save(w, cfg, {"validation": {"loss": 1.0}}, version=version)
    store.set_active(VA)
    app = make_app(build_service(cfg), restore=False, save_on_shutdown=False)
    loaded_on: list[str] = []
    load = ModelStore.load

    def recording_load(self: ModelStore, version: str) -> Any:
        loaded_on.append(threading.current_thread().name)
        return load(self, version)

    with TestClient(app) as client:
        loop_thread = client.portal.call(lambda: threading.current_thread().name)  # type: ignore[union-attr]
        monkeypatch.setattr(ModelStore, "load", recording_load)
        r = client.get("/models")
        assert r.status_code == 200 and [m["version"] for m in r.json()["models"]] == [VA, VB]
        assert all(m["valid"] for m in r.json()["models"])
        listed = len(loaded_on)
        r = client.post(f"/models/{VB}/activate")
        assert r.status_code == 200 and r.json() == {"active": VB}
        assert client.get("/health").json()["model_version"] == VB
    assert listed == 2 and len(loaded_on) == 3
    assert loop_thread not in loaded_on, (loop_thread, loaded_on)
