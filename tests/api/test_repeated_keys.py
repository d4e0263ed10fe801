"""A JSON object that names a key twice is refused (422 validation, ``field`` naming the place), on every route with a
JSON body, and changes nothing.

JSON parsers, pydantic's and Python's, read ``{"price": 1, "price": 2}`` with the last value: a fuzzer or a careless
client could hide a second ``price`` behind the first one a log or a proxy shows. The hot path pays a count of one byte
for the check (a valid tick has five JSON strings); anything else is parsed again to find the repeated key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.app import create_app
from cerebellar_norse.api.routes import training
from cerebellar_norse.api.schemas import repeated_key
from cerebellar_norse.api.server import build_service
from cerebellar_norse.config import load_checked_config

TOKEN = "repeat-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
NOW_MS = int(time.time() * 1000)


@pytest.fixture(params=[True, False], ids=["fast-path", "fastapi-route"])
def tc(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestClient]:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP,
               "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN, "CEREBELLAR_NORSE_PATHS__DATA_DIR": str(tmp_path)}
    app = create_app(build_service(load_checked_config(None, environ=environ)), extra_routers=[training.router],
                     fast_path=request.param)
    with TestClient(app) as c:
        yield c


def tick(market: str = "RK", ts: int = NOW_MS - 1000, extra: str = "") -> str:
    return f'{{"price": 100.5, "volume": 1.0, "timestamp": {ts}, "market_id": "{market}"{extra}}}'


REPEATING_TICKS = [
    (tick(extra=', "price": 0.01'), "price"),
    ('{"price": 2, ' + tick()[1:], "price"),
    (tick(extra=', "market_id": "OTHER"'), "market_id"),
    (tick(extra=', "pr\\u0069ce": 3'), "price"),  # the same key, escaped
    (tick(market='A\\"B', extra=', "volume": 2'), "volume"),  # a backslash: the count cannot tell, the parse does
]


def test_a_tick_that_repeats_a_key_is_refused_and_changes_nothing(tc: TestClient) -> None:
    for body, field in REPEATING_TICKS:
        r = tc.post("/neural/process", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (body, r.text)
        error = r.json()["error"]
        assert (error["type"], error["field"]) == ("validation", field), body
        assert f"key {field!r} appears more than once" in error["message"]
    assert tc.delete("/neural/markets/RK", headers=AUTH).status_code == 404  # no state was made
    assert f'cerebellar_norse_errors_total{{kind="validation"}} {len(REPEATING_TICKS)}.0' in tc.get("/metrics").text
    with tc.websocket_connect("/neural/stream") as ws:  # the stream: an error message, and the socket stays open
        ws.send_text(REPEATING_TICKS[0][0])
        error = json.loads(ws.receive_text())["error"]
        assert (error["type"], error["field"]) == ("validation", "price")
        ws.send_text(tick())
        assert json.loads(ws.receive_text())["market_id"] == "RK"
    for k, market in enumerate(["price", 'A\\"B', "p\\u0072ice", "x,\\\"price\\\":1"]):  # look alike, repeat nothing
        r = tc.post("/neural/process", content=tick(market, NOW_MS - 900 + k), headers={"Content-Type": "application/json"})
        assert r.status_code == 200, (market, r.text)
        assert r.json()["market_id"] == json.loads(f'"{market}"')


def test_a_batch_that_repeats_a_key_names_the_tick(tc: TestClient) -> None:
    ticks = [tick("RK", NOW_MS - 1000 + k) for k in range(4)]
    ticks[2] = tick("RK", NOW_MS - 998, extra=', "timestamp": 1640995200000')
    r = tc.post("/neural/process/batch", content='{"ticks": [' + ", ".join(ticks) + "]}",
                headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "ticks.2.timestamp", r.text
    r = tc.post("/neural/process/batch", content='{"ticks": [], "ticks": [' + ticks[0] + "]}",
                headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "ticks", r.text
    assert tc.delete("/neural/markets/RK", headers=AUTH).status_code == 404
    ok = tc.post("/neural/process/batch", content='{"ticks": [' + ", ".join(ticks[:2]) + "]}",
                 headers={"Content-Type": "application/json"})
    assert ok.status_code == 200 and len(ok.json()["results"]) == 2


def test_a_training_request_that_repeats_a_key_starts_no_job(tc: TestClient, tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("timestamp,price,volume,market_id\n")
    r = tc.post("/training", content='{"files": ["t.csv"], "activate": "never", "activate": "always"}', headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]["field"] == "activate", r.text
    assert tc.get("/training/status/latest", headers=AUTH).status_code == 404  # no job


@pytest.mark.parametrize(("body", "where"), [
    ('{"a": 1}', None), ('{"a": 1, "a": 1}', "a"), ('[{"x": [{}, {"y": 1, "z": {"q": 1, "q": 2}}]}]', "0.x.1.z.q"),
    ('{"a": {"b": 1, "b": 2}, "c": 1, "c": 2}', "c"),  # the outermost object first ('{"a": 1', None), (b'{"\xc3\xa9": 1, "\xc3\xa9": 2}', "\u00e9"),
])
def test_repeated_key_names_the_outermost_place(body: str | bytes, where: str | None) -> None:
    assert repeated_key(body) == where
