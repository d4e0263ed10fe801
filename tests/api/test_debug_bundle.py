"""``cerebellar-norse debug-bundle`` against a running service."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx
from live_helpers import REPO_ROOT, LiveServer, server_environ, tick


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_bundle_snapshots_the_running_service(live: LiveServer, tmp_path: Path) -> None:
    httpx.post(f"{live.url}/neural/process", json=tick("BUNDLE"), timeout=5).raise_for_status()
    out = tmp_path / "bundle.tar.gz"
    env = server_environ(live.state_dir, {"CEREBELLAR_NORSE_SERVER__API_TOKEN": "s3cret"})
    r = subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "debug-bundle", "--output", str(out), "--url", live.url],
                       cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    files = _members(out)
    assert {"config.json", "versions.json", "models.json", "service/health.json", "service/metrics.txt",
            "service/neural_metrics.json"} <= set(files)
    cfg = json.loads(files["config.json"])
    assert cfg["config"]["server"]["api_token"] == "***"
    assert b"s3cret" not in b"".join(files.values())
    assert json.loads(files["service/health.json"])["status"] == "ok"
    assert b"processing_duration_seconds_bucket" in files["service/metrics.txt"]
    assert json.loads(files["versions.json"])["torch"]


def test_bundle_without_a_service_still_writes_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "b.tar.gz"
    env = server_environ(tmp_path / "state")
    r = subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "--port", "1", "debug-bundle", "--output", str(out)],
                       cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    files = _members(out)
    assert "config.json" in files and "service/health.json.error" in files
