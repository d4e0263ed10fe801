"""The one wording of a failed HTTP call of the command-line tools (cerebellar_norse.httpcalls)."""

from __future__ import annotations

import httpx
import pytest

from cerebellar_norse.errors import CerebellarNorseError
from cerebellar_norse.httpcalls import answer_message, call_failure, client, one_line, request, request_failure

URL = "http://127.0.0.1:8081"


class CallFailedError(CerebellarNorseError):
    """What the caller of ``request`` raises."""


def test_one_line_collapses_a_page_and_names_an_empty_body() -> None:
    assert one_line("<html>\n <h1>Not  here</h1>\n</html>\n") == "<html> <h1>Not here</h1> </html>"
    assert one_line("x" * 500) == "x" * 200
    assert one_line(" \n") == "(empty answer)"


@pytest.mark.parametrize(("body", "message"), [
    (b'{"error": {"message": "no such model"}}', "no such model"),
    (b'{"error": "flat"}', '{"error": "flat"}'),
    (b"[1]", "[1]"),
    (b"<p>\nbad\n</p>", "<p> bad </p>"),
    (b"", "(empty answer)"),
])
def test_answer_message_prefers_the_services_message(body: bytes, message: str) -> None:
    assert answer_message(httpx.Response(500, content=body)) == message


def test_call_failure_words_each_cause_with_or_without_advice() -> None:
    bad_url = httpx.InvalidURL("Invalid port: 'port'")
    assert call_failure("http://h:port", bad_url) == ("'http://h:port' is not a URL (Invalid port: 'port') "
                                                      "(fix: pass --url http://HOST:PORT)")
    token = UnicodeEncodeError("ascii", "tök", 1, 2, "ordinal not in range(128)")
    assert call_failure(URL, token) == ("the token holds a character an HTTP header cannot carry "
                                        "(fix: pass the service's token)")
    assert call_failure(URL, token, whose_token="the config's server.api_token", advice=False) == (
        "the config's server.api_token holds a character an HTTP header cannot carry")
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    assert call_failure(URL, refused) == (f"cannot reach the service at {URL} (ConnectError: [Errno 111] Connection "
                                          "refused): is it running there? (pass --url)")
    assert call_failure(URL, refused, advice=False) == (f"cannot reach the service at {URL} (ConnectError: [Errno 111] "
                                                        "Connection refused)")


def test_request_failure_names_the_call_and_a_timeout() -> None:
    token = UnicodeEncodeError("ascii", "tök", 1, 2, "ordinal not in range(128)")
    assert request_failure("PUT", f"{URL}/models/v1", token, 30.0) == (
        f"PUT {URL}/models/v1: the token holds a character an HTTP header cannot carry")
    assert request_failure("GET", f"{URL}/models", httpx.ConnectError("refused"), 30.0) == (
        f"GET {URL}/models: ConnectError: refused")
    assert request_failure("GET", f"{URL}/models", httpx.ReadTimeout("timed out"), 2.5) == (
        f"GET {URL}/models: {URL} gave no answer within 2.5 s (ReadTimeout; --timeout SECONDS waits longer)")


def test_request_raises_the_callers_error_for_an_http_error_status() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/ok":
            return httpx.Response(200, json={"active": "v1"})
        return httpx.Response(409, json={"error": {"message": "another network"}})

    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        assert request(http, "GET", f"{URL}/ok", CallFailedError).json() == {"active": "v1"}
        with pytest.raises(CallFailedError, match=r"^POST http://127.0.0.1:8081/x: HTTP 409: another network$"):
            request(http, "POST", f"{URL}/x", CallFailedError)


def test_client_sends_the_token_as_a_bearer_header_and_waits_timeout_seconds() -> None:
    with client("s3cret", 2.5) as http:
        assert http.headers["Authorization"] == "Bearer s3cret"
        assert http.timeout.read == 2.5
        assert http.timeout.connect == 2.5
    for no_token in (None, ""):
        with client(no_token, 1.0) as http:
            assert "Authorization" not in http.headers


@pytest.mark.parametrize(("market", "segment"), [
    ("..", "%2E%2E"), (".", "%2E"), ("BTC/USD", "BTC%2FUSD"), ("a b?#%", "a%20b%3F%23%25"), ("./..", ".%2F.."),
    ("a.b", "a.b"),
])
def test_every_market_route_of_the_tools_sends_the_id_as_one_segment(market: str, segment: str) -> None:
    """``.`` and ``..`` are valid market ids; written as themselves httpx resolved them away as dot-segments
    (``/debug/markets/../state`` went out as ``/debug/state``, a ``DELETE`` of ``..`` as ``DELETE /neural``)."""
    from cerebellar_norse.observability.debugtools import market_state_path
    from cerebellar_norse.observability.pictures import raster_path
    from cerebellar_norse.scaleout.rebalance import Replicas

    sent: list[tuple[str, bytes]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        sent.append((req.method, req.url.raw_path))
        return httpx.Response(200, content=b"npz")

    replicas = Replicas(None)
    replicas.http = httpx.Client(transport=httpx.MockTransport(handler))
    replicas.export(URL, market)
    replicas.import_(URL, market, b"npz")
    replicas.release(URL, market)
    replicas.thaw(URL, market)
    replicas.reset(URL, market)
    replicas.close()
    with httpx.Client(base_url=URL, transport=httpx.MockTransport(handler)) as http:
        http.get(market_state_path(market))
        http.get(raster_path(market, 5))
    s = segment.encode()
    assert sent == [("POST", b"/neural/markets/" + s + b"/export"), ("PUT", b"/neural/markets/" + s + b"/state"),
                    ("POST", b"/neural/markets/" + s + b"/release"), ("POST", b"/neural/markets/" + s + b"/thaw"),
                    ("DELETE", b"/neural/markets/" + s), ("GET", b"/debug/markets/" + s + b"/state"),
                    ("GET", b"/debug/markets/" + s + b"/raster.png?ticks=5")]


@pytest.mark.parametrize(("request_id", "segment"), [("..", "%2E%2E"), (".", "%2E"), ("ord:7f.3a", "ord%3A7f.3a")])
def test_trace_asks_for_the_request_id_as_one_segment(monkeypatch: pytest.MonkeyPatch, request_id: str,
                                                      segment: str) -> None:
    """``..`` and ``.`` are valid request ids: ``trace ..`` asked ``/debug`` (404)."""
    from cerebellar_norse.config import Config
    from cerebellar_norse.observability import debugtools

    asked: list[str] = []

    def fetch(url: str, path: str, token: str | None) -> object:
        asked.append(str(httpx.URL(url + path).raw_path, "ascii"))
        raise debugtools.ServiceCallError("stop")

    monkeypatch.setattr(debugtools, "fetch_json", fetch)
    assert debugtools.cmd_trace(Config(), request_id, URL, None, None, False) == 1
    assert asked == [f"/debug/requests/{segment}"]


@pytest.mark.parametrize(("body", "hint"), [
    (b'{"error": {"type": "not_found", "message": "market \'NOPE\' holds no state", "field": "market_id"}}', False),
    (b"<html><body>404 Not Found</body></html>", True),
])
def test_a_404_of_the_service_itself_is_not_doubted(body: bytes, hint: bool) -> None:
    """``state dump`` and ``trace`` ended the service's own 404 (no such market, no timeline kept) with "(is the
    service at URL cerebellar-norse?)", as if another server had answered; only another server's answer is doubted."""
    import http.server
    import threading

    from cerebellar_norse.errors import ServiceCallError
    from cerebellar_norse.observability.debugtools import fetch_json

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(ServiceCallError) as caught:
            fetch_json(url, "/debug/markets/NOPE/state", None)
    finally:
        server.shutdown()
        server.server_close()
    said = str(caught.value)
    assert said.startswith(f"{url}/debug/markets/NOPE/state: 404: ")
    assert ("holds no state" in said) is not hint and ("404 Not Found" in said) is hint
    assert (f"(is the service at {url} cerebellar-norse?)" in said) is hint
