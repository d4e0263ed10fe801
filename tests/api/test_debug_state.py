"""Market state dumps (``GET /debug/markets/{id}/state``, ``state dump``) and ``state diff``.

In process (TestClient over the real app) for the route's content and auth; against a
real server process for ``state dump``; ``state diff`` on dumps the service wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP, REPO_ROOT, LiveServer, server_environ, tick

from cerebellar_norse.api.deps import ServiceState
from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.cli import main
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.observability.debugtools import MISSING, diff_values, format_difference

TOKEN = "dbg-s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ODD = 'a/b,"c" d'  # a legal id with a slash, a comma, a quote and a space


def _state(tmp_path: Path, **env: str) -> ServiceState:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP, **env}
    return build_service(load_checked_config(None, environ=environ))


@pytest.fixture
def svc(tmp_path: Path) -> ServiceState:
    return _state(tmp_path, CEREBELLAR_NORSE_SERVER__API_TOKEN=TOKEN)


@pytest.fixture
def tc(svc: ServiceState) -> Iterator[TestClient]:
    with TestClient(make_app(svc, restore=False, save_on_shutdown=False)) as c:
        yield c


def send(tc: TestClient, market: str, ks: range) -> list[dict[str, Any]]:
    out = []
    for k in ks:
        r = tc.post("/neural/process", json=tick(market, k))
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def state_of(tc: TestClient, market: str, **kw: Any) -> Any:
    return tc.get(f"/debug/markets/{quote(market, safe='')}/state", **kw)


def test_state_needs_the_token(tc: TestClient) -> None:
    send(tc, "AUTH", range(2))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = state_of(tc, "AUTH", headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["type"] == "unauthorized" and "AUTH" not in r.text
    r = state_of(tc, "NEVER-SEEN", headers={})
    assert r.status_code == 401  # the token before anything about the market
    assert state_of(tc, "AUTH", headers=AUTH).status_code == 200


def test_unknown_or_reset_market_is_404(tc: TestClient) -> None:
    r = state_of(tc, "NEVER-SEEN", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found" and r.json()["error"]["field"] == "market_id"
    send(tc, "GONE", range(2))
    assert state_of(tc, "GONE", headers=AUTH).status_code == 200
    assert tc.delete("/neural/markets/GONE", headers=AUTH).status_code == 200
    assert state_of(tc, "GONE", headers=AUTH).status_code == 404


def test_state_describes_the_market_slot(tc: TestClient, svc: ServiceState) -> None:
    served = send(tc, ODD, range(7))
    r = state_of(tc, ODD, headers=AUTH)
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["market_id"] == ODD and s["model_version"] == svc.engine.model_version
    last = tick(ODD, 6)
    assert s["last_tick"]["timestamp"] == last["timestamp"] and s["last_tick"]["price"] == last["price"]
    assert s["last_tick"]["time"] == "2022-01-01T00:00:06.000Z"
    warm = svc.cfg.neural.warmup_ticks
    assert s["warmup"] == {"warming_up": True, "ticks_seen": 7, "warmup_ticks": warm, "ticks_until_warm": warm + 1 - 7}
    assert served[-1]["warming_up"] is True
    assert s["encoder"]["ticks_seen"] == 7
    assert {f: v["count"] for f, v in s["encoder"]["features"].items()} == {"log_return": 6, "log_volume": 7, "log_gap": 6}

    arrays = svc.engine.pool.arrays
    slot = svc.engine.pool.table.get(ODD)
    assert slot is not None
    for name, (v, i) in {"granule": ("v_gr", "i_gr"), "purkinje": ("v_pc", "i_pc"), "dcn": ("v_dcn", "i_dcn"),
                         "readout": ("v_out", "i_out")}.items():
        pop = s["populations"][name]
        va = np.asarray(getattr(arrays, v)[slot], dtype=np.float64)
        ia = np.asarray(getattr(arrays, i)[slot], dtype=np.float64)
        assert pop["size"] == va.size
        assert pop["v"] == {"mean": float(va.mean()), "std": float(va.std()), "min": float(va.min()), "max": float(va.max())}
        assert pop["i"]["max"] == float(ia.max()) and pop["i"]["min"] == float(ia.min())
    assert s["populations"]["golgi"]["inhibition"] == float(arrays.golgi[slot])


def test_spike_counts_are_kept_from_the_first_state_request(tc: TestClient) -> None:
    send(tc, "SPK", range(3))
    first = state_of(tc, "SPK", headers=AUTH).json()["spike_counts"]
    assert first["ticks"] == 0 and first["total"] is None and first["last_tick"] is None  # not stepped since
    served = send(tc, "SPK", range(3, 8))
    counts = state_of(tc, "SPK", headers=AUTH).json()["spike_counts"]
    assert counts["ticks"] == 5 and counts["tracking_since"] == first["tracking_since"]
    assert sum(counts["total"].values()) == sum(r["spike_count"] for r in served)
    assert sum(counts["last_tick"].values()) == served[-1]["spike_count"]
    assert set(counts["total"]) == {"granule", "purkinje", "dcn"}
    send(tc, "OTHER", range(2))  # another market's ticks do not count here
    assert state_of(tc, "SPK", headers=AUTH).json()["spike_counts"]["total"] == counts["total"]
    # a reset market that comes back starts its counts again
    assert tc.delete("/neural/markets/SPK", headers=AUTH).status_code == 200
    again = send(tc, "SPK", range(1))
    fresh = state_of(tc, "SPK", headers=AUTH).json()["spike_counts"]
    assert fresh["ticks"] == 1 and sum(fresh["total"].values()) == again[0]["spike_count"]


def test_same_ticks_give_identical_dumps(tmp_path: Path) -> None:
    dumps = []
    for k in range(2):
        with TestClient(make_app(_state(tmp_path / str(k)), restore=False, save_on_shutdown=False)) as c:
            send(c, "TWIN", range(12))
            dumps.append(state_of(c, "TWIN").json())  # no token configured: open (loopback)
    assert diff_values(dumps[0], dumps[1]) == []  # captured_at and tracking_since are not compared


# -- state diff ------------------------------------------------------------------------------------


def test_diff_values_paths_tolerance_and_missing_fields() -> None:
    a = {"x": 1.0, "n": {"v": [1, 2, 3], "s": "a"}, "only_a": True, "captured_at": "t1"}
    b = {"x": 1.0 + 1e-7, "n": {"v": [1, 2], "s": "b"}, "only_b": None, "captured_at": "t2"}
    got = diff_values(a, b)
    assert got == [("x", 1.0, 1.0 + 1e-7), ("n.v[2]", 3, MISSING), ("n.s", "a", "b"), ("only_a", True, MISSING),
                   ("only_b", MISSING, None)]
    assert [p for p, *_ in diff_values(a, b, tolerance=1e-6)] == ["n.v[2]", "n.s", "only_a", "only_b"]
    assert diff_values({"b": True}, {"b": 1}) == [("b", True, 1)]  # a flag is not a number
    assert format_difference("x", 1.0, 1.5) == "x: 1.0 -> 1.5 (|diff| 0.5)"
    assert format_difference("n.v[2]", 3, MISSING) == "n.v[2]: 3 -> <missing>"


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_state_diff_command(tc: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    send(tc, "D", range(5))
    a = tmp_path / "a.json"
    a.write_text(state_of(tc, "D", headers=AUTH).text)
    same = tmp_path / "same.json"
    same.write_text(state_of(tc, "D", headers=AUTH).text)
    send(tc, "D", range(5, 6))
    b = tmp_path / "b.json"
    b.write_text(state_of(tc, "D", headers=AUTH).text)

    code, out, err = run(capsys, "state", "diff", a, same)
    assert code == 0, err
    assert out.splitlines()[-1] == "no differences (tolerance 0)"
    code, out, _ = run(capsys, "state", "diff", a, b)
    assert code == 1
    lines = out.splitlines()
    assert lines[:2] == [f"--- {a}", f"+++ {b}"]
    assert "warmup.ticks_seen: 5 -> 6 (|diff| 1)" in lines
    assert any(x.startswith("last_tick.timestamp: 1640995204000 -> 1640995205000") for x in lines)
    assert any(x.startswith("populations.granule.v.mean: ") for x in lines)
    assert not any(x.startswith("captured_at") for x in lines)
    assert lines[-1].endswith("field(s) differ (tolerance 0)")
    code, out, _ = run(capsys, "state", "diff", a, b, "--tolerance", "1e12")
    assert code == 1 and "last_tick.time:" in out  # strings differ whatever the tolerance
    code, _, err = run(capsys, "state", "diff", a, tmp_path / "missing.json")
    assert code == 1 and "missing.json: cannot read" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    code, _, err = run(capsys, "state", "diff", a, bad)
    assert code == 1 and "not a JSON state dump" in err
    bad.write_text("[" * 100_000 + "]" * 100_000)  # too deep for the JSON reader: the same one line, no traceback
    code, _, err = run(capsys, "state", "diff", a, bad)
    assert code == 1 and "not a JSON state dump (RecursionError" in err
    with pytest.raises(SystemExit) as exc:
        main(["state"])
    assert exc.value.code == 2


# -- state dump against a real server --------------------------------------------------------------


def test_state_dump_command_against_the_running_service(start_server: Any, tmp_path: Path) -> None:
    import httpx

    srv: LiveServer = start_server(tmp_path / "state", env={"CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN})
    for k in range(4):
        httpx.post(f"{srv.url}/neural/process", json=tick(ODD, k), timeout=5).raise_for_status()

    def cli(*args: str, token_env: bool = True) -> subprocess.CompletedProcess[str]:
        env = server_environ(tmp_path / "other", {"CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN} if token_env else {})
        return subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "--port", str(srv.port), "state", "dump", *args],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)

    r = cli("--market", ODD)  # default URL from the config's host and port, token from the config
    assert r.returncode == 0, r.stderr
    dump = json.loads(r.stdout)
    assert dump["market_id"] == ODD and dump["warmup"]["ticks_seen"] == 4
    r = cli("--market", ODD, "--url", srv.url, "--token", TOKEN, token_env=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["warmup"]["ticks_seen"] == 4

    r = cli("--market", ODD, token_env=False)
    assert r.returncode == 1 and "401 unauthorized" in r.stderr and r.stdout == ""
    r = cli("--market", ODD, "--token", "wrong-token", token_env=False)
    assert r.returncode == 1 and "401" in r.stderr and "wrong-token" not in r.stderr
    r = cli("--market", "NOPE")
    assert r.returncode == 1 and "404" in r.stderr and "holds no state" in r.stderr
    assert "is the service at" not in r.stderr  # the service answered: no doubt that it is the service
    r = cli("--market", ODD, "--url", "http://127.0.0.1:1")
    assert r.returncode == 1 and "cannot reach the service at http://127.0.0.1:1" in r.stderr
    assert TOKEN not in r.stderr


def test_busiest_markets_listing(tc: TestClient) -> None:
    send(tc, "FEW", range(2))
    send(tc, ODD, range(5))
    send(tc, "MID", range(3))
    assert tc.get("/debug/markets").status_code == 401
    r = tc.get("/debug/markets", headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == 3
    assert [(m["market_id"], m["ticks_seen"]) for m in body["markets"]] == [(ODD, 5), ("MID", 3), ("FEW", 2)]
    assert body["markets"][0]["last_timestamp"] == tick(ODD, 4)["timestamp"]
    assert [m["market_id"] for m in tc.get("/debug/markets?limit=2", headers=AUTH).json()["markets"]] == [ODD, "MID"]
    for bad in ("0", "x", "10001"):
        r = tc.get(f"/debug/markets?limit={bad}", headers=AUTH)
        assert r.status_code == 422 and r.json()["error"]["field"] == "limit"
    assert tc.get("/debug/markets?limit=0").status_code == 401  # the token first
