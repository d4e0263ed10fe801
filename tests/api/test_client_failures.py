"""What the client raises when the network or a proxy fails it (no live service: httpx's mock transport)."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal

import httpx
import numpy as np
import pytest

from cerebellar_norse.client import BatchPartError, Client, OutcomeUnknownError
from cerebellar_norse.errors import CapacityError, EngineFatalError, InputError, TickOrderError

T0 = 1_700_000_000_000
HAPROXY_503 = "<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n</body></html>\n"


def tick(m: str, k: int, **kw: object) -> dict[str, object]:
    return {"price": 100.0, "volume": 1.0, "timestamp": T0 + 1000 * k, "market_id": m, **kw}


def client(handler: httpx.MockTransport, **kw: object) -> Client:
    return Client("http://svc", transport=handler, **kw)  # type: ignore[arg-type]


def test_no_answer_after_sending_says_the_tick_may_be_applied_not_unreachable() -> None:
    def read_timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with client(httpx.MockTransport(read_timeout)) as c, pytest.raises(OutcomeUnknownError) as exc:
        c.process(tick("A", 0))
    assert exc.value.market_id == "A" and "may have been applied" in str(exc.value) and "cannot reach" not in str(exc.value)
    assert isinstance(exc.value, EngineFatalError)  # callers catching EngineFatalError still catch it

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with client(httpx.MockTransport(refused)) as c, pytest.raises(EngineFatalError, match="cannot reach") as exc2:
        c.process(tick("A", 0))
    assert not isinstance(exc2.value, OutcomeUnknownError)  # nothing was sent


def test_a_proxys_503_page_is_retried_and_health_raises_the_tree() -> None:
    calls: list[str] = []

    def haproxy_then_ok(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) == 1:
            return httpx.Response(503, text=HAPROXY_503, headers={"Content-Type": "text/html"})
        return httpx.Response(200, json={"market_id": "A", "prediction": 0.0})

    with client(httpx.MockTransport(haproxy_then_ok), retries=1, max_wait_s=0.0) as c:
        assert c.process(tick("A", 0))["market_id"] == "A" and len(calls) == 2
    with client(httpx.MockTransport(lambda r: httpx.Response(503, text=HAPROXY_503))) as c, pytest.raises(CapacityError):
        c.health()
    refusal = {"error": {"type": "capacity", "message": "too many open connections", "field": None, "request_id": "x"}}
    refused = httpx.MockTransport(lambda r: httpx.Response(503, json=refusal, headers={"Retry-After": "1"}))
    with client(refused) as c, pytest.raises(CapacityError, match="too many open connections"):
        c.health()
    starting = {"status": "unavailable", "reason": "starting: loading the model"}
    with client(httpx.MockTransport(lambda r: httpx.Response(503, json=starting))) as c:
        assert c.health()["reason"] == "starting: loading the model"


def test_a_split_batchs_errors_name_the_callers_tick() -> None:
    applied: list[str] = []

    def service(request: httpx.Request) -> httpx.Response:
        ticks = json.loads(request.content)["ticks"]
        for j, t in enumerate(ticks):
            if t["price"] <= 0:
                return httpx.Response(422, json={"error": {"type": "validation", "message": "Input should be greater than 0",
                                                           "field": f"ticks.{j}.price", "request_id": "r"}})
            if t["timestamp"] < T0 + 2000 and t["market_id"] == "B" and applied:
                return httpx.Response(409, json={"error": {"type": "out_of_order", "message": "older",
                                                           "field": f"ticks.{j}.timestamp", "request_id": "r"}})
        applied.append(ticks[0]["market_id"])
        return httpx.Response(200, json={"results": [{"market_id": t["market_id"]} for t in ticks], "request_id": "r"})

    with client(httpx.MockTransport(service)) as c:
        with pytest.raises(InputError) as exc:
            c.process_batch([tick("A", 1), tick("B", 1), tick("B", 2), tick("A", 2, price=-1.0)])
        assert exc.value.field == "ticks.3.price" and str(exc.value).startswith("ticks.3.price:")
        with pytest.raises(BatchPartError) as part:
            c.process_batch([tick("A", 3), tick("B", 3), tick("B", 1)])
        assert isinstance(part.value.cause, TickOrderError) and part.value.cause.field == "ticks.2.timestamp"
        assert part.value.cause.status_code == 409
        # the applied part's results are not lost: a trading system cannot resend those ticks to get them
        assert part.value.applied == ["A"] and part.value.results == [{"market_id": "A"}, None, None]


def test_a_tick_that_is_not_a_mapping_is_an_input_error() -> None:
    with client(httpx.MockTransport(lambda r: httpx.Response(500))) as c, pytest.raises(InputError, match="mapping"):
        c.process([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [{"error": "no healthy upstream"}, ["x"], {"error": ["x"]}, "plain"])
def test_a_proxys_json_that_is_not_the_services_error_is_still_the_tree(body: object) -> None:
    """A proxy's own JSON (Envoy's 503 {"error": "..."}), a list, a string: the status decides the error."""
    calls: list[int] = []

    def proxy_then_ok(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(503, json=body) if len(calls) == 1 else httpx.Response(200, json={"market_id": "A"})

    with client(httpx.MockTransport(proxy_then_ok), retries=1, max_wait_s=0.0) as c:
        assert c.process(tick("A", 0))["market_id"] == "A" and len(calls) == 2  # a 503 delivered nothing: retried
    with client(httpx.MockTransport(lambda r: httpx.Response(503, json=body))) as c, pytest.raises(CapacityError):
        c.health()
    with client(httpx.MockTransport(lambda r: httpx.Response(502, json=body))) as c, pytest.raises(EngineFatalError):
        c.process(tick("A", 1))


HAPROXY_504 = "<html><body><h1>504 Gateway Time-out</h1>\nThe server didn't respond in time.\n</body></html>\n"
HAPROXY_502 = "<html><body><h1>502 Bad Gateway</h1>\nThe server returned an invalid or incomplete response.\n</body></html>\n"


@pytest.mark.parametrize(("status", "body"), [
    (504, HAPROXY_504), (502, HAPROXY_502),
    (500, {"error": {"type": "internal", "message": "internal error", "field": None, "request_id": "r"}}),
    (503, {"error": {"type": "engine", "message": "batch failed", "field": None, "request_id": "r"}}),
], ids=["proxy 504", "proxy 502", "500 internal", "503 engine"])
def test_a_5xx_after_the_request_was_delivered_says_the_ticks_may_be_applied(status: int, body: object) -> None:
    """HAProxy answers 504 when its replica stalls after reading the tick (which it then applies), 502 when the replica
    dies mid-answer; the service's 500 and 503 engine may come after a part was stepped: none says "nothing was sent"."""
    calls: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.headers.get("x-market-id") == "B":
            return httpx.Response(200, json={"results": [{"market_id": "B"}], "request_id": "r"})
        if isinstance(body, str):
            return httpx.Response(status, text=body, headers={"Content-Type": "text/html"})
        return httpx.Response(status, json=body)

    with client(httpx.MockTransport(answer), retries=3, max_wait_s=0.0) as c:
        with pytest.raises(OutcomeUnknownError) as exc:
            c.process(tick("A", 0))
        assert exc.value.market_id == "A" and f"HTTP {status}" in str(exc.value) and "may have been applied" in str(exc.value)
        assert len(calls) == 1  # never resent
        with pytest.raises(BatchPartError) as part:  # a later part: the applied markets are named, the cause kept
            c.process_batch([tick("B", 0), tick("A", 0)])
        assert isinstance(part.value.cause, OutcomeUnknownError) and part.value.applied == ["B"]
        assert len(calls) == 3
    with client(httpx.MockTransport(answer)) as c, pytest.raises(EngineFatalError) as health:
        c.health()  # a health check sends no ticks: not "may have been applied"
    assert not isinstance(health.value, OutcomeUnknownError)


def test_a_proxys_429_is_retried_after_its_retry_after() -> None:
    calls: list[int] = []

    def limited_then_ok(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(429, text="Too Many Requests", headers={"Retry-After": "0"})
        return httpx.Response(200, json={"market_id": "A", "prediction": 0.0})

    with client(httpx.MockTransport(limited_then_ok), retries=1) as c:
        assert c.process(tick("A", 0))["market_id"] == "A" and len(calls) == 2
    with client(httpx.MockTransport(lambda r: httpx.Response(429, headers={"Retry-After": "7"}))) as c, \
            pytest.raises(CapacityError) as exc:
        c.process(tick("A", 0))
    assert exc.value.retry_after_s == 7.0
    assert (exc.value.http_status, exc.value.error_type) == (429, "")  # a proxy's, not the service's error
    full = {"error": {"type": "capacity", "message": "queue full", "field": None, "request_id": "r"}}
    with client(httpx.MockTransport(lambda r: httpx.Response(503, json=full, headers={"Retry-After": "1"}))) as c, \
            pytest.raises(CapacityError) as exc2:
        c.process(tick("A", 0))
    assert (exc2.value.http_status, exc2.value.error_type, exc2.value.retry_after_s) == (503, "capacity", 1.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), np.float64("nan"), Decimal("NaN")])
def test_a_non_finite_timestamp_is_an_input_error_naming_the_field(bad: object) -> None:
    with client(httpx.MockTransport(lambda r: httpx.Response(500))) as c:
        with pytest.raises(InputError) as exc:
            c.process(tick("A", 0, timestamp=bad))
        assert exc.value.field == "timestamp"
        with pytest.raises(InputError) as exc2:
            c.process_batch([tick("A", 0), tick("B", 0), tick("A", 1, timestamp=bad)])
        assert exc2.value.field == "ticks.2.timestamp"


@pytest.mark.parametrize("bad", [datetime(2026, 1, 2, 9, 30), np.datetime64("2026-01-02T09:30"), object()],
                         ids=["datetime", "datetime64", "object"])
def test_a_value_that_cannot_be_sent_is_named_and_no_part_of_the_batch_is_sent(bad: object) -> None:
    sent: list[str] = []

    def service(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["x-market-id"])
        ticks = json.loads(request.content)["ticks"]
        return httpx.Response(200, json={"results": [{"market_id": t["market_id"]} for t in ticks], "request_id": "r"})

    with client(httpx.MockTransport(service)) as c:
        with pytest.raises(InputError) as exc:
            c.process_batch([tick("A", 0), tick("A", 1), tick("B", 0, timestamp=bad)])
        assert exc.value.field == "ticks.2.timestamp" and not isinstance(exc.value, BatchPartError)
        assert sent == []  # market A's part was not sent (applied) before the bad tick was found
        with pytest.raises(InputError) as one:
            c.process(tick("A", 2, timestamp=bad))
        assert one.value.field == "timestamp" and sent == []


def test_a_request_without_an_answer_names_the_id_it_was_sent_with() -> None:
    """No answer came: the id the client sent is the one handle on whether the service applied the tick."""
    sent: list[str] = []

    def read_timeout(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["x-request-id"])
        raise httpx.ReadTimeout("timed out", request=request)

    with client(httpx.MockTransport(read_timeout)) as c, pytest.raises(OutcomeUnknownError) as exc:
        c.process(tick("A", 0))
    assert sent and exc.value.request_id == sent[0] and str(exc.value).endswith(f"(request_id {sent[0]})")

    def full_then_ok(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["x-request-id"])
        if len(sent) < 4:
            return httpx.Response(503, json={"error": {"type": "capacity", "message": "queue full", "field": None,
                                                       "request_id": sent[-1]}}, headers={"Retry-After": "0"})
        return httpx.Response(200, json={"market_id": "A", "request_id": sent[-1]})

    sent.clear()
    with client(httpx.MockTransport(full_then_ok), retries=3) as c:
        assert c.process(tick("A", 0))["request_id"] == sent[-1]
    assert len(set(sent)) == 4  # each try its own id: the service's timelines tell the tries apart


@pytest.mark.parametrize("body", [{"results": [{"market_id": "A"}]}, {"result": []}, [], {"results": [1, 2]}],
                         ids=["too few", "no results", "a list", "not objects"])
def test_a_200_that_is_not_the_batchs_results_is_an_unknown_outcome(body: object) -> None:
    """A proxy or another service answering 200 with something else: the tree's error, never a KeyError or ValueError."""
    with client(httpx.MockTransport(lambda r: httpx.Response(200, json=body, headers={"X-Request-ID": "rid-7"}))) as c:
        with pytest.raises(OutcomeUnknownError, match="not the results of 2 tick") as exc:
            c.process_batch([tick("A", 0), tick("A", 1)])
        assert exc.value.market_id == "A" and exc.value.request_id == "rid-7"
        with pytest.raises(OutcomeUnknownError, match="not a tick's result"):
            c.process(tick("A", 2))


def test_an_empty_batch_sends_nothing_and_has_no_results() -> None:
    """As documented: the service refuses ``{"ticks": []}``, the client has nothing to send."""
    sent: list[str] = []

    def service(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return httpx.Response(422)

    with client(httpx.MockTransport(service)) as c:
        assert c.process_batch([]) == [] and sent == []


@pytest.mark.parametrize(("kw", "field"), [
    ({"base_url": "127.0.0.1:8080"}, "base_url"),  # no scheme: httpx's UnsupportedProtocol at the first tick
    ({"base_url": "localhost:8080"}, "base_url"),
    ({"base_url": "ftp://127.0.0.1:8080"}, "base_url"),
    ({"base_url": "http://[::1"}, "base_url"),  # httpx.InvalidURL, outside the tree
    ({"token": "abc\ndef"}, "token"),  # h11's LocalProtocolError at the first tick
    ({"token": "clé"}, "token"),  # UnicodeEncodeError
    ({"timeout_s": -1}, "timeout_s"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"timeout_s": float("nan")}, "timeout_s"),
    ({"timeout_s": "5"}, "timeout_s"),
    ({"retries": -1}, "retries"),
    ({"retries": 1.5}, "retries"),
    ({"max_wait_s": -1}, "max_wait_s"),  # a bare ValueError of time.sleep at the first retry
    ({"keepalive_s": float("inf")}, "keepalive_s"),
])
def test_an_argument_no_request_can_be_sent_with_is_an_input_error_naming_it(kw: dict[str, object], field: str) -> None:
    """Refused when the client is made, before anything is sent: never an error saying the tick may have been
    applied, nor an exception outside the tree."""
    sent: list[str] = []

    def service(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return httpx.Response(200, json={"market_id": "A"})

    args: dict[str, object] = {"base_url": "http://svc", "transport": httpx.MockTransport(service), **kw}
    with pytest.raises(InputError) as exc:
        Client(**args)  # type: ignore[arg-type]
    assert exc.value.field == field and not isinstance(exc.value, OutcomeUnknownError) and sent == []


@pytest.mark.parametrize("body", ["", "<html>Not Found</html>"], ids=["empty", "html"])
def test_an_answer_that_is_not_the_services_error_names_the_url(body: str) -> None:
    """A 404 of another server (a base_url with the wrong port or path): the error says what was asked of whom,
    not an empty ``HTTP 404 http:``."""
    answer = httpx.MockTransport(lambda r: httpx.Response(404, text=body))
    with client(answer) as c, pytest.raises(InputError) as exc:
        c.process(tick("A", 0))
    assert exc.value.http_status == 404 and exc.value.error_type == ""
    assert "POST http://svc/neural/process answered" in str(exc.value) and "not the service's error" in str(exc.value)
