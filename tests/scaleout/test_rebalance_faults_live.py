"""``cerebellar-norse rebalance`` interrupted by faults, on real replicas: it finishes when run again, and never leaves
a market refused for good.

* A switch that fails (here ``--switch-command false``) after the states were imported leaves the moved markets
  frozen at their old replicas (503, never a wrong answer), says to run the same command again, and that run finishes
  the move: the frozen copies left at the old replicas are released, not kept frozen as "older copies".
* A target killed (SIGKILL) in the middle of the moves: the moves are given back, every market served again at its
  holder, though the dead target's copies cannot be forgotten; the error names what was left.
* A replica of ``--new`` serving another model: refused before any market is frozen, naming each replica's model.

The switch is ``--switch-command`` (exit 0: HAProxy routes by the new list), so HAProxy itself is not needed: the
ticks go to the replicas directly.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from live_helpers import REPO_ROOT, LiveServer, start_all, tick

from cerebellar_norse.config import load_checked_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.scaleout.ring import Ring
from cerebellar_norse.training.checkpoints import ModelStore

pytestmark = [pytest.mark.slow]

TOKEN = "faults-token-5c1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ENV = {"CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN}


def rebalance(old: str, new: str, switch: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "rebalance", "--old", old, "--new", new,
                           "--token", TOKEN, "--switch-command", switch, *extra], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)


def feed(srv: LiveServer, markets: list[str], ticks: int) -> None:
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        for k in range(ticks):
            r = http.post("/neural/process/batch", json={"ticks": [tick(m, k) for m in markets]})
            assert r.status_code == 200, r.text


def held(srv: LiveServer) -> dict[str, int]:
    body = httpx.get(f"{srv.url}/debug/markets", params={"limit": 10_000}, headers=AUTH, timeout=30).json()
    return {m["market_id"]: m["ticks_seen"] for m in body["markets"]}


def refused(srv: LiveServer) -> dict[str, str]:
    body = httpx.get(f"{srv.url}/neural/moves", headers=AUTH, timeout=30).json()
    return {m["market_id"]: m["state"] for m in body["markets"]}


def test_a_failed_switch_keeps_the_markets_frozen_and_a_second_run_finishes_the_move(tmp_path: Path) -> None:
    r1, r2 = start_all(tmp_path, 2, ENV)
    try:
        ring = Ring({1: 1, 2: 1})
        markets = [f"S{k:03d}" for k in range(40)]
        on1 = [m for m in markets if ring.owner(m) == 1]
        on2 = [m for m in markets if ring.owner(m) == 2]
        feed(r1, on1, 3)
        feed(r2, on2, 3)
        old, new = f"1={r1.url},2={r2.url}", f"1={r1.url}"  # replica 2 leaves: its markets move to replica 1

        first = rebalance(old, new, "false")
        assert first.returncode == 1, first.stdout + first.stderr
        # the routing did not change: the markets are frozen at replica 2 (never served from two states), imported at 1
        assert refused(r2) == dict.fromkeys(on2, "moving")
        assert held(r1) == dict.fromkeys(markets, 3)
        r = httpx.post(f"{r2.url}/neural/process", json=tick(on2[0], 3), timeout=30)
        assert r.status_code == 503 and r.json()["error"]["type"] == "market_moving"

        second = rebalance(old, new, "true")
        assert second.returncode == 0, second.stdout + second.stderr
        # finished: replica 2 forgot its frozen copies and refuses their ticks (moved), replica 1 serves them on
        assert refused(r2) == dict.fromkeys(on2, "moved") and held(r2) == {}
        assert held(r1) == dict.fromkeys(markets, 3)
        assert httpx.post(f"{r1.url}/neural/process", json=tick(on2[0], 3), timeout=30).status_code == 200
        # the failed run said what it left and what to do
        assert "the switch failed: --switch-command exited 1." in first.stderr
        assert f"{len(on2)} market(s) stay frozen at their old replicas" in first.stderr
        assert "run the same rebalance again" in first.stderr
    finally:
        r1.stop()
        r2.stop()


def test_a_target_killed_during_the_moves_leaves_no_market_frozen_at_its_holder(tmp_path: Path) -> None:
    source, target = start_all(tmp_path, 2, ENV)
    try:
        markets = [f"K{k:03d}" for k in range(240)]
        feed(source, markets, 2)
        moving = {m for m in markets if Ring({1: 1, 2: 1}).owner(m) == 2}
        killed = threading.Event()

        def kill_after_some_imports() -> None:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                try:
                    if len(held(target)) >= 5:
                        target.proc.send_signal(signal.SIGKILL)
                        killed.set()
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.005)

        killer = threading.Thread(target=kill_after_some_imports)
        killer.start()
        proc = rebalance(f"1={source.url}", f"1={source.url},2={target.url}", "false")
        killer.join()
        assert killed.is_set()
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "move failed" in proc.stderr  # in the moves, not at the switch: the kill came before the last import
        # every market is served at its holder again, with its state: none stays frozen there
        assert refused(source) == {}
        assert held(source) == dict.fromkeys(markets, 2)
        r = httpx.post(f"{source.url}/neural/process", json=tick(sorted(moving)[-1], 2), timeout=30)
        assert r.status_code == 200, r.text
        # what could not be undone is named: the copies imported at the dead target
        assert f"its imported copy stays at {target.url}" in proc.stderr
        assert "Run the same rebalance again" in proc.stderr
    finally:
        source.stop()
        target.stop()


def test_a_replica_serving_another_model_is_named_before_any_market_is_frozen(tmp_path: Path) -> None:
    r1, r2 = start_all(tmp_path, 2, ENV)
    try:
        markets = [f"V{k:03d}" for k in range(40)]
        feed(r1, markets, 2)
        # replica 2 restarted with another model active (here: activated on it alone)
        cfg = load_checked_config(None, environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "store")})
        w = generate_weights(cfg)
        w.head_bias[:] = np.asarray(w.head_bias) + 0.01
        version = ModelStore(tmp_path / "store").save(w, cfg, {"validation": {"loss": 1.0}})
        rollout = subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "rollout", version, "--replicas", r2.url,
                                  "--model-dir", str(tmp_path / "store" / "models" / version), "--token", TOKEN],
                                 cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert rollout.returncode == 0, rollout.stderr

        proc = rebalance(f"1={r1.url}", f"1={r1.url},2={r2.url}", "true")  # add replica 2
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert (f"the replicas of --new serve different models ({r1.url}: seed-42, {r2.url}: {version}); nothing was "
                "moved") in proc.stderr
        assert "move failed" not in proc.stderr  # refused before the first export
        assert refused(r1) == {} and held(r1) == dict.fromkeys(markets, 2) and held(r2) == {}
    finally:
        r1.stop()
        r2.stop()
