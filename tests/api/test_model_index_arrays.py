"""Models whose connectivity names cells that do not exist: refused on upload, activation and start, never run.

Such a model carries correct checksums (anyone can write a manifest); only the weights
check stands between its index arrays and the kernels, which read them unchecked.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.deps import ServiceState, current_reason
from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.neurons.topology import Weights, generate_weights
from cerebellar_norse.storage import seal
from cerebellar_norse.training.archive import MEDIA_TYPE, pack_model
from cerebellar_norse.training.checkpoints import FILES, MANIFEST, ModelStore

TOKEN = "index-token-5c1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BLOB = {**AUTH, "Content-Type": MEDIA_TYPE}
GOOD, CRAFTED = "20250101T000000Z-good00", "20250102T000000Z-crafty"
TICK = {"price": 100.0, "volume": 1000.0, "timestamp": 1640995200000, "market_id": "IDX"}
CSR = {"CEREBELLAR_NORSE_NEURAL__GRANULE_SIZE": "131072"}  # granule x Purkinje above the dense limit: the CSR kernel


def _environ(root: Path, env: dict[str, str]) -> dict[str, str]:
    return {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(root), "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN,
            **NO_BOOTSTRAP, **env}


def _service(root: Path, env: dict[str, str]) -> ServiceState:
    return build_service(load_checked_config(None, environ=_environ(root, env)))


def _save(root: Path, version: str, env: dict[str, str], change: Callable[[Weights], None] | None = None) -> Path:
    """A model saved with correct checksums into ``root``'s store, its weights changed by ``change`` first."""
    cfg = load_checked_config(None, environ=_environ(root, env))
    w = generate_weights(cfg)
    if change is not None:
        change(w)
    store = ModelStore(root)
    store.save(w, cfg, {"validation": {"loss": 0.5}}, version=version)
    return store.root / version


def _archive(path: Path) -> bytes:
    """The archive of a model directory as :func:`pack_model` writes it, without verifying the model first."""
    buf = io.BytesIO()
    np.savez(buf, **{n: np.frombuffer((path / n).read_bytes(), dtype=np.uint8) for n in (*FILES, MANIFEST)})  # type: ignore[arg-type]
    return seal(buf.getvalue())


def _fill(name: str, value: int) -> Callable[[Weights], None]:
    def apply(w: Weights) -> None:
        getattr(w, name)[:] = value
    return apply


@pytest.mark.parametrize(("env", "name", "value"), [({}, "pf_src", 10**9), (CSR, "pf_post", 2**30)],
                         ids=["dense pf_src", "csr pf_post"])
def test_upload_of_a_model_with_out_of_range_indices_is_422_and_stores_nothing(
        tmp_path: Path, env: dict[str, str], name: str, value: int) -> None:
    crafted = _save(tmp_path / "src", CRAFTED, env, _fill(name, value))
    archive = _archive(crafted)
    assert _archive(_save(tmp_path / "src", GOOD, env)) == pack_model(tmp_path / "src" / "models" / GOOD)
    with TestClient(make_app(_service(tmp_path / "replica", env), restore=False, save_on_shutdown=False)) as tc:
        r = tc.put(f"/models/{CRAFTED}", content=archive, headers=BLOB)
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        assert message.startswith(f"request body: weights.npz: {name}[0] = {value} is out of range"), message
        assert tc.get("/models", headers=AUTH).json() == {"active": "seed-42", "models": []}
        assert tc.post(f"/models/{CRAFTED}/activate", headers=AUTH).status_code == 404
        assert tc.post("/neural/process", json=TICK).status_code == 200  # still serving the network it had
    assert not (tmp_path / "replica" / "models" / "ACTIVE").exists()
    assert not list((tmp_path / "replica" / "models").glob(".tmp-*"))


def test_activating_a_stored_model_with_bad_indices_is_422_and_changes_nothing(tmp_path: Path) -> None:
    """A model put into models/ by other means than the upload is verified again when activated."""
    root = tmp_path / "replica"
    _save(root, GOOD, {})
    ModelStore(root).set_active(GOOD)
    with TestClient(make_app(_service(root, {}), restore=False, save_on_shutdown=False)) as tc:
        _save(root, CRAFTED, {}, _fill("pf_src", 10**9))
        r = tc.post(f"/models/{CRAFTED}/activate", headers=AUTH)
        assert r.status_code == 422, r.text
        assert "pf_src[0] = 1000000000 is out of range" in r.json()["error"]["message"], r.text
        assert tc.get("/health").json()["model_version"] == GOOD
        assert tc.post("/neural/process", json=TICK).status_code == 200
    assert ModelStore(root).active_version() == GOOD


@pytest.mark.parametrize(("env", "name", "value"), [({}, "pf_src", 10**9), (CSR, "pf_post", 2**30)],
                         ids=["dense pf_src", "csr pf_post"])
def test_start_skips_a_newest_model_with_bad_indices(tmp_path: Path, env: dict[str, str], name: str, value: int) -> None:
    """The newest model (no ACTIVE file) is refused at start, and the valid one before it is served."""
    root = tmp_path / "state"
    _save(root, GOOD, env)
    _save(root, CRAFTED, env, _fill(name, value))
    state = _service(root, env)
    assert state.engine.model_version == GOOD
    reason = current_reason(state)  # no ACTIVE file: served, but never activated (not that it was refused)
    assert reason is not None and reason.startswith("no model was activated"), reason


def test_start_skips_a_model_whose_engine_cannot_be_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever stops the engine of the active model from being built, the next valid model is served (degraded)."""
    import cerebellar_norse.api.server as server_mod

    root = tmp_path / "state"
    _save(root, GOOD, {})
    _save(root, CRAFTED, {})
    ModelStore(root).set_active(CRAFTED)
    real = server_mod.build_engine

    def build(cfg: object, device: str, weights: object, version: str) -> object:
        if version == CRAFTED:
            raise ValueError("more parallel-fibre synapses than the kernel's 32-bit indices hold")
        return real(cfg, device, weights, version)  # type: ignore[arg-type]

    monkeypatch.setattr(server_mod, "build_engine", build)
    state = _service(root, {})
    assert state.engine.model_version == GOOD
    reason = current_reason(state)
    assert reason is not None and f"active model {CRAFTED} cannot be served (ValueError: more" in reason, reason
