"""``rebalance --haproxy-socket`` switches only to a ring whose health checks pass.

HAProxy puts a server back in service (``set server … state ready``) as up at once, before its first health check.
Here HAProxy's server line for the added replica points to an address where nothing listens, while ``--new`` names
the replica at its real address: the imports succeed, and the ring is the new set for about half a second, until the
first check fails. ``rebalance`` released the moved markets at their old replica on that glimpse: HAProxy then sent
them back there, where they were refused (moved) for good. The switch must wait until the ring holds, and set the
servers back when it does not, leaving the markets frozen (503) at their holder for a run started again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from haproxy_helpers import free_port, needs_haproxy, start_haproxy
from live_helpers import REPO_ROOT, start_all, tick

from cerebellar_norse.scaleout.haproxy import Replica
from cerebellar_norse.scaleout.ring import Ring

pytestmark = [needs_haproxy, pytest.mark.tools, pytest.mark.slow]

TOKEN = "switch-token-8d2"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_new_server_failing_its_first_check_fails_the_switch_and_releases_nothing(tmp_path: Path) -> None:
    r1, r2 = start_all(tmp_path, 2, {"CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN})
    hap = start_haproxy(tmp_path, [Replica(1, "127.0.0.1", r1.port), Replica(2, "127.0.0.1", free_port(), enabled=False)],
                        check_interval_ms=1000)
    try:
        hap.api.wait_ring({1})
        markets = [f"W{k:03d}" for k in range(30)]
        moving = sorted(m for m in markets if Ring({1: 1, 2: 1}).owner(m) == 2)
        r = httpx.post(f"{r1.url}/neural/process/batch", json={"ticks": [tick(m, 0) for m in markets]}, timeout=30)
        assert r.status_code == 200, r.text

        proc = subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "rebalance", "--old", f"1={r1.url}",
                               "--new", f"1={r1.url},2={r2.url}", "--token", TOKEN, "--haproxy-socket",
                               str(hap.api.path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "the switch failed" in proc.stderr and "HAProxy's servers are set back as they were" in proc.stderr
        # nothing released: the markets are frozen at replica 1, where HAProxy routes them again
        moves = httpx.get(f"{r1.url}/neural/moves", headers=AUTH, timeout=30).json()["markets"]
        assert {m["market_id"]: m["state"] for m in moves} == dict.fromkeys(moving, "moving")
        assert {s.server_id: s.admin_word for s in hap.api.servers()} == {1: "ready", 2: "maint"}
    finally:
        hap.stop()
        r1.stop()
        r2.stop()
