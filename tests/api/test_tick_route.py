"""One implementation of the tick route, and request timelines.

The ASGI fast path and the FastAPI route of ``POST /neural/process`` must answer every
request alike (they share the steps of :mod:`cerebellar_norse.api.tickpath`); each tick
request leaves a timeline whose stages are present and in order.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP, LiveServer

from cerebellar_norse.api.app import create_app
from cerebellar_norse.api.routes import training
from cerebellar_norse.api.schemas import BatchOut, ResultOut
from cerebellar_norse.api.server import build_service
from cerebellar_norse.api.tickpath import batch_json, result_json
from cerebellar_norse.cli import main
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.engine.records import TickResult
from cerebellar_norse.observability.timelines import STAGES, Timeline, TimelineBook, ascii_timeline

TOKEN = "timeline-token"
NOW_MS = int(time.time() * 1000)
VOLATILE = ("request_id", "processing_time_ns")


def _client(tmp_path: Path, fast_path: bool) -> TestClient:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / ("fast" if fast_path else "route")), **NO_BOOTSTRAP,
               "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN}
    return TestClient(create_app(build_service(load_checked_config(None, environ=environ)), fast_path=fast_path),
                      raise_server_exceptions=False)


def _tick(market: str, k: int, price: float = 100.0) -> dict[str, Any]:
    return {"price": price + 0.01 * k, "volume": 1000.0 + k, "timestamp": NOW_MS - 100_000 + 10 * k, "market_id": market}


# (body bytes or JSON, headers) in order; later requests depend on the state earlier ones left.
REQUESTS: list[tuple[Any, dict[str, str]]] = [
    *[(_tick("A" if k % 2 else "B/C", k), {}) for k in range(12)],
    (_tick("A", 3), {}),  # older than A's last tick: 409 out_of_order
    ({**_tick("A", 40), "timestamp": NOW_MS + 3_600_000}, {}),  # an hour ahead of the clock: 409 future_timestamp
    ({**_tick("A", 41), "extra": 1}, {}),
    ({**_tick("A", 42), "price": -1.0}, {}),
    ({**_tick("A", 43), "market_id": " A"}, {}),
    ({**_tick("A", 44), "timestamp": 1.5e12 + 0.5}, {}),
    # more errors than firsterrors.ERRORS_LISTED: the first error still a known field's, then the first unknown key
    ({**{f"u{i}": i for i in range(40)}, **_tick("A", 48), "price": "1", "volume": -1.0}, {}),
    ({**{f"u{i}": i for i in range(40)}, "volume": 1.0, "timestamp": NOW_MS, "market_id": "A"}, {}),
    ({**{f"u{i}": [i] for i in range(40)}, **_tick("A", 48), "market_id": " A"}, {}),
    ({**_tick("A", 48), **{f"u{i}": {"k": i} for i in range(40)}}, {}),
    (b"{not json", {}),
    (b'{"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "A",}', {}),
    (b'{"price": NaN, "volume": 1.0, "timestamp": 1640995200000, "market_id": "A"}', {}),
    ('{"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "\u00e9"}'.encode(), {}),
    (b'{"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "\xff"}', {}),
    (b"", {}),
    (b" \n\t ", {}),  # whitespace only: malformed JSON (400) on both, not a missing body
    (b"[]", {}),
    (b"[" * 100_000 + b"]" * 100_000, {}),  # deeper than either JSON parser goes: 400, not a 500
    (b'{"price": 1.0, "volume": 1.0, "timestamp": 1' + b"0" * 5000 + b', "market_id": "A"}', {}),  # past int()'s digits
    (b'{"price": 1' + b"0" * 5000 + b'.5, "volume": 1.0, "timestamp": 1640995200000, "market_id": "A"}', {}),
    (_tick("A", 45), {"content-type": "text/plain"}),
    (_tick("A", 45), {"content-encoding": "gzip"}),  # a coding the body was not sent in: 415, the tick not applied
    (_tick("A", 46), {"x-market-id": "B/C"}),  # routed by another market's header: 422
    (_tick('q"u\\o\'te', 1), {}),  # a market id that JSON must escape
    (_tick("A", 47), {"x-market-id": "A"}),
    *[(_tick("D", k, 50.0), {}) for k in range(5)],
]


def _send(c: TestClient, body: Any, headers: dict[str, str]) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return c.post("/neural/process", content=data, headers={"content-type": "application/json", **headers})


def _comparable(r: Any) -> tuple[int, Any]:
    body = r.json()
    if "error" in body:
        body["error"].pop("request_id")
        if body["error"]["type"] == "future_timestamp":  # names the server clock, read a few ms apart
            body["error"]["message"] = re.sub(r"\d+ ms ahead|clock \(\d+\)", "#", body["error"]["message"])
    for k in VOLATILE:
        body.pop(k, None)
    return r.status_code, body


def test_fast_path_and_fastapi_route_answer_alike(tmp_path: Path) -> None:
    with _client(tmp_path, fast_path=True) as fast, _client(tmp_path, fast_path=False) as route:
        answers = []
        for body, headers in REQUESTS:
            a, b = _send(fast, body, headers), _send(route, body, headers)
            assert _comparable(a) == _comparable(b), (body, headers, a.text, b.text)
            assert a.headers["content-type"].startswith("application/json")
            answers.append(a.status_code)
    statuses = set(answers)
    assert {200, 409, 415, 422} <= statuses  # the list reaches answers, refusals of state and of input
    assert answers[:12] == [200] * 12 and answers[12] == 409 and answers[-6] == 200


def test_batch_route_answers_a_body_that_is_not_utf8_with_400(tmp_path: Path) -> None:
    with _client(tmp_path, fast_path=True) as c:
        r = c.post("/neural/process/batch", content=b'{"ticks": [{"market_id": "\xff"}]}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "malformed_json"
    assert "not UTF-8" in r.json()["error"]["message"]


def test_a_huge_refused_value_is_not_echoed_back_whole(tmp_path: Path) -> None:
    tick = {**_tick("X", 0), "market_id": "M" * 900_000}
    with _client(tmp_path, fast_path=True) as c:
        for path, body in (("/neural/process", tick), ("/neural/process/batch", {"ticks": [tick]})):
            r = c.post(path, json=body)
            err = r.json()["error"]
            assert r.status_code == 422 and err["field"] and len(r.content) < 2_000, (path, len(r.content))
            assert err["message"].endswith("… (900002 characters))")


@pytest.mark.parametrize("first", ["text/plain", "application/json"])
def test_a_repeated_header_is_read_as_its_first_copy_on_both_tick_routes(tmp_path: Path, first: str) -> None:
    other = "application/json" if first == "text/plain" else "text/plain"
    tick = _tick("DUP", 0)
    with _client(tmp_path, fast_path=True) as c:
        for path, body in (("/neural/process", tick), ("/neural/process/batch", {"ticks": [_tick("DUP2", 0)]})):
            r = c.post(path, content=json.dumps(body).encode(), headers=[("content-type", first), ("content-type", other)])
            assert r.status_code == (200 if first == "application/json" else 415), (path, r.text)
        r = c.post("/neural/process", content=json.dumps(_tick("DUP", 1)).encode(),
                   headers=[("content-type", "application/json"), ("x-market-id", "DUP"), ("x-market-id", "OTHER")])
        assert r.status_code == 200, r.text  # the first X-Market-ID, DUP, is the tick's market
        first_id, second_id = "a" * 32, "b" * 32
        r = c.post("/neural/process", content=json.dumps(_tick("DUP", 2)).encode(),
                   headers=[("content-type", "application/json"), ("x-request-id", first_id), ("x-request-id", second_id)])
        assert r.headers["x-request-id"] == first_id and r.json()["request_id"] == first_id, r.text


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-8-sig"])
def test_a_json_body_in_another_encoding_is_400_on_every_tick_route(tmp_path: Path, encoding: str) -> None:
    """JSON parsers that guess the encoding would read these; the service takes UTF-8 only, and applies nothing."""
    tick = {"price": 1.0, "volume": 1.0, "timestamp": 1_640_995_200_000, "market_id": "ENC"}
    bodies = {"/neural/process": tick, "/neural/process/batch": {"ticks": [tick]}}
    with _client(tmp_path, fast_path=True) as c:
        for path, body in bodies.items():
            r = c.post(path, content=json.dumps(body).encode(encoding), headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["type"] == "malformed_json", (path, r.text)
        assert c.post("/neural/process", json=tick).status_code == 200  # ENC had no tick applied before


@pytest.mark.parametrize(("body", "why"), [
    (b'{"ticks": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b'{"ticks": [{"price": 1.0, "volume": 1.0, "timestamp": 1' + b"0" * 5000 + b', "market_id": "A"}]}',
     "more than 4300 digits"),
])
@pytest.mark.parametrize("path", ["/neural/process/batch", "/training"])
def test_routes_with_bodies_say_why_a_body_is_not_json(tmp_path: Path, path: str, body: bytes, why: str) -> None:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP}
    app = create_app(build_service(load_checked_config(None, environ=environ)), extra_routers=[training.router])
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "malformed_json", r.text
    assert why in r.json()["error"]["message"]


def test_timelines_have_every_stage_in_order(tmp_path: Path) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with _client(tmp_path, fast_path=True) as c:
        ok = _send(c, _tick("T", 1), {"x-request-id": "req-one"})
        assert ok.status_code == 200 and ok.json()["request_id"] == "req-one"
        bad = _send(c, {**_tick("T", 2), "price": 0.0}, {"x-request-id": "req-bad"})
        assert bad.status_code == 422
        batch = c.post("/neural/process/batch", json={"ticks": [_tick("T", 3), _tick("U", 3), _tick("T", 4)]},
                       headers={"x-request-id": "req-batch"})
        assert batch.status_code == 200

        assert c.get("/debug/requests/req-one").status_code == 401  # token-guarded like every debug route
        one = c.get("/debug/requests/req-one", headers=auth).json()
        assert [s["stage"] for s in one["stages"]] == list(STAGES)
        at = [s["at_us"] for s in one["stages"]]
        assert None not in at and at == sorted(at) and at[0] == 0.0
        assert one["total_us"] == pytest.approx(at[-1]) and one["status"] == 200
        assert one["market_id"] == "T" and one["ticks"] == 1 and one["batch_size"] >= 1 and one["batch_seq"] >= 1
        assert all(s["took_us"] >= 0 for s in one["stages"])

        refused = c.get("/debug/requests/req-bad", headers=auth).json()  # refused by validation: no engine stages
        assert refused["status"] == 422
        reached = {s["stage"] for s in refused["stages"] if s["at_us"] is not None}
        assert reached == {"received", "sent"}

        many = c.get("/debug/requests/req-batch", headers=auth).json()
        assert many["route"] == "/neural/process/batch" and many["ticks"] == 3 and many["market_id"] is None
        assert many["batch_size"] == 3
        bat = [s["at_us"] for s in many["stages"]]
        assert None not in bat and bat == sorted(bat)

        missing = c.get("/debug/requests/nope", headers=auth)
        assert missing.status_code == 404 and missing.json()["error"]["field"] == "request_id"

        newest = c.get("/debug/requests?limit=2", headers=auth).json()
        assert newest["order"] == "newest" and [r["request_id"] for r in newest["requests"]] == ["req-batch", "req-bad"]
        slow = c.get("/debug/requests?slow=1&limit=10", headers=auth).json()["requests"]
        totals = [r["total_us"] for r in slow]
        assert len(slow) == 3 and totals == sorted(totals, reverse=True)
        assert c.get("/debug/requests?limit=0", headers=auth).status_code == 422


def _timeline(rid: str, total_ns: int, t0: int = 1_000) -> Timeline:
    tl = Timeline(rid, "/neural/process", t0)
    tl.marks[-1] = t0 + total_ns
    return tl


def test_book_keeps_the_slowest_and_the_most_recent_bounded() -> None:
    book = TimelineBook(recent=8, slowest=3)
    for k in range(100):
        book.finish(_timeline(f"r{k}", 1_000 + k * 7 % 50 + {5: 30_000, 17: 20_000, 60: 10_000}.get(k, 0)))
    assert len(book.recent) == 8 and [t.request_id for t in book.newest_first(3)] == ["r99", "r98", "r97"]
    assert [t.request_id for t in book.slowest_first(3)] == ["r5", "r17", "r60"]  # outside the recent ring, still kept
    assert book.get("r17") is not None and book.get("r50") is None and book.get("r93") is not None
    text = ascii_timeline(book.slowest_first(1)[0].as_dict())
    assert "r5" in text and "(not reached)" in text and text.splitlines()[-1].startswith("total")


@pytest.fixture
def live_token(start_server: Any, tmp_path: Path) -> Iterator[LiveServer]:
    yield start_server(tmp_path / "state", env={"CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN})


def test_trace_command_draws_a_live_request(live_token: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    import httpx

    r = httpx.post(live_token.url + "/neural/process", json=_tick("LIVE", 1), headers={"x-request-id": "trace-me"})
    assert r.status_code == 200
    assert main(["trace", "trace-me", "--url", live_token.url, "--token", TOKEN]) == 0
    out = capsys.readouterr().out
    assert "trace-me" in out and all(stage in out for stage in STAGES) and "(not reached)" not in out
    assert main(["trace", "--slow", "5", "--url", live_token.url, "--token", TOKEN, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["order"] == "slowest" and doc["requests"][0]["request_id"] == "trace-me"
    assert main(["trace", "unknown-id", "--url", live_token.url, "--token", TOKEN]) == 1
    assert "404" in capsys.readouterr().err
    assert main(["trace", "trace-me", "--url", live_token.url]) == 1  # no token: 401, said so, exit 1
    assert "401" in capsys.readouterr().err
    assert main(["trace", "--url", live_token.url]) == 2


def test_recordings_carry_each_ticks_request_id(tmp_path: Path) -> None:
    from cerebellar_norse.api.server import make_app
    from cerebellar_norse.engine.recording import read_recording

    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP,
               "CEREBELLAR_NORSE_DEBUG__RECORD_REQUESTS": "true"}
    app = make_app(build_service(load_checked_config(None, environ=environ)), restore=False, save_on_shutdown=False)
    with TestClient(app) as c:
        for k in range(3):
            assert _send(c, _tick("R", k), {"x-request-id": f"single-{k}"}).status_code == 200
        batch = c.post("/neural/process/batch", json={"ticks": [_tick("R", 3), _tick("S", 3)]}, headers={"x-request-id": "many"})
        assert batch.status_code == 200
    (path,) = sorted((tmp_path / "state" / "recordings").glob("ticks-*.csv"))
    scan = read_recording(path)
    assert [(r.request_id, t.market_id) for r, t in zip(scan.records, scan.ticks, strict=True)] == [
        ("single-0", "R"), ("single-1", "R"), ("single-2", "R"), ("many", "R"), ("many", "S")]


def _pydantic_json(r: TickResult, rid: str) -> bytes:
    return ResultOut.model_validate(r.as_json_object(rid)).model_dump_json().encode()


@pytest.mark.parametrize("market", ["BTC-USD", 'q"u\\o', "tab\there", "caf\u00e9", "~!@#$%^&*()_+{}|:<>?"])
def test_result_json_writes_what_the_response_model_writes(market: str) -> None:
    rng = np.random.default_rng(7)
    for k in range(300):
        p = rng.dirichlet(np.ones(3)) ** float(rng.choice([1.0, 30.0]))  # includes tiny numbers (exponent notation)
        r = TickResult(market, np.float64(p[0]), float(p[1]), float(p[2]), float(rng.random()), np.int64(k * 37),
                       int(rng.integers(0, 10**12)), bool(k % 2), model_version=f"v{k}\"x")
        fast, slow = result_json(r, f"rid-{k}"), _pydantic_json(r, f"rid-{k}")
        assert json.loads(fast) == json.loads(slow), (fast, slow)
        assert list(json.loads(fast)) == list(json.loads(slow))  # same field order


def test_result_json_writes_non_finite_numbers_as_the_response_model_does() -> None:
    for bad in (float("nan"), float("inf")):
        r = TickResult("M", bad, 0.5, 0.5, bad, 1, 2, False, "v")
        assert result_json(r, "x") == _pydantic_json(r, "x")
        assert json.loads(result_json(r, "x"))["prediction"] is None


def test_batch_json_writes_what_the_batch_model_writes() -> None:
    results = [TickResult(m, 0.2, 0.3, 0.5, 0.1, k, 7 * k, k == 0, "v1") for k, m in enumerate(["A", 'q"x', "B/C"])]
    results.append(TickResult("N", float("nan"), 0.5, 0.5, 0.0, 1, 2, False, "v1"))  # non-finite: written as null
    for rows in (results, []):
        slow = BatchOut.model_validate({"results": [r.as_json_object("rid-1") for r in rows],
                                        "request_id": "rid-1"}).model_dump_json()
        assert json.loads(batch_json(rows, "rid-1")) == json.loads(slow)


def test_an_unterminated_string_is_placed_once() -> None:
    from cerebellar_norse.api.errors import json_problem

    assert json_problem(b'{"market_id": "A') == "Unterminated string starting at line 1 column 15"
    assert json_problem(b'{"price": }') == "Expecting value at line 1 column 11"
    assert json_problem(b'{"price": 1}') is None


@pytest.mark.parametrize("fast_path", [True, False])
def test_every_tick_is_logged_at_debug_whatever_its_route(tmp_path: Path, fast_path: bool,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """docs/operations.md: at DEBUG every tick is logged. Only single ticks were: a batch request logged nothing."""
    import logging

    def logged() -> list[tuple[str, int]]:
        lines = [r for r in caplog.records if r.getMessage() == "tick processed"]
        caplog.clear()
        assert all(r.levelno == logging.DEBUG for r in lines)
        return [(r.fields["market_id"], r.fields["processing_time_ns"]) for r in lines]  # type: ignore[attr-defined]

    with _client(tmp_path, fast_path) as c, caplog.at_level(logging.DEBUG, logger="cerebellar_norse.api"):
        assert _send(c, _tick("A", 0), {}).status_code == 200
        assert [m for m, _ in logged()] == ["A"]
        batch = c.post("/neural/process/batch", json={"ticks": [_tick("A", 1), _tick("B", 1), _tick("A", 2)]})
        assert batch.status_code == 200, batch.text
        lines = logged()
        assert [m for m, _ in lines] == ["A", "B", "A"]
        assert [ns for _, ns in lines] == [r["processing_time_ns"] for r in batch.json()["results"]]
        with c.websocket_connect("/neural/stream") as ws:
            ws.send_text(json.dumps(_tick("B", 2)))
            assert "prediction" in json.loads(ws.receive_text())
        assert [m for m, _ in logged()] == ["B"]
