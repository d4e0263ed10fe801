"""Routes match the whole request path: a newline in a market id neither drops out nor hides the route."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP
from starlette.routing import compile_path

from cerebellar_norse.api.app import create_app
from cerebellar_norse.api.deps import ServiceState
from cerebellar_norse.api.routing import exact_pattern
from cerebellar_norse.api.server import build_service
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.ticks import Tick


@pytest.fixture
def state(tmp_path: Path) -> ServiceState:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP}
    svc = build_service(load_checked_config(None, environ=environ))
    svc.engine.process_now([Tick(100.0, 10.0, 1_640_995_200_000, "ABC")])
    return svc


@pytest.fixture
def tc(state: ServiceState) -> Iterator[TestClient]:
    with TestClient(create_app(state), raise_server_exceptions=False) as c:
        yield c


def _error(r: object) -> dict[str, str]:
    err: dict[str, str] = r.json()["error"]  # type: ignore[attr-defined]
    return err


def test_trailing_newline_does_not_name_another_market(tc: TestClient, state: ServiceState) -> None:
    r = tc.delete("/neural/markets/ABC%0A")
    assert r.status_code == 404, r.text
    assert _error(r)["field"] == "market_id" and "'ABC\\n'" in _error(r)["message"]
    assert state.engine.pool.table.get("ABC") is not None  # ABC's state is untouched
    r = tc.get("/debug/markets/ABC%0A/state")
    assert r.status_code == 404 and _error(r)["field"] == "market_id", r.text
    assert tc.delete("/neural/markets/ABC").json()["reset"] is True


def test_newline_inside_a_market_id_reaches_the_route(tc: TestClient) -> None:
    r = tc.post("/neural/markets/%0A%01/release")
    assert r.status_code == 409, r.text  # the route's own answer, not the router's bare 404
    assert _error(r)["field"] == "market_id" and "'\\n\\x01'" in _error(r)["message"]
    r = tc.post("/neural/markets/A%0AB/export")
    assert r.status_code == 404 and _error(r)["field"] == "market_id", r.text


@pytest.mark.parametrize("path", ["/health%0A", "/metrics%0A", "/neural/metrics%0A"])
def test_fixed_paths_do_not_match_with_a_trailing_newline(tc: TestClient, path: str) -> None:
    assert tc.get(path.removesuffix("%0A")).status_code in (200, 503)  # /health: 503 until the service is ready
    r = tc.get(path)
    assert r.status_code == 404 and _error(r)["type"] == "not_found", r.text


def test_exact_pattern() -> None:
    rx = re.compile(r"^/neural/markets/(?P<market_id>.*)/release$")  # as Starlette compiles the route
    assert rx.match("/neural/markets/AB/release\n") and not rx.match("/neural/markets/A\nB/release")
    exact = exact_pattern(rx)
    m = exact.match("/neural/markets/A\nB/release")
    assert m is not None and m["market_id"] == "A\nB"
    assert exact.match("/neural/markets/AB/release\n") is None
    assert exact.match("/neural/markets/A/B/release")["market_id"] == "A/B"  # type: ignore[index]
    assert exact_pattern(exact) is exact
    literal = exact_pattern(compile_path("/debug/markets/{market_id:path}/raster.png")[0])
    assert literal.match("/debug/markets/A/raster.png") and not literal.match("/debug/markets/A/rasterXpng")
    with pytest.raises(ValueError, match="final"):
        exact_pattern(re.compile("^/a"))


def test_every_route_of_the_app_is_exact(state: ServiceState) -> None:
    """The app's own routes (docs, OpenAPI) are compiled after install_exact_paths, like the included ones."""
    routes = [r for r in create_app(state).router.routes if hasattr(r, "path_regex")]
    assert routes and all(r.path_regex.pattern.endswith(r"\Z") for r in routes)
    assert all(r.path_regex.match(r.path + "\n") is None for r in routes)


@pytest.mark.parametrize(("method", "path"), [("GET", "/health/"), ("POST", "/neural/process/batch/"),
                                              ("GET", "/models/"), ("POST", "/training/")])
def test_a_trailing_slash_is_404_not_a_redirect(tc: TestClient, method: str, path: str) -> None:
    r = tc.request(method, path, headers={"Host": "elsewhere.example"}, follow_redirects=False)
    assert r.status_code == 404, (r.status_code, r.headers)
    assert "location" not in r.headers
    assert _error(r)["type"] == "not_found"


@pytest.mark.parametrize(("method", "path", "words"), [
    ("GET", "/health/", "no route has the path '/health/'"),
    ("GET", "/neural/nope%0A", "no route has the path '/neural/nope\\n'"),
    ("GET", "/" + "x" * 5000, "(5001 characters)"),
    ("GET", "/neural/stream", "'/neural/stream' is a WebSocket: open it with a handshake"),
    ("PATCH", "/health", "method PATCH is not allowed on '/health': use GET, HEAD"),
    ("GET", "/neural/process", "method GET is not allowed on '/neural/process': use POST"),
    ("GET", "/neural/markets/ABC", "method GET is not allowed on '/neural/markets/ABC': use DELETE"),
])
def test_a_refusal_by_the_router_names_the_path_and_the_methods(tc: TestClient, method: str, path: str,
                                                                 words: str) -> None:
    """No route, or not this method: the message says which path, and which methods it answers."""
    r = tc.request(method, path)
    err = _error(r)
    assert r.status_code in (404, 405) and err["type"] in ("not_found", "method_not_allowed")
    assert words in err["message"] and len(err["message"]) < 300, err


TICK = {"price": 101.0, "volume": 5.0, "timestamp": 1_640_995_201_000, "market_id": "ABC"}


SPELLED_OTHERWISE = [
    ("POST", "/neural/%70rocess", TICK),
    ("POST", "/neural%2Fprocess", TICK),
    ("POST", "/%6Eeural/process", TICK),
    ("POST", "/neural/process/%62atch", {"ticks": [TICK]}),
    ("POST", "/neural/markets/ABC/%65xport", None),
    ("POST", "/neural/markets/ABC%2Fexport", None),
    ("DELETE", "/neural/m%61rkets/ABC", None),
    ("GET", "/h%65alth", None),
    ("GET", "/%64ocs", None),
]


def test_a_route_s_own_words_percent_encoded_are_no_route(tc: TestClient, state: ServiceState) -> None:
    """A proxy routes by the path as sent (HAProxy's ``path /neural/process`` sends a tick to its market's replica):
    a route's words spelled otherwise reach no route here either, and change nothing (the tick is not applied to a
    replica its market does not live on, the market is neither exported nor reset)."""
    last = state.engine.pool.table.get("ABC")
    for method, path, body in SPELLED_OTHERWISE:
        r = tc.request(method, path, json=body)
        err = _error(r)
        assert r.status_code in (404, 405) and err["type"] in ("not_found", "method_not_allowed"), (path, r.text)
        assert repr(path) in err["message"], err  # the path as it was sent
        if r.status_code == 404:
            assert "percent-encode only the ids in a path" in err["message"], err
        assert state.engine.pool.table.get("ABC") is last, path  # not stepped, not reset
        assert tc.get("/debug/markets/ABC/state").json()["last_tick"]["timestamp"] == 1_640_995_200_000, path
        assert tc.get("/neural/moves").json()["markets"] == [], path  # not frozen for an export


def test_percent_encoded_ids_keep_their_route(tc: TestClient, state: ServiceState) -> None:
    r = tc.get("/debug/markets/%41BC/state")
    assert r.status_code == 200 and r.json()["market_id"] == "ABC", r.text
    r = tc.get("/neural/nope%25")  # no route either way: the path decoded, and no word about encodings
    assert r.status_code == 404 and "'/neural/nope%'" in _error(r)["message"], r.text
    assert "percent-encode" not in _error(r)["message"]
    r = tc.get("/debug/markets/A%2FB/state")  # the id A/B, decoded
    assert r.status_code == 404 and "'A/B'" in _error(r)["message"], r.text
    r = tc.post("/neural/process?note=%41", json={**TICK, "timestamp": 1_640_995_202_000})  # a query is no route word
    assert r.status_code == 200, r.text
    assert tc.delete("/neural/markets/%41BC").json()["reset"] is True
    assert state.engine.pool.table.get("ABC") is None


def test_a_stream_at_a_percent_encoded_path_is_refused(tc: TestClient) -> None:
    with pytest.raises(Exception) as refused, tc.websocket_connect("/neural/%73tream?market_id=ABC"):
        pass
    assert "404" in str(refused.value) or getattr(refused.value, "status_code", None) == 404, refused.value
