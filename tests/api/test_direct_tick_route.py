"""The tick route answered from the protocol (``DirectTickRoute``) answers as the ASGI route does.

Two live services from the same seed: every request of tests/api/test_tick_route.py's list goes to one
as a plain request (``Content-Length``: the protocol's direct route takes it) and to the other
chunked (no length: the ASGI route answers it). Status, headers and bodies must match, and so must
the request and error metrics they leave. In process: which tick requests the route takes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import NO_BOOTSTRAP
from test_tick_route import REQUESTS, _comparable

from cerebellar_norse.api.app import create_app
from cerebellar_norse.api.server import build_service
from cerebellar_norse.config import load_checked_config

# connection: an answer given before the body has come (415) closes the connection, depending on how the bytes
# arrived; the ASGI route gives it to both requests that the direct route does not take
VOLATILE_HEADERS = {"date", "x-request-id", "connection"}


def _headers(r: httpx.Response) -> list[tuple[str, str]]:
    return [(k, v if k not in ("content-length",) else "n") for k, v in r.headers.items() if k not in VOLATILE_HEADERS]


def _metrics(c: httpx.Client) -> list[str]:
    text = c.get("/metrics").text
    return sorted(line for line in text.splitlines()
                  if re.match(r'cerebellar_norse_(http_requests_total\{[^}]*route="/neural/process"|errors_total\{)', line))


def test_the_direct_route_and_the_asgi_route_answer_alike(start_server: Any, tmp_path: Path) -> None:
    direct = start_server(tmp_path / "direct", env=NO_BOOTSTRAP)
    routed = start_server(tmp_path / "asgi", env=NO_BOOTSTRAP)
    statuses = []
    with httpx.Client(base_url=direct.url, timeout=30) as a, httpx.Client(base_url=routed.url, timeout=30) as b:
        for body, headers in REQUESTS:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            sent = {"content-type": "application/json", **headers}
            ra = a.post("/neural/process", content=data, headers=sent)
            rb = b.post("/neural/process", content=iter([data]), headers=sent)  # chunked: no Content-Length
            assert _comparable(ra) == _comparable(rb), (body, headers, ra.text, rb.text)
            assert _headers(ra) == _headers(rb), (body, headers)
            assert ra.headers["x-request-id"] == ra.json().get("request_id", ra.json().get("error", {}).get("request_id"))
            if ra.status_code == 200:
                assert "connection" not in ra.headers  # kept alive
            statuses.append(ra.status_code)
        rid = a.post("/neural/process", content=json.dumps(REQUESTS[0][0]).encode(),
                     headers={"content-type": "application/json", "x-request-id": "caller-7"})
        assert rid.headers["x-request-id"] == "caller-7"
        b.post("/neural/process", content=iter([json.dumps(REQUESTS[0][0]).encode()]),
               headers={"content-type": "application/json", "x-request-id": "caller-7"})
        assert _metrics(a) == _metrics(b)
    assert {200, 400, 409, 415, 422} <= set(statuses)


@pytest.fixture
def route(tmp_path: Path) -> Iterator[Any]:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "s"), **NO_BOOTSTRAP,
               "CEREBELLAR_NORSE_SERVER__MAX_BODY_SIZE": "1000"}
    app = create_app(build_service(load_checked_config(None, environ=environ)))
    assert app.direct is not None
    yield app.direct


def _scope(path: bytes = b"/neural/process", method: str = "POST", **headers: bytes) -> dict[str, Any]:
    return {"type": "http", "method": method, "raw_path": path, "path": path.decode(),
            "headers": [(k.replace("_", "-").encode(), v) for k, v in headers.items()]}


@pytest.mark.parametrize(("scope", "taken"), [
    (_scope(content_length=b"80", content_type=b"application/json"), True),
    (_scope(content_length=b" 80 ", content_type=b"application/json; charset=utf-8"), True),
    (_scope(content_length=b"1000", content_type=b"application/json"), True),
    (_scope(content_length=b"1001", content_type=b"application/json"), False),  # over max_body_size: the 413
    (_scope(content_length=b"0", content_type=b"application/json"), False),  # no body: the 422
    (_scope(content_length=b"+80", content_type=b"application/json"), False),
    (_scope(transfer_encoding=b"chunked", content_type=b"application/json"), False),
    (_scope(content_length=b"80", content_type=b"text/plain"), False),  # the 415, answered before the body
    (_scope(content_length=b"80", content_type=b"application/json", content_encoding=b"gzip"), False),
    (_scope(path=b"/neural/%70rocess", content_length=b"80", content_type=b"application/json"), False),
    (_scope(path=b"/neural/process/batch", content_length=b"80", content_type=b"application/json"), False),
    (_scope(method="PUT", content_length=b"80", content_type=b"application/json"), False),
])
def test_the_route_takes_plain_tick_requests_only(route: Any, scope: dict[str, Any], taken: bool) -> None:
    assert route.eligible(scope) is taken
