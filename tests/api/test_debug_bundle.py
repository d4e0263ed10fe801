"""``cerebellar-norse debug-bundle`` against a running service."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import httpx
from live_helpers import REPO_ROOT, LiveServer, server_environ, tick


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def _bundle(tmp_path: Path, *args: str, env: dict[str, str] | None = None, name: str = "bundle.tar.gz",
            ) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / name
    r = subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", *args, "--output", str(out)], cwd=REPO_ROOT, env=server_environ(tmp_path / "state", env), capture_output=True, text=True,
                       timeout=120)
    return r, out


def test_bundle_snapshots_the_running_service(live: LiveServer, tmp_path: Path) -> None:
    for k in range(3):
        httpx.post(f"{live.url}/neural/process", json=tick("BUNDLE", k), timeout=5).raise_for_status()
    httpx.post(f"{live.url}/neural/process", json=tick("BUNDLE/2", 0), timeout=5).raise_for_status()
    r, out = _bundle(tmp_path, "debug-bundle", "--url", live.url, env={"CEREBELLAR_NORSE_SERVER__API_TOKEN": "s3cret"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out) and r.stderr == ""
    files = _members(out)
    assert {"config.json", "versions.json", "models.json", "service/health.json", "service/metrics.txt",
            "service/neural_metrics.json", "service/config.json", "service/backtrace.json", "service/backtrace.txt",
            "service/markets.json", "summary.json"} <= set(files)
    cfg = json.loads(files["config.json"])
    assert cfg["config"]["server"]["api_token"] == "***"
    assert b"s3cret" not in b"".join(files.values())
    health = json.loads(files["service/health.json"])  # the live service serves the untrained network
    assert health["status"] == "degraded" and health["model_version"] == "seed-42", health
    assert b"processing_duration_seconds_bucket" in files["service/metrics.txt"]
    assert json.loads(files["versions.json"])["torch"]
    assert "MainThread" in files["service/backtrace.txt"].decode()
    busiest = json.loads(files["service/markets.json"])["markets"]
    assert busiest[0] == {"market_id": "BUNDLE", "ticks_seen": 3, "last_timestamp": tick("BUNDLE", 2)["timestamp"]}
    dumps = {json.loads(v)["market_id"]: json.loads(v) for k, v in files.items() if k.startswith("service/markets/")}
    assert {"BUNDLE", "BUNDLE/2"} <= set(dumps) and "service/markets/01-BUNDLE.json" in files
    assert dumps["BUNDLE"]["warmup"]["ticks_seen"] == 3
    slow = json.loads(files["service/slow_requests.json"])
    assert slow["order"] == "slowest" and len(slow["requests"]) >= 4
    totals = [t["total_us"] for t in slow["requests"]]
    assert totals == sorted(totals, reverse=True) and {t["route"] for t in slow["requests"]} == {"/neural/process"}
    assert files["service/slow_requests.txt"].decode().count("received") == len(slow["requests"])
    summary = json.loads(files["summary.json"])
    assert summary["failed"] == [] and summary["parts"]["service/backtrace.json"] == "ok"


def test_bundle_of_a_service_with_a_token_never_holds_the_token(start_server: Any, tmp_path: Path) -> None:
    token = "bundle-Secret-7d1e"
    srv = start_server(tmp_path / "svc", env={"CEREBELLAR_NORSE_SERVER__API_TOKEN": token})
    httpx.post(f"{srv.url}/neural/process", json=tick("TOK", 0), timeout=5).raise_for_status()
    log = tmp_path / "app.log"  # a log line that (wrongly) holds the token must not carry it into the bundle
    log.write_text(f'{{"message": "Authorization: Bearer {token}"}}\n{{"message": "{json.dumps(token)[1:-1]}"}}\n')
    env = {"CEREBELLAR_NORSE_SERVER__API_TOKEN": token, "CEREBELLAR_NORSE_LOGGING__FILE": str(log)}
    r, out = _bundle(tmp_path, "debug-bundle", "--url", srv.url, env=env)
    assert r.returncode == 0, r.stderr
    files = _members(out)
    blob = b"".join(files.values())
    assert token.encode() not in blob and token.lower().encode() not in blob.lower()
    assert json.loads(files["service/config.json"])["config"]["server"]["api_token"] == "***"
    assert json.loads(files["service/markets.json"])["markets"][0]["market_id"] == "TOK"
    assert b"Bearer ***" in files["logs/application.log"]
    assert json.loads(files["summary.json"])["secrets_scrubbed_from_files"] == 1
    with tarfile.open(out, "r:gz") as tar:  # member names neither
        assert all(token not in m.name for m in tar.getmembers())

    # the wrong token: the guarded parts fail, by name, and the exit code says so
    r, out = _bundle(tmp_path, "debug-bundle", "--url", srv.url, env={"CEREBELLAR_NORSE_SERVER__API_TOKEN": "wrong-one"},
                     name="b2.tar.gz")
    assert r.returncode == 1
    assert "debug-bundle: service/backtrace.json: GET /debug/backtrace answered 401" in r.stderr
    assert "wrong-one" not in r.stderr and token not in r.stderr
    files = _members(out)
    assert "service/health.json" in files and "service/backtrace.json" not in files
    assert "service/config.json" in json.loads(files["summary.json"])["failed"]
    assert token.encode() not in b"".join(files.values())


def test_bundle_fails_naming_the_part_when_the_service_is_unreachable(tmp_path: Path) -> None:
    r, out = _bundle(tmp_path, "--port", "1", "debug-bundle")  # the default URL: http://127.0.0.1:1
    assert r.returncode == 1
    assert r.stdout.strip() == str(out)  # the rest is still written
    assert "debug-bundle: service/health.json: cannot reach the service at http://127.0.0.1:1" in r.stderr
    assert "part(s) failed" in r.stderr and "Traceback" not in r.stderr
    files = _members(out)
    assert "config.json" in files and "models.json" in files and "service/health.json" not in files
    summary = json.loads(files["summary.json"])
    assert summary["failed"] == ["service/health.json"]
    assert summary["parts"]["service/backtrace.json"].startswith("skipped: service at http://127.0.0.1:1 unreachable")


def test_bundle_without_a_service_when_asked(tmp_path: Path) -> None:
    r, out = _bundle(tmp_path, "--port", "1", "debug-bundle", "--url", "none")
    assert r.returncode == 0, r.stderr
    files = _members(out)
    assert not any(k.startswith("service/") for k in files)
    assert json.loads(files["summary.json"])["parts"]["service"] == "skipped: --url none"


def test_the_default_url_of_an_ipv6_host_is_a_url(tmp_path: Path) -> None:
    """With ``server.host = "::1"`` the bundle looks for the service at ``http://[::1]:PORT`` (it was
    ``http://::1:PORT``, not a URL)."""
    r, _ = _bundle(tmp_path, "--host", "::1", "--port", "1", "debug-bundle")
    assert r.returncode == 1
    assert "cannot reach the service at http://[::1]:1" in r.stderr and "is not a URL" not in r.stderr
