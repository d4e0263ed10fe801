"""Live introspection: ``GET /debug/backtrace`` and ``GET /debug/config`` (token), and no route that runs code."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.deps import ServiceState
from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.observability.debugtools import REDACTED, format_stacks, redacted_config, thread_stacks

TOKEN = "intro-s3cret-Token-9f"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEBUG_ROUTES = ("/debug/backtrace", "/debug/config", "/debug/markets", "/debug/markets/X/state", "/debug/markets/X/raster.png")


def _state(tmp_path: Path, **env: str) -> ServiceState:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP, **env}
    return build_service(load_checked_config(None, environ=environ))


@pytest.fixture
def tc(tmp_path: Path) -> Iterator[TestClient]:
    svc = _state(tmp_path, CEREBELLAR_NORSE_SERVER__API_TOKEN=TOKEN, CEREBELLAR_NORSE_SERVER__PORT="18123")
    with TestClient(make_app(svc, restore=False, save_on_shutdown=False)) as c:
        yield c


@pytest.mark.parametrize("path", DEBUG_ROUTES)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN}"}])
def test_every_debug_route_needs_the_token(tc: TestClient, path: str, headers: dict[str, str]) -> None:
    r = tc.get(path, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["type"] == "unauthorized"
    assert TOKEN not in r.text


def _park(event: threading.Event) -> None:
    event.wait(30)


def test_backtrace_has_every_thread(tc: TestClient) -> None:
    release = threading.Event()
    parked = threading.Thread(target=_park, args=(release,), name="parked-for-backtrace", daemon=True)
    parked.start()
    try:
        r = tc.get("/debug/backtrace", headers=AUTH)
    finally:
        release.set()
        parked.join()
    assert r.status_code == 200, r.text
    body = r.json()
    threads = {t["name"]: t for t in body["threads"]}
    assert len(body["threads"]) >= 3 and "MainThread" in threads  # the test's thread, the app's loop, the parked one
    p = threads["parked-for-backtrace"]
    assert p["thread_id"] == parked.ident and p["daemon"] is True
    names = [f["function"] for f in p["frames"]]
    assert "_park" in names and names[-1] == "wait"  # innermost frame last
    assert 'File "' in p["text"] and "in _park" in p["text"]
    # the loop thread is answering this very request
    assert any(f["function"] == "get_backtrace" for t in body["threads"] for f in t["frames"])
    assert TOKEN not in r.text
    assert body["pid"] > 0 and body["captured_at"].endswith("Z")


def test_stacks_as_text() -> None:
    text = format_stacks(thread_stacks())
    assert text.startswith("Thread ") and "(MainThread" in text and "in test_stacks_as_text" in text


def test_config_is_the_effective_one_with_the_token_redacted(tc: TestClient) -> None:
    r = tc.get("/debug/config", headers=AUTH)
    assert r.status_code == 200, r.text
    cfg = r.json()["config"]
    assert cfg["server"]["api_token"] == REDACTED == "***"
    assert cfg["server"]["port"] == 18123  # the environment override applied
    assert TOKEN not in r.text and TOKEN.lower() not in r.text.lower()
    assert set(cfg) >= {"neural", "performance", "training", "server", "logging", "paths", "debug"}


def test_without_a_token_the_field_stays_null(tmp_path: Path) -> None:
    cfg = load_checked_config(None, environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path)})
    assert redacted_config(cfg)["server"]["api_token"] is None


def test_the_log_level_shown_is_the_one_in_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_checked_config(None, environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path)})
    monkeypatch.setenv("CEREBELLAR_NORSE_LOG", "debug")  # the log switch wins over [logging] level
    assert cfg.logging.level == "INFO" and redacted_config(cfg)["logging"]["level"] == "DEBUG"
    monkeypatch.delenv("CEREBELLAR_NORSE_LOG")
    assert redacted_config(cfg)["logging"]["level"] == "INFO"
    with TestClient(make_app(_state(tmp_path), restore=False, save_on_shutdown=False)) as c:
        assert c.get("/debug/config").json()["config"]["server"]["api_token"] is None  # open on loopback without a token


def test_no_debug_route_takes_a_body_or_runs_code(tc: TestClient) -> None:
    doc = tc.get("/openapi.json").json()
    debug_ops = {(path, method) for path, item in doc["paths"].items() if path.startswith("/debug/") for method in item}
    assert debug_ops == {(path, method) for method in ("get", "head") for path in (  # HEAD: the GET without its body
        "/debug/backtrace", "/debug/config", "/debug/markets", "/debug/markets/{market_id}/state",
        "/debug/markets/{market_id}/raster.png", "/debug/requests", "/debug/requests/{request_id}")}
    for path, item in doc["paths"].items():
        for op in item.values():
            assert not any(word in (path + op.get("operationId", "")).lower() for word in ("eval", "exec", "shell", "console"))
    for method in ("post", "put", "patch", "delete"):
        r = tc.request(method, "/debug/backtrace", headers=AUTH, content=b"import os")
        assert r.status_code == 405
