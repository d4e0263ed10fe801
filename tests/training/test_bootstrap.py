"""First run: a server on an empty state dir trains, stores and serves a default model."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from training_helpers import REPO_ROOT, LiveServer, free_port, server_environ

from cerebellar_norse.api import server as server_mod
from cerebellar_norse.config import Config, load_config
from cerebellar_norse.training.checkpoints import ModelStore

# The real `cerebellar-norse --port P`, with the first-run training made small (the
# shipped constants train about a minute on 40,000 ticks).
LAUNCHER = (
    "import sys\n"
    "import cerebellar_norse.training.bootstrap as b\n"
    "b.BOOTSTRAP_TICKS, b.BOOTSTRAP_MARKETS, b.BOOTSTRAP_EPOCHS, b.BOOTSTRAP_BUDGET_S = 6000, 2, 1, 30.0\n"
    "from cerebellar_norse.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
STARTUP_TIMEOUT_S = 180.0


@pytest.mark.slow
def test_first_run_trains_stores_and_serves_a_default_model(tmp_path: Path) -> None:
    state, log_path = tmp_path / "state", tmp_path / "server.log"
    state.mkdir()
    port = free_port()
    env = server_environ(state, {"CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN": "true"})
    with log_path.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, "--port", str(port)], cwd=REPO_ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    srv = LiveServer(proc, port, state, log_path)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        health = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, srv.log()[-4000:]
            try:
                r = httpx.get(f"{srv.url}/health", timeout=1.0)
                if r.status_code == 200:
                    health = r.json()
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert health is not None, f"not healthy within {STARTUP_TIMEOUT_S}s\n{srv.log()[-4000:]}"
        log = srv.log()
        assert "training the default model" in log
        assert "bootstrap model trained and activated" in log
        store = ModelStore(state)
        (version,) = store.versions()
        assert store.active_version() == version
        assert health["model_version"] == version
        assert (state / "bootstrap" / "ticks.csv").is_file()
        metrics = json.loads((state / "models" / version / "metrics.json").read_text())
        assert metrics["data"]["ticks"] == 6000 and len(metrics["history"]) == 1
        r = httpx.post(f"{srv.url}/neural/process", json={"price": 100.0, "volume": 1000.0, "timestamp": 1640995200000,
                                                          "market_id": "TEST"}, timeout=10.0)
        assert r.status_code == 200 and r.json()["model_version"] == version
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log()[-4000:]


def test_a_stored_model_is_served_without_training_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cerebellar_norse.neurons.topology import generate_weights

    cfg: Config = load_config(None, environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state")})
    assert cfg.training.bootstrap_on_first_run
    store = ModelStore(tmp_path / "state")
    version = store.save(generate_weights(cfg), cfg, {"validation": {"loss": 1.0}})

    def no_training(*_: object) -> None:
        raise AssertionError("trained although a model is stored")

    monkeypatch.setattr(server_mod, "bootstrap_model", no_training)
    model = server_mod.served_model(cfg, store)
    assert model is not None and model.version == version

    off = cfg.model_copy(update={"training": cfg.training.model_copy(update={"bootstrap_on_first_run": False})})
    assert server_mod.served_model(off, ModelStore(tmp_path / "empty")) is None  # the untrained network
