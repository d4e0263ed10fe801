"""The HTTP API of a real server over a real socket: results, batches, every error, health and metrics."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import BASE_TS, LiveServer, market, signal_of, tick
from prometheus_client.parser import text_string_to_metric_families

GUIDE_TICK = {"price": 100.0, "volume": 1000.0, "timestamp": 1640995200000, "market_id": "TEST"}
RESULT_KEYS = {"market_id", "prediction", "probabilities", "confidence", "spike_count", "processing_time_ns",
               "warming_up", "model_version", "request_id"}
HEX32 = re.compile(r"^[0-9a-f]{32}$")


def neural_ticks(client: httpx.Client) -> int:
    """Ticks the engine has processed since start (from /neural/metrics)."""
    r = client.get("/neural/metrics")
    assert r.status_code == 200
    return int(r.json()["neural_metrics"]["ticks"])


def assert_error(r: httpx.Response, status: int, kind: str | None = None, field: str | None = None) -> dict[str, Any]:
    """An error response: the status, the JSON error shape, the field, the request id, no internals."""
    assert r.status_code == status, r.text
    assert r.status_code < 500
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"type", "message", "field", "request_id"}
    assert isinstance(err["message"], str) and err["message"]
    if kind is not None:
        assert err["type"] == kind
    assert err["field"] == field
    assert err["request_id"] == r.headers["x-request-id"]
    assert "Traceback" not in r.text and 'File "' not in r.text
    return err


def post_tick(client: httpx.Client, body: Any, path: str = "/neural/process", **kw: Any) -> httpx.Response:
    return client.post(path, json=body, **kw)


# -- /neural/process ---------------------------------------------------------------


def test_process_guide_tick(client: httpx.Client) -> None:
    r = post_tick(client, GUIDE_TICK)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == RESULT_KEYS
    assert body["market_id"] == "TEST"
    assert set(body["probabilities"]) == {"down", "flat", "up"}
    assert math.isclose(sum(body["probabilities"].values()), 1.0, abs_tol=1e-6)
    assert -1.0 <= body["prediction"] <= 1.0
    assert 0.0 <= body["confidence"] <= 1.0
    assert isinstance(body["spike_count"], int) and body["spike_count"] >= 0
    assert isinstance(body["processing_time_ns"], int) and body["processing_time_ns"] > 0
    assert body["model_version"]
    assert HEX32.match(body["request_id"])  # generated
    assert r.headers["x-request-id"] == body["request_id"]


def test_process_honours_request_id(client: httpx.Client) -> None:
    rid = "order-42.gw:7_a-b"
    r = post_tick(client, tick(market("RID")), headers={"X-Request-ID": rid})
    assert r.status_code == 200
    assert r.json()["request_id"] == rid and r.headers["x-request-id"] == rid


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "semi;colon", "<script>"])
def test_process_replaces_unsafe_request_id(client: httpx.Client, bad: str) -> None:
    r = post_tick(client, tick(market("RID")), headers={"X-Request-ID": bad})
    assert r.status_code == 200
    assert HEX32.match(r.json()["request_id"])
    assert r.headers["x-request-id"] == r.json()["request_id"]


def test_same_ticks_same_answers_on_two_markets(client: httpx.Client) -> None:
    a, b = market("A"), market("B")
    for k in range(5):
        ra = post_tick(client, tick(a, k)).json()
        rb = post_tick(client, tick(b, k)).json()
        assert signal_of(ra) == signal_of(rb)


# -- /neural/process/batch ------------------------------------------------------------


def test_batch_results_in_order(client: httpx.Client) -> None:
    a, b = market("BA"), market("BB")
    ticks = [tick(a, 0), tick(b, 0), tick(a, 1), tick(a, 2), tick(b, 1)]
    r = client.post("/neural/process/batch", json={"ticks": ticks}, headers={"X-Request-ID": "batch-1"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"results", "request_id"} and body["request_id"] == "batch-1"
    results = body["results"]
    assert [x["market_id"] for x in results] == [t["market_id"] for t in ticks]
    assert all(set(x) == RESULT_KEYS and x["request_id"] == "batch-1" for x in results)
    # the same ticks one by one on fresh markets give the same answers, in the same order
    c, d = market("BC"), market("BD")
    rename = {a: c, b: d}
    singles = [post_tick(client, {**t, "market_id": rename[t["market_id"]]}).json() for t in ticks]
    assert [signal_of(x) for x in results] == [signal_of(x) for x in singles]


@pytest.mark.parametrize(("bad_tick", "status", "field"), [
    ({"price": "x"}, 422, "ticks.2.price"),
    ({"price": -1.0}, 422, "ticks.2.price"),
    ({"volume": True}, 422, "ticks.2.volume"),
    ({"market_id": "B\x01"}, 422, "ticks.2.market_id"),
    ({"timestamp": BASE_TS - 60_000}, 409, "ticks.2.timestamp"),  # older than ticks 0 and 1 of the batch
    ({"extra": 1}, 422, "ticks.2.extra"),
])
def test_batch_bad_tick_changes_nothing(client: httpx.Client, bad_tick: dict[str, Any], status: int, field: str) -> None:
    m, fresh = market("BAD"), market("FRESH")
    good = [tick(m, 0), tick(m, 1)]
    before = neural_ticks(client)
    r = client.post("/neural/process/batch", json={"ticks": [*good, {**tick(m, 2), **bad_tick}, tick(m, 3)]})
    assert_error(r, status, "out_of_order" if status == 409 else "validation", field)
    assert neural_ticks(client) == before  # no tick of the batch was processed
    # the market never saw the rejected batch: it answers exactly like a fresh market
    after = client.post("/neural/process/batch", json={"ticks": good}).json()["results"]
    ref = client.post("/neural/process/batch", json={"ticks": [{**t, "market_id": fresh} for t in good]}).json()["results"]
    assert [signal_of(x) for x in after] == [signal_of(x) for x in ref]


@pytest.mark.parametrize(("body", "field"), [
    ({"ticks": []}, "ticks"),
    ({}, "ticks"),
    ({"ticks": {"price": 1.0}}, "ticks"),
    ({"ticks": [GUIDE_TICK], "more": 1}, "more"),
])
def test_batch_bad_envelope(client: httpx.Client, body: Any, field: str) -> None:
    assert_error(client.post("/neural/process/batch", json=body), 422, "validation", field)


# -- every error of /neural/process ---------------------------------------------------------


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in GUIDE_TICK.items() if k != key}


ERROR_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("missing price", _without("price"), "price"),
    ("missing volume", _without("volume"), "volume"),
    ("missing timestamp", _without("timestamp"), "timestamp"),
    ("missing market_id", _without("market_id"), "market_id"),
    ("extra field", {**GUIDE_TICK, "side": "buy"}, "side"),
    ("price as string", {**GUIDE_TICK, "price": "100"}, "price"),
    ("price null", {**GUIDE_TICK, "price": None}, "price"),
    ("timestamp float", {**GUIDE_TICK, "timestamp": 1.5}, "timestamp"),
    ("timestamp string", {**GUIDE_TICK, "timestamp": "1640995200000"}, "timestamp"),
    ("market_id number", {**GUIDE_TICK, "market_id": 5}, "market_id"),
    ("volume bool", {**GUIDE_TICK, "volume": True}, "volume"),
    ("price bool", {**GUIDE_TICK, "price": False}, "price"),
    ("price 0", {**GUIDE_TICK, "price": 0}, "price"),
    ("price negative", {**GUIDE_TICK, "price": -100.0}, "price"),
    ("volume negative", {**GUIDE_TICK, "volume": -1.0}, "volume"),
    ("timestamp in seconds", {**GUIDE_TICK, "timestamp": 1640995200}, "timestamp"),
    ("timestamp in microseconds", {**GUIDE_TICK, "timestamp": 1640995200000000}, "timestamp"),
    ("timestamp negative", {**GUIDE_TICK, "timestamp": -1}, "timestamp"),
    ("market_id empty", {**GUIDE_TICK, "market_id": ""}, "market_id"),
    ("market_id 65 chars", {**GUIDE_TICK, "market_id": "M" * 65}, "market_id"),
    ("market_id control char", {**GUIDE_TICK, "market_id": "TE\x01ST"}, "market_id"),
    ("market_id newline", {**GUIDE_TICK, "market_id": "TEST\n"}, "market_id"),
    ("market_id non-ascii", {**GUIDE_TICK, "market_id": "TÉST"}, "market_id"),
    ("market_id padded", {**GUIDE_TICK, "market_id": " TEST"}, "market_id"),
]


@pytest.mark.parametrize(("body", "field"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_process_invalid_tick(client: httpx.Client, body: dict[str, Any], field: str) -> None:
    before = neural_ticks(client)
    assert_error(post_tick(client, body), 422, "validation", field)
    assert neural_ticks(client) == before


@pytest.mark.parametrize(("timestamp", "hint"), [
    (1_640_995_200, "this one looks like seconds, multiply it by 1000"),
    (31_536_000, "this one looks like seconds, multiply it by 1000"),  # 1971-01-01 in seconds
    (4_102_444_799, "this one looks like seconds, multiply it by 1000"),  # the last second before 2100
    (1_640_995_200.0, "this one looks like seconds, multiply it by 1000"),
    (1_640_995_200_000_000, "this one looks like µs, divide it by 1000"),
    (1_640_995_200_000_000_000, "this one looks like ns, divide it by 1000000"),
    (5, None),
    pytest.param(10**400, None, id="401 digits"),  # beyond any float: the unit guess multiplied it by one (a 500)
    pytest.param(-(10**400), None, id="-401 digits"),
])
def test_a_timestamp_out_of_range_is_refused_with_the_unit_it_looks_like(client: httpx.Client, timestamp: float,
                                                                          hint: str | None) -> None:
    """Trading systems send seconds or ns as often as ms: the refusal said only "Input should be greater than or equal
    to 946684800000"; it now says the unit and, for a time of 1971..2100 in seconds, µs or ns, how to convert it
    (single ticks and batches, through the tick route and the FastAPI routes alike)."""
    want = "; a timestamp is ms since the Unix epoch (1971..2100)" + (f": {hint}" if hint else "")
    err = assert_error(post_tick(client, {**GUIDE_TICK, "timestamp": timestamp}), 422, "validation", "timestamp")
    assert err["message"].endswith(want), err["message"]
    batch = {"ticks": [GUIDE_TICK, {**GUIDE_TICK, "timestamp": timestamp}]}
    err = assert_error(client.post("/neural/process/batch", json=batch), 422, "validation", "ticks.1.timestamp")
    assert err["message"].endswith(want), err["message"]


def test_a_history_from_before_2000_is_served(client: httpx.Client) -> None:
    """Daily closes since the 1980s or 1990s are what ``train`` and ``evaluate`` read: the service refused every tick
    before 2000-01-01, so such a history could not be replayed through it. From 1971 on (a time in seconds, read as
    ms, is earlier) it is served."""
    hist = market("HIST")
    for ts in (31_536_000_000, 504_921_600_000, 788_918_400_000):  # 1971, 1986, 1995
        r = post_tick(client, {**GUIDE_TICK, "timestamp": ts, "market_id": hist})
        assert r.status_code == 200, r.text
    err = assert_error(post_tick(client, {**GUIDE_TICK, "timestamp": 31_535_999_999, "market_id": market("HIST")}), 422,
                       "validation", "timestamp")
    assert "(1971..2100)" in err["message"]


@pytest.mark.parametrize(("raw", "field"), [
    (b'{"price": 1e400, "volume": 1000.0, "timestamp": 1640995200000, "market_id": "TEST"}', "price"),
    (b'{"price": 100.0, "volume": -1e400, "timestamp": 1640995200000, "market_id": "TEST"}', "volume"),
    (b'{"price": NaN, "volume": 1000.0, "timestamp": 1640995200000, "market_id": "TEST"}', "price"),
    (b'{"price": 100.0, "volume": Infinity, "timestamp": 1640995200000, "market_id": "TEST"}', "volume"),
], ids=["price 1e400", "volume -1e400", "price NaN", "volume Infinity"])
def test_process_non_finite(client: httpx.Client, raw: bytes, field: str) -> None:
    r = client.post("/neural/process", content=raw, headers={"Content-Type": "application/json"})
    err = assert_error(r, 422, "validation", field)
    assert "finite" in err["message"]


@pytest.mark.parametrize("raw", [b'{"price": 100.0,', b"not json", b"{'price': 1}", b"\xff\xfe"],
                         ids=["truncated", "text", "single quotes", "binary"])
def test_process_malformed_json(client: httpx.Client, raw: bytes) -> None:
    r = client.post("/neural/process", content=raw, headers={"Content-Type": "application/json"})
    assert_error(r, 400, "malformed_json", None)


@pytest.mark.parametrize("body", [b"", b"[]", b"null", b'"tick"'], ids=["empty", "array", "null", "string"])
def test_process_body_not_an_object(client: httpx.Client, body: bytes) -> None:
    r = client.post("/neural/process", content=body, headers={"Content-Type": "application/json"})
    assert_error(r, 422, "validation", None)


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None],
                         ids=["text/plain", "form", "none"])
@pytest.mark.parametrize("path", ["/neural/process", "/neural/process/batch"])
def test_wrong_content_type(client: httpx.Client, ctype: str | None, path: str) -> None:
    body = GUIDE_TICK if path == "/neural/process" else {"ticks": [GUIDE_TICK]}
    req = client.build_request("POST", path, content=json.dumps(body).encode())
    if ctype is None:
        req.headers.pop("content-type", None)
    else:
        req.headers["content-type"] = ctype
    before = neural_ticks(client)
    assert_error(client.send(req), 415, "unsupported_media_type", None)
    assert neural_ticks(client) == before


def test_json_content_type_with_charset(client: httpx.Client) -> None:
    r = client.post("/neural/process", content=json.dumps(tick(market("CS"))).encode(),
                    headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def _big_body(size: int) -> bytes:
    return json.dumps({**GUIDE_TICK, "market_id": "X" * size}).encode()


def test_body_too_large_with_content_length(client: httpx.Client) -> None:
    r = client.post("/neural/process", content=_big_body(1_100_000), headers={"Content-Type": "application/json"})
    err = assert_error(r, 413, "body_too_large", None)
    assert "max_body_size" in err["message"]
    assert client.get("/health").status_code == 200  # the connection pool still works


def test_a_request_answered_before_routing_is_counted_under_its_route(client: httpx.Client) -> None:
    """A body declared too large is refused before the request reaches its route; the request metric still names the
    route (as the API documents it), not ``other``, which is for paths no route has."""
    def count(route: str) -> float:
        return sum(s.value for s in _samples(client.get("/metrics").text)["cerebellar_norse_http_requests_total"]
                   if s.labels == {"route": route, "method": "POST", "status": "413"})

    before, other = count("/neural/process"), count("other")
    r = client.post("/neural/process", content=_big_body(1_100_000), headers={"Content-Type": "application/json"})
    assert_error(r, 413, "body_too_large", None)
    assert count("/neural/process") == before + 1 and count("other") == other
    assert client.post("/no/such/route", content=_big_body(1_100_000),
                       headers={"Content-Type": "application/json"}).status_code == 413
    assert count("other") == other + 1  # a path without a route stays other
    before = count("/training")  # a route behind FastAPI's router, refused by its middleware the same way
    assert client.post("/training", content=_big_body(1_100_000),
                       headers={"Content-Type": "application/json"}).status_code == 413
    assert count("/training") == before + 1 and count("other") == other + 1


def test_body_too_large_chunked(client: httpx.Client) -> None:
    body = _big_body(1_100_000)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 64 * 1024):
            yield body[i:i + 64 * 1024]

    r = client.post("/neural/process/batch", content=chunks(), headers={"Content-Type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_error(r, 413, "body_too_large", None)


def test_body_just_under_the_limit_is_read(client: httpx.Client) -> None:
    # ~0.9 MB passes the size check and fails validation (market_id too long): 422, not 413
    r = client.post("/neural/process", content=_big_body(900_000), headers={"Content-Type": "application/json"})
    assert_error(r, 422, "validation", "market_id")


def test_out_of_order_tick_leaves_state_untouched(client: httpx.Client) -> None:
    m, fresh = market("OOO"), market("REF")
    for k in (0, 1, 2):
        assert post_tick(client, tick(m, k)).status_code == 200
        post_tick(client, tick(fresh, k))
    before = neural_ticks(client)
    err = assert_error(post_tick(client, tick(m, 1)), 409, "out_of_order", "timestamp")
    assert str(BASE_TS + 1000) in err["message"]
    assert neural_ticks(client) == before
    assert post_tick(client, tick(m, 2)).status_code == 200  # same timestamp as the last tick is in order
    post_tick(client, tick(fresh, 2))
    assert signal_of(post_tick(client, tick(m, 3)).json()) == signal_of(post_tick(client, tick(fresh, 3)).json())


def test_unknown_route_404(client: httpx.Client) -> None:
    assert_error(client.get("/neural/nope"), 404, "not_found", None)
    assert_error(client.post("/v2/process", json=GUIDE_TICK), 404, "not_found", None)


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", "/neural/process", "POST"), ("PUT", "/neural/process/batch", "POST"),
    ("POST", "/health", "GET, HEAD"), ("DELETE", "/metrics", "GET, HEAD"), ("POST", "/neural/metrics", "GET, HEAD"),
    # the operations the OpenAPI document lists for the path's template (DELETE of "NO-SUCH/export" resets the
    # market of that id: another resource)
    ("GET", "/neural/markets/NO-SUCH/export", "POST"), ("POST", "/neural/markets/NO-SUCH/state", "PUT")])
def test_wrong_method_405(client: httpx.Client, method: str, path: str, allow: str) -> None:
    r = client.request(method, path)
    assert_error(r, 405, "method_not_allowed", None)
    assert r.headers["allow"] == allow  # every method the path answers, HEAD of the probes included
    for m in allow.split(", "):
        assert client.request(m, path).status_code != 405


def test_errors_are_counted(client: httpx.Client) -> None:
    def count(kind: str) -> float:
        for fam in text_string_to_metric_families(client.get("/metrics").text):
            for s in fam.samples:
                if s.name == "cerebellar_norse_errors_total" and s.labels.get("kind") == kind:
                    return s.value
        return 0.0

    before = count("validation")
    post_tick(client, {**GUIDE_TICK, "price": -1.0})
    assert count("validation") == before + 1


# -- /health, /neural/metrics, /metrics ---------------------------------------------------------


def test_health(client: httpx.Client) -> None:
    r = client.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["model_version"] == "seed-42"  # the live service has no stored model: the untrained network
    assert body["status"] == "degraded" and "untrained network of seed 42" in body["reason"], body
    assert body["device"] == "cpu"
    assert isinstance(body["uptime_s"], (int, float)) and body["uptime_s"] > 0
    assert {"markets", "capacity", "usage", "evictions"} <= set(body["pool"])
    assert 0 <= body["pool"]["markets"] <= body["pool"]["capacity"]
    assert body["queue_depth"] == 0
    assert HEX32.match(r.headers["x-request-id"])


def test_neural_metrics_shape(client: httpx.Client) -> None:
    post_tick(client, tick(market("NM")))
    r = client.get("/neural/metrics")
    assert r.status_code == 200
    nm = r.json()["neural_metrics"]
    assert set(nm["spike_counts"]) == {"granule", "purkinje", "dcn"}
    assert all(isinstance(v, int) and v >= 0 for v in nm["spike_counts"].values())
    assert 0.0 <= nm["sparsity"] <= 1.0
    assert isinstance(nm["markets"], int) and nm["markets"] >= 1
    assert nm["ticks"] >= 1


ALERT_NAMES = {"processing_duration_seconds", "cuda_memory_used_bytes", "cuda_memory_total_bytes", "training_loss"}


def _samples(text: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_prometheus_metrics(client: httpx.Client) -> None:
    pm = market("PM")
    post_tick(client, tick(pm))
    assert client.delete(f"/neural/markets/{pm}").status_code == 200
    bad = client.post("/neural/process", content=b"{", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400  # counted in cerebellar_norse_errors_total (a sample whatever ran before)
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    samples = _samples(r.text)
    assert "# TYPE training_loss gauge" in r.text  # its sample only once a training loss is known
    for name in ("cuda_memory_used_bytes", "cuda_memory_total_bytes", "cerebellar_norse_http_requests_total",
                 "cerebellar_norse_errors_total", "cerebellar_norse_pool_evictions_total", "processing_duration_seconds_count"):
        assert name in samples, name
    edges = {s.labels["le"] for s in samples["processing_duration_seconds_bucket"]}
    assert "1e-05" in edges and "1e-06" in edges and "+Inf" in edges
    assert samples["cuda_memory_used_bytes"][0].value == 0 and samples["cuda_memory_total_bytes"][0].value == 0  # CPU
    for name in samples:
        if name.startswith(("python_", "process_")):
            continue
        family = re.sub(r"_(bucket|count|sum|created)$", "", name)
        assert name.startswith("cerebellar_norse_") or family in ALERT_NAMES, f"unprefixed metric {name}"
    routes = {s.labels["route"] for s in samples["cerebellar_norse_http_requests_total"]}
    assert "/neural/process" in routes  # labelled by route template, not by raw path
    assert "/neural/markets/{market_id}" in routes  # as docs/http.md names it, without Starlette's {…:path}
    assert not [r for r in routes if ":" in r], routes
    # the operations guide's "curl -s .../metrics | grep latency" finds the latency histograms
    found = [line for line in r.text.splitlines() if "latency" in line]
    assert any("processing_duration_seconds" in line for line in found)
    assert any("cerebellar_norse_http_request_duration_seconds" in line for line in found)


def test_processing_histogram_counts_only_client_ticks(client: httpx.Client) -> None:
    post_tick(client, tick(market("HC")))
    samples = _samples(client.get("/metrics").text)
    assert samples["processing_duration_seconds_count"][0].value == samples["cerebellar_norse_ticks_total"][0].value
    assert samples["processing_duration_seconds_count"][0].value == neural_ticks(client)


def test_latency_quantiles_are_a_summary_with_the_histograms_sum_and_count(client: httpx.Client) -> None:
    post_tick(client, tick(market("LQ")))
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    lat = families["cerebellar_norse_processing_latency_seconds"]
    assert lat.type == "summary"
    by_name: dict[str, list[Any]] = {}
    for s in lat.samples:
        by_name.setdefault(s.name, []).append(s)
    quantiles = {s.labels["quantile"]: s.value for s in by_name["cerebellar_norse_processing_latency_seconds"]}
    assert set(quantiles) == {"0.5", "0.95", "0.99"} and 0 < quantiles["0.5"] <= quantiles["0.95"] <= quantiles["0.99"]
    hist = {s.name: s.value for s in families["processing_duration_seconds"].samples if not s.labels}
    assert by_name["cerebellar_norse_processing_latency_seconds_count"][0].value == hist["processing_duration_seconds_count"]
    assert by_name["cerebellar_norse_processing_latency_seconds_sum"][0].value == hist["processing_duration_seconds_sum"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (make tools installs it)")
def test_metrics_pass_promtools_lint(client: httpx.Client) -> None:
    post_tick(client, tick(market("PL")))
    scrape = client.get("/metrics").content
    proc = subprocess.run(["promtool", "check", "metrics"], input=scrape, capture_output=True, timeout=60)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


def test_openapi_documents_the_routes(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/neural/process", "/neural/process/batch", "/neural/metrics", "/health", "/metrics"} <= set(paths)


def test_server_log_is_json_without_tracebacks(live: LiveServer, client: httpx.Client) -> None:
    post_tick(client, {**GUIDE_TICK, "price": "bad"})
    for line in live.log().splitlines():
        rec = json.loads(line)
        assert rec["level"] != "ERROR", line


def test_open_connections_are_a_gauge_beside_their_limit(live: LiveServer, client: httpx.Client) -> None:
    """An operator watching for a leak of connections (clients that never close) sees them in /metrics."""
    import socket
    import time

    def gauges() -> tuple[float, float]:
        found = _samples(client.get("/metrics").text)
        return found["cerebellar_norse_http_connections"][0].value, found["cerebellar_norse_http_connections_limit"][0].value

    before, limit = gauges()
    assert before >= 1 and limit == 10000  # the scrape's own connection; the built-in server.max_connections
    held = [socket.create_connection(("127.0.0.1", live.port)) for _ in range(5)]
    try:
        deadline = time.monotonic() + 10
        while gauges()[0] < before + 5 and time.monotonic() < deadline:
            time.sleep(0.05)  # (each accepted by the event loop in its own time)
        assert gauges()[0] == before + 5
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while gauges()[0] > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gauges()[0] == before


HTTP_DOC = Path(__file__).resolve().parents[2] / "docs" / "http.md"


def _documented_curls(text: str) -> list[tuple[int, str, str]]:
    """(line, command, documented output or "") of each ``curl`` of the doc's ``bash`` blocks, in the doc's order;
    the output is the ``# …`` lines right after the command (a ``#`` line after a blank one says what comes next),
    or a ``json`` block right after the block that ends with the command."""
    found: list[tuple[int, str, str]] = []
    lines = text.splitlines()
    in_block, command, start, last_block_end = False, "", 0, -1
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            if line.strip() == "```json" and found and not found[-1][2] and not in_block and last_block_end == number - 2:
                sample = "\n".join(lines[number:lines.index("```", number)]) + "\n"
                try:  # a sample answer shown as the block after the command's: its keys and their types
                    json.loads(sample)
                    found[-1] = (found[-1][0], found[-1][1], sample)
                except ValueError:  # elided ({…}): not an answer to compare with
                    pass
            if in_block:
                last_block_end = number
            in_block, command = line.strip() == "```bash", ""
            continue
        if not in_block:
            continue
        if line.startswith("# ") and command and found and found[-1][:2] == (start, command):
            found[-1] = (start, command, found[-1][2] + line[2:] + "\n")
            continue
        if command and (command.endswith("\\\n") or line.startswith((" ", "\t"))) and line.strip():
            command += line + "\n"
            found[-1] = (start, command, "")
        elif line.startswith("curl "):
            command, start = line + "\n", number
            found.append((start, command, ""))
        else:
            command = ""
    return found


def _matches(documented: str, printed: str) -> bool:
    """``printed`` is what ``documented`` shows: ``…`` stands for any text, whitespace does not count; a JSON
    object shown without ``…``, with sample values, matches one with those keys (and maybe more) with values of the same types."""
    pattern = ".*".join(re.escape(part) for part in re.sub(r"\s+", "", documented).split("…"))
    if re.fullmatch(pattern, re.sub(r"\s+", "", printed), re.DOTALL):
        return True
    if "…" in documented:  # an answer written out, but for what varies: the rest as shown
        return False
    try:
        shown, got = json.loads(documented), json.loads(printed)
    except ValueError:
        return False
    return (isinstance(shown, dict) and isinstance(got, dict) and shown.keys() <= got.keys()
            and all(_kind(shown[k]) == _kind(got[k]) for k in shown))


def _kind(value: Any) -> str:
    """The JSON type of a value (an integral float such as 0.0 may print as 0)."""
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


@pytest.mark.slow
@pytest.mark.tools
@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("jq") is None, reason="needs curl and jq")
def test_http_doc_examples_print_what_the_doc_shows(start_server: Any, tmp_path: Path) -> None:
    """Every ``curl`` of docs/http.md runs, in the doc's order, against a real server with a token (the doc's
    ``$CEREBELLAR_NORSE_SERVER__API_TOKEN``, ``$TOKEN`` and ``$AUTH``), and each one followed by its output
    (``# …``) prints that output: a sample pasted long ago, or a field renamed, shows here."""
    token = "doc-examples-token"
    srv = start_server(tmp_path / "state", env={"CEREBELLAR_NORSE_SERVER__API_TOKEN": token})
    curls = [c for c in _documented_curls(HTTP_DOC.read_text(encoding="utf-8"))
             if "<" not in c[1] and "/training" not in c[1]]  # no placeholders to fill in, no training job
    shown = [c for c in curls if c[2]]
    assert len(curls) >= 20 and len(shown) >= 7, shown  # the error, order, status, batch, reset, auth and metrics
    # the reset example forgets BTC/USD, a market the doc's reader has been sending ticks for
    httpx.post(f"{srv.url}/neural/process", json={**GUIDE_TICK, "market_id": "BTC/USD"}, timeout=10).raise_for_status()
    env = {**os.environ, "CEREBELLAR_NORSE_SERVER__API_TOKEN": token, "TOKEN": token,
           "AUTH": f"Authorization: Bearer {token}"}
    for line, command, documented in curls:
        run = command.replace("http://localhost:8080", srv.url)
        r = subprocess.run(["bash", "-o", "pipefail", "-c", run], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, f"docs/http.md:{line}: {command}{r.stderr}"
        if documented:
            assert _matches(documented, r.stdout), f"docs/http.md:{line}: {command}shows\n{documented}printed\n{r.stdout}"
