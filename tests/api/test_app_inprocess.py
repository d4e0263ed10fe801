"""The app in-process (TestClient): request ids, error mapping, the bearer token, the body limit, exposure."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter, Depends, FastAPI
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.app import create_app
from cerebellar_norse.api.deps import ServiceState, check_token, require_token
from cerebellar_norse.api.errors import validation_response
from cerebellar_norse.api.exposure import check_exposure, is_loopback
from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.errors import (
    CapacityError,
    CerebellarNorseError,
    ConfigError,
    EngineFatalError,
    InputError,
    TickOrderError,
)
from cerebellar_norse.observability.context import accept_request_id, request_id_var

HEX32 = re.compile(r"^[0-9a-f]{32}$")
TOKEN = "s3cret-token"
TICK = {"price": 100.0, "volume": 1000.0, "timestamp": 1640995200000, "market_id": "TEST"}

probe = APIRouter()


@probe.get("/_probe/rid")
async def _rid() -> dict[str, str]:
    return {"rid": request_id_var.get()}


@probe.post("/_probe/secret", dependencies=[Depends(require_token)])
async def _secret() -> dict[str, bool]:
    return {"ok": True}


class _ConflictError(InputError):
    status_code = 409


class _MissingError(InputError):
    status_code = 404


RAISES: dict[str, Exception] = {
    "unexpected": RuntimeError("secret internals at /srv/app/engine.py line 7"),
    "input": InputError("must be > 0", "price"),
    "order": TickOrderError("older than the last tick", "timestamp"),
    "capacity": CapacityError("queue full", retry_after_s=2.4),
    "engine": EngineFatalError("device lost"),
    "service": CerebellarNorseError("something of ours"),
    "conflict": _ConflictError("a job is already running", "job"),
    "missing": _MissingError("no such job", "job_id"),
}


@probe.get("/_probe/raise/{what}")
async def _raise(what: str) -> None:
    raise RAISES[what]


def _state(tmp_path: Path, **env: str) -> ServiceState:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP, **env}
    return build_service(load_checked_config(None, environ=environ))


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    """The service app with probe routes and a configured API token (no lifespan: not 'ready')."""
    return create_app(_state(tmp_path, CEREBELLAR_NORSE_SERVER__API_TOKEN=TOKEN), extra_routers=[probe])


@pytest.fixture
def tc(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _error(r: Any, status: int, kind: str, field: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"type", "message", "field", "request_id"}
    assert err["type"] == kind and err["field"] == field
    assert err["request_id"] == r.headers["x-request-id"]
    assert "Traceback" not in r.text
    return err


# -- RequestContextMiddleware -------------------------------------------------------------------


def test_request_id_generated_and_visible_to_the_route(tc: TestClient) -> None:
    r = tc.get("/_probe/rid")
    assert HEX32.match(r.headers["x-request-id"])
    assert r.json()["rid"] == r.headers["x-request-id"]
    assert tc.get("/_probe/rid").headers["x-request-id"] != r.headers["x-request-id"]


@pytest.mark.parametrize("rid", ["a", "Order-1.2:3_x-y", "x" * 128])
def test_request_id_honoured(tc: TestClient, rid: str) -> None:
    r = tc.get("/_probe/rid", headers={"X-Request-ID": rid})
    assert r.headers["x-request-id"] == rid and r.json()["rid"] == rid


@pytest.mark.parametrize("rid", ["", "x" * 129, "two words", "a/b", "é", "a\tb"])
def test_request_id_unsafe_replaced(tc: TestClient, rid: str) -> None:
    r = tc.get("/_probe/rid", headers={"X-Request-ID": rid.encode("utf-8")})
    assert HEX32.match(r.headers["x-request-id"]) and r.json()["rid"] == r.headers["x-request-id"]


def test_accept_request_id() -> None:
    assert accept_request_id("abc") == "abc"
    assert HEX32.match(accept_request_id(None))
    assert HEX32.match(accept_request_id("bad id"))


def test_fresh_request_ids_differ_within_and_across_processes() -> None:
    code = "from cerebellar_norse.observability.context import new_request_id as n; print(' '.join(n() for _ in range(1000)))"
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
            for _ in range(2)]
    here = [accept_request_id(None) for _ in range(1000)]
    ids = [*runs[0], *runs[1], *here]
    assert all(HEX32.match(i) for i in ids)
    assert len(set(ids)) == len(ids) == 3000


def test_request_id_on_every_error(tc: TestClient) -> None:
    for r in (tc.get("/nope"), tc.delete("/health"), tc.post("/neural/process", content=b"{", headers={"Content-Type": "application/json"})):
        assert r.json()["error"]["request_id"] == r.headers["x-request-id"]


def test_requests_counted_by_route_template(app: FastAPI, tc: TestClient) -> None:
    tc.get("/_probe/raise/input")
    tc.get("/_probe/raise/input")
    tc.get("/no/such/route")
    text = app.state.service.metrics.render().decode()
    assert 'cerebellar_norse_http_requests_total{method="GET",route="/_probe/raise/{what}",status="422"} 2.0' in text
    assert 'cerebellar_norse_http_requests_total{method="GET",route="other",status="404"} 1.0' in text
    assert 'cerebellar_norse_http_request_duration_seconds_count{route="/_probe/raise/{what}"} 2.0' in text


# -- error mapping ----------------------------------------------------------------------------------


def test_unexpected_exception_is_a_json_500_with_the_request_id(app: FastAPI, tc: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    r = tc.get("/_probe/raise/unexpected", headers={"X-Request-ID": "boom-1"})
    err = _error(r, 500, "internal")
    assert err["request_id"] == "boom-1"
    assert "secret internals" not in r.text and "engine.py" not in r.text
    assert any(rec.getMessage() == "unexpected error" and rec.exc_info for rec in caplog.records)
    assert 'cerebellar_norse_errors_total{kind="internal"} 1.0' in app.state.service.metrics.render().decode()


@pytest.mark.parametrize(("what", "status", "kind", "field"), [
    ("input", 422, "validation", "price"),
    ("order", 409, "out_of_order", "timestamp"),
    ("capacity", 503, "capacity", None),
    ("engine", 503, "engine", None),
    ("service", 500, "internal", None),
    ("conflict", 409, "conflict", "job"),  # a 409 that is not about tick order
    ("missing", 404, "not_found", "job_id"),
])
def test_service_errors_mapped(tc: TestClient, what: str, status: int, kind: str, field: str | None) -> None:
    r = tc.get(f"/_probe/raise/{what}")
    _error(r, status, kind, field)
    if what == "capacity":
        assert r.headers["retry-after"] == "2"


def test_validation_response_edge_cases() -> None:
    assert validation_response([]) == (422, {"error": {"type": "validation", "message": "invalid request", "field": None, "request_id": ""}})
    status, body = validation_response([{"type": "json_invalid", "loc": ("body", 3), "msg": "JSON decode error", "ctx": {"error": "Expecting value"}}])
    assert status == 400 and body["error"]["type"] == "malformed_json" and "Expecting value" in body["error"]["message"]
    status, body = validation_response([{"type": "extra_forbidden", "loc": ("body", "ticks", 0, "x"), "msg": "Extra inputs"}])
    assert status == 422 and body["error"]["field"] == "ticks.0.x" and body["error"]["message"] == "unknown field"
    status, body = validation_response([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    assert status == 422 and body["error"]["message"] == "request body is missing" and body["error"]["field"] is None
    status, body = validation_response([{"type": "greater_than", "loc": ("body", "price"), "msg": "Input should be greater than 0", "input": -1}])
    assert body["error"]["field"] == "price" and body["error"]["message"] == "Input should be greater than 0 (got -1)"
    status, body = validation_response([{"type": "model_type", "loc": ("body",), "msg": "Input should be an object", "input": [1, 2]}])
    assert body["error"]["field"] is None and "[1, 2]" not in body["error"]["message"]  # containers are not echoed
    token = request_id_var.set("rid-9")
    try:
        assert validation_response([])[1]["error"]["request_id"] == "rid-9"
    finally:
        request_id_var.reset(token)


# -- bearer token ----------------------------------------------------------------------------------


@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {TOKEN}", TOKEN, "Bearer", f"Bearer {TOKEN}x"])
def test_token_route_refuses(tc: TestClient, header: str | None) -> None:
    r = tc.post("/_probe/secret", headers={} if header is None else {"Authorization": header})
    _error(r, 401, "unauthorized")
    assert r.headers["www-authenticate"] == "Bearer"
    assert TOKEN not in r.text


@pytest.mark.parametrize("header", [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"Bearer  {TOKEN} "])
def test_token_route_accepts(tc: TestClient, header: str) -> None:
    r = tc.post("/_probe/secret", headers={"Authorization": header})
    assert r.status_code == 200 and r.json() == {"ok": True}


def test_token_not_needed_when_none_configured(tmp_path: Path) -> None:
    with TestClient(create_app(_state(tmp_path), extra_routers=[probe])) as c:
        assert c.post("/_probe/secret").status_code == 200
    check_token(_state(tmp_path).cfg, None)


# -- body limit, readiness -----------------------------------------------------------------------


def test_body_limit_from_config(tmp_path: Path) -> None:
    app = create_app(_state(tmp_path, CEREBELLAR_NORSE_SERVER__MAX_BODY_SIZE="1KB"), extra_routers=[probe])
    big = b'{"ticks": [' + b",".join([b'{"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "A"}'] * 16) + b"]}"
    with TestClient(app) as c:
        err = _error(c.post("/neural/process/batch", content=big, headers={"Content-Type": "application/json"}), 413, "body_too_large")
        assert "1000 bytes" in err["message"]
        chunked = c.post("/neural/process/batch", content=iter([big[:500], big[500:]]), headers={"Content-Type": "application/json"})
        _error(chunked, 413, "body_too_large")
        assert c.post("/neural/process", json=TICK).status_code == 200  # a small body passes
    text = app.state.service.metrics.render().decode()
    assert 'cerebellar_norse_errors_total{kind="body_too_large"} 2.0' in text


def test_a_chunked_upload_over_the_limit_is_told_to_send_its_size(tmp_path: Path) -> None:
    """A model upload may exceed server.max_body_size when sent with a Content-Length; sent chunked it is held to the
    limit, and the 413 says how large it may be and how to send it. A chunked tick batch gets no such advice."""
    state = _state(tmp_path, CEREBELLAR_NORSE_SERVER__MAX_BODY_SIZE="1KB")
    with TestClient(create_app(state)) as c:
        body = b"x" * 3000
        err = _error(c.put("/models/20240101T000000Z-aaaaaa", content=iter([body[:1500], body[1500:]]),
                           headers={"Content-Type": "application/octet-stream"}), 413, "body_too_large")
        assert "may be up to" in err["message"] and "sent with a Content-Length instead of chunked" in err["message"]
        batch = c.post("/neural/process/batch", content=iter([body[:1500], body[1500:]]),
                       headers={"Content-Type": "application/json"})
        assert "Content-Length" not in _error(batch, 413, "body_too_large")["message"]


def test_health_503_until_ready_then_200(tmp_path: Path) -> None:
    state = _state(tmp_path)
    with TestClient(create_app(state)) as c:  # no lifespan: never warmed up, never ready
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "unavailable" and r.json()["reason"]
    with TestClient(make_app(_state(tmp_path), restore=False, save_on_shutdown=False)) as c:
        r = c.get("/health")  # ready; no trained model is stored, so the untrained network is served, degraded
        assert r.status_code == 200 and r.json()["status"] == "degraded", r.json()


def test_warm_up_is_not_counted_in_the_metrics(tmp_path: Path) -> None:
    state = _state(tmp_path)
    with TestClient(make_app(state, restore=False, save_on_shutdown=False)) as c:
        text = c.get("/metrics").text
        assert "processing_duration_seconds_count 0.0" in text
        assert "cerebellar_norse_batch_size_ticks_count 0.0" in text
        c.post("/neural/process", json=TICK)
        assert "processing_duration_seconds_count 1.0" in c.get("/metrics").text


def test_live_evaluation_in_metrics_and_neural_metrics(tmp_path: Path) -> None:
    """Ticks past the horizon are judged: overall figures in /metrics (promtool-clean), per market in /neural/metrics."""
    state = _state(tmp_path, CEREBELLAR_NORSE_NEURAL__HORIZON_TICKS="3", CEREBELLAR_NORSE_NEURAL__WARMUP_TICKS="0")
    ticks = [{**TICK, "timestamp": TICK["timestamp"] + 1000 * i, "price": 100.0 * (1.0 + 0.002 * ((i * 7) % 5 - 2))}
             for i in range(12)]
    with TestClient(make_app(state, restore=False, save_on_shutdown=False)) as c:
        assert c.post("/neural/process/batch", json={"ticks": ticks}).status_code == 200
        text = c.get("/metrics").text
        live = c.get("/neural/metrics").json()["neural_metrics"]["live_evaluation"]
    assert "cerebellar_norse_live_judged_ticks_total 9.0" in text
    assert "cerebellar_norse_live_window_ticks 9.0" in text
    for name in ("log_loss", "base_rate_log_loss", "direction_log_loss", "base_rate_direction_log_loss",
                 "directional_accuracy_ratio", "base_rate_directional_accuracy_ratio"):
        assert f"# TYPE cerebellar_norse_live_{name} gauge" in text
    assert not [line for line in text.splitlines() if "_live_" in line and "NaN" in line]
    assert live["overall"]["total"]["judged"] == 9 and live["markets"]["TEST"]["window"]["judged"] == 9
    assert set(live["overall"]["window"]["model"]) == {"directional_accuracy", "direction_log_loss", "accuracy", "log_loss"}
    promtool = shutil.which("promtool")
    if promtool is not None:
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60, check=False)
        assert "_live_" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_shutdown_without_save_leaves_no_state_file(tmp_path: Path) -> None:
    state = _state(tmp_path)
    with TestClient(make_app(state, restore=False, save_on_shutdown=False)) as c:
        c.post("/neural/process", json=TICK)
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())


# -- exposure ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
                                                 ("127.0.0.2", True), ("0.0.0.0", False), ("::", False), ("10.0.0.1", False),
                                                 ("example.com", False)])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_check_exposure() -> None:
    check_exposure(load_checked_config(None, environ={}))
    with pytest.raises(ConfigError) as exc:
        check_exposure(load_checked_config(None, environ={"CEREBELLAR_NORSE_SERVER__HOST": "0.0.0.0"}))
    assert exc.value.problems[0].key == "server.api_token"
    check_exposure(load_checked_config(None, environ={"CEREBELLAR_NORSE_SERVER__HOST": "0.0.0.0",
                                                      "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN}))
