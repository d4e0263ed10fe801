"""Bodies are read as sent: a Content-Encoding other than identity is 415 on every route that takes a body."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import load_checked_config

TOKEN = "coding-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"content-type": "application/json"}
BLOB = {"content-type": "application/octet-stream"}


def _tick(k: int) -> dict[str, object]:
    return {"price": 100.0 + k, "volume": 10.0, "timestamp": int(time.time() * 1000) - 60_000 + k, "market_id": "GZ"}


def _state(tc: TestClient) -> dict[str, object]:
    state = tc.get("/debug/markets/GZ/state", headers=AUTH).json()
    state.pop("captured_at")  # when it was read
    return state


@pytest.fixture
def tc(tmp_path: Path) -> TestClient:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path), "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN, **NO_BOOTSTRAP}
    with TestClient(make_app(build_service(load_checked_config(None, environ=environ)), restore=False,
                             save_on_shutdown=False)) as c:
        yield c


@pytest.mark.parametrize("coding", ["gzip", "br", "GZIP, identity"])
def test_a_content_coding_is_refused_on_every_body_route_and_changes_nothing(tc: TestClient, coding: str) -> None:
    assert tc.post("/neural/process", json=_tick(0)).status_code == 200
    before = _state(tc)
    tick = json.dumps(_tick(1)).encode()
    requests = [
        ("POST", "/neural/process", gzip.compress(tick), JSON),
        ("POST", "/neural/process", tick, JSON),  # a plain body that claims a coding is refused alike
        ("POST", "/neural/process/batch", json.dumps({"ticks": [_tick(1)]}).encode(), JSON),
        ("POST", "/training", json.dumps({"files": ["ticks.csv"]}).encode(), {**JSON, **AUTH}),
        ("PUT", "/models/v1", gzip.compress(b"archive"), {**BLOB, **AUTH}),
        ("PUT", "/neural/markets/GZ/state", gzip.compress(b"state"), {**BLOB, **AUTH}),
    ]
    for method, path, body, headers in requests:
        r = tc.request(method, path, content=body, headers={**headers, "content-encoding": coding})
        assert r.status_code == 415, (path, r.text)
        err = r.json()["error"]
        assert err["type"] == "unsupported_media_type" and "content coding" in err["message"], (path, err)
        assert coding.split(",")[0] in err["message"], err
    assert _state(tc) == before
    assert tc.get("/models", headers=AUTH).json()["models"] == []
    assert tc.get("/training/status/latest", headers=AUTH).status_code == 404


def test_identity_is_the_body_as_sent(tc: TestClient) -> None:
    r = tc.post("/neural/process", content=json.dumps(_tick(0)).encode(), headers={**JSON, "content-encoding": "identity"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("copies", [["identity", "gzip"], ["", "gzip"], ["gzip", "identity"]])
def test_repeated_content_encoding_headers_are_one_list(tc: TestClient, copies: list[str]) -> None:
    """Content-Encoding: identity and Content-Encoding: gzip are the list "identity, gzip" (RFC 9110 5.3): 415 on the
    fast path and the routes alike, not a body read as if it were not encoded."""
    tick = json.dumps(_tick(5)).encode()
    for path, body in (("/neural/process", tick), ("/neural/process/batch", json.dumps({"ticks": [_tick(5)]}).encode())):
        r = tc.post(path, content=body, headers=[("content-type", "application/json"),
                                                 *[("content-encoding", c) for c in copies]])
        assert r.status_code == 415 and "gzip" in r.json()["error"]["message"], (path, copies, r.text)
