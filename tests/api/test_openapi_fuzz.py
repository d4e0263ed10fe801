"""The OpenAPI document is exact: schemathesis with every check finds nothing against the real server.

``schemathesis run --checks all`` generates requests from ``/openapi.json`` (valid and
invalid ones, every documented operation, links between them) and checks each answer:
no 5xx, only documented statuses, content types and headers, bodies matching their
schemas, invalid data refused, valid data accepted, auth enforced where declared. It
runs twice, bounded, on one server: without a token (guarded routes open on loopback, no
security declared), then with one added by a reload (security declared and enforced).

Every phase (examples, coverage, fuzzing, stateful) runs in both. The fuzzing budget is
small: each operation's input space is covered by the deterministic coverage phase (its
boundaries, every enum, each field missing or of a wrong type), and a long campaign of
1000 random examples per operation in both modes finds nothing more, so more random
examples here only cost time. The coverage phase sends each value of every enum: the
600 zones of ``POST /training``'s ``data_timezone``, read alike, were half of all its
requests; it gets a sample of them (``schemathesis_hooks.py``).

By hand, against a running service::

    schemathesis run http://127.0.0.1:8080/openapi.json --checks all \\
        -H "Authorization: Bearer $CEREBELLAR_NORSE_SERVER__API_TOKEN"
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from live_helpers import LiveServer

pytest.importorskip("schemathesis")

TOKEN = "fuzz-token-91c2"
SEED = 20261123
WORKERS = 1  # hypothesis reads lambdas with ast.parse, which is not thread-safe on Python 3.11 (SystemError)
EXAMPLES = 5  # random examples per operation in each mode (the coverage phase does the boundaries)
CONFIG = """
[server]
{token}
[paths]
data_dir = "{data}"
"""


SCHEMATHESIS_CONFIG = Path(__file__).with_name("schemathesis.toml")  # what no schema can state (shared with docs/http.md)
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")  # a sample of the 600 zones of POST /training


def schemathesis(url: str, cwd: Path, max_examples: int, headers: list[str]) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(SCHEMATHESIS_CONFIG), "run",
            f"{url}/openapi.json", "--checks", "all",
            "--max-examples", str(max_examples), "--seed", str(SEED), "--no-color", "--workers", str(WORKERS),
            "--request-timeout", "30", "--generation-database", "none"]
    for h in headers:
        args += ["-H", h]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def warm(server: LiveServer) -> None:
    """Compile the kernel variants of multi-tick batches before the fuzzer's first batch (its requests time out at 30 s)."""
    ts = time.time_ns() // 1_000_000 - 60_000
    ticks = [{"price": 1.0, "volume": 1.0, "timestamp": ts + k, "market_id": "WARM"} for k in range(300)]
    assert httpx.post(f"{server.url}/neural/process/batch", json={"ticks": ticks}, timeout=120).status_code == 200


def run_and_check(server: LiveServer, cwd: Path, max_examples: int, headers: list[str]) -> None:
    proc = schemathesis(server.url, cwd, max_examples, headers)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-12000:]
    assert "No issues found" in out or " passed" in out, out[-4000:]
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in out or f"✅  {phase}" in out, out[-4000:]
    log = server.log()
    assert "Traceback" not in log and '"level": "ERROR"' not in log, log[-4000:]


@pytest.mark.slow
def test_schemathesis_finds_nothing(tmp_path: Path, start_server: Callable[..., LiveServer]) -> None:
    """Without a token, then with one added by a reload (one server start for both)."""
    (tmp_path / "data").mkdir()
    cfg = tmp_path / "service.toml"
    cfg.write_text(CONFIG.format(data=tmp_path / "data", token=""))
    server = start_server(tmp_path / "state", args=["--config", str(cfg)])
    doc = httpx.get(f"{server.url}/openapi.json").json()
    assert "securitySchemes" not in doc["components"]
    assert all(op["security"] == [] for item in doc["paths"].values() for op in item.values())  # open, and says so
    warm(server)  # once: the kernels stay compiled across the reload
    run_and_check(server, tmp_path, EXAMPLES, [])

    cfg.write_text(CONFIG.format(data=tmp_path / "data", token=f'api_token = "{TOKEN}"'))
    server.proc.send_signal(signal.SIGHUP)  # adding a token is allowed live
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/models").status_code != 401:
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.05)
    doc = httpx.get(f"{server.url}/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert doc["paths"]["/models"]["get"]["security"] == [{"bearerAuth": []}]
    run_and_check(server, tmp_path, EXAMPLES, [f"Authorization: Bearer {TOKEN}"])
