"""SIGHUP reloads the config file: live-safe keys apply, others are reported as needing a restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from cerebellar_norse.api.lifecycle import LIVE_KEYS, changed_keys
from cerebellar_norse.config import load_config

BASE = """
[server]
port = {port}
[performance]
queue_size = 4096
[logging]
level = "INFO"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_changed_keys_lists_dotted_keys(tmp_path: Path) -> None:
    a = load_config(environ={})
    b = load_config(environ={"CEREBELLAR_NORSE_LOGGING__LEVEL": "DEBUG", "CEREBELLAR_NORSE_NEURAL__GRANULE_SIZE": "256",
                             "CEREBELLAR_NORSE_SERVER__API_TOKEN": "t"})
    assert changed_keys(a, b) == ["logging.level", "neural.granule_size", "server.api_token"]
    assert "logging.level" in LIVE_KEYS and "neural.granule_size" not in LIVE_KEYS


def test_sighup_applies_live_keys_and_reports_the_rest(tmp_path: Path) -> None:
    port = _free_port()
    cfg = tmp_path / "service.toml"
    cfg.write_text(BASE.format(port=port))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEREBELLAR_NORSE_")}
    env.update(CEREBELLAR_NORSE_PATHS__STATE_DIR=str(tmp_path / "state"), CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN="false")
    proc = subprocess.Popen([sys.executable, "-m", "cerebellar_norse.cli", "--config", str(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise AssertionError("service did not become ready")
        cfg.write_text(BASE.format(port=port).replace("queue_size = 4096", "queue_size = 1000\nmax_markets = 8")
                       .replace('level = "INFO"', 'level = "DEBUG"'))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()["queue_capacity"] == 1000:
                break
            time.sleep(0.1)
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()
        assert health["queue_capacity"] == 1000
        assert health["pool"]["capacity"] != 8  # max_markets needs a restart
        cfg.write_text("[server\n")  # invalid: refused, running config kept
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    reloaded = [x for x in lines if x["message"] == "config reloaded"]
    assert reloaded, out
    assert set(reloaded[0]["fields"]["applied"]) == {"logging.level", "performance.queue_size"}
    assert reloaded[0]["fields"]["need_restart"] == ["performance.max_markets"]
    assert any(x["message"].startswith("config reload refused") for x in lines)
