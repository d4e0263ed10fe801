"""The tick route answered from the protocol (``DirectTickRoute``) answers as the ASGI route does.

Three live services from the same seed: every request of tests/api/test_tick_route.py's list goes to
one as a plain request from httpx (``Content-Length``: the protocol's direct route takes it, read by
the HTTP parser when its head and body come in separate reads), to another as the same request
written in one socket write (read in one pass, :mod:`cerebellar_norse.api.plainhead`), and to the
third chunked (no length: the ASGI route answers it). Status, headers and bodies must match, and so
must the request and error metrics they leave. In process: which tick requests the route takes.
"""

from __future__ import annotations

import json
import re
import socket
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


class OneWrite:
    """A keep-alive connection that sends each request, head and body, in one socket write (the one-pass read's
    input) and reads its answer by its ``Content-Length``; reconnects after an answer that closes."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.address = (host, int(port))
        self.sock: socket.socket | None = None

    def post(self, data: bytes, headers: dict[str, str]) -> httpx.Response:
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=30)
        fields = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.sock.sendall(f"POST /neural/process HTTP/1.1\r\nHost: {self.address[0]}\r\n{fields}"
                          f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += self._recv()
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        answer_headers = [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:])]
        size = int(dict(answer_headers)["content-length"])
        while len(body) < size:
            body += self._recv()
        if ("connection", "close") in answer_headers:
            self.close()
        return httpx.Response(int(lines[0].split()[1]), headers=answer_headers, content=body)

    def _recv(self) -> bytes:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        assert chunk, "the service closed the connection before its answer was complete"
        return chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def test_the_direct_route_and_the_asgi_route_answer_alike(start_server: Any, tmp_path: Path) -> None:
    direct = start_server(tmp_path / "direct", env=NO_BOOTSTRAP)
    one_pass = start_server(tmp_path / "one-pass", env=NO_BOOTSTRAP)
    routed = start_server(tmp_path / "asgi", env=NO_BOOTSTRAP)
    statuses = []
    c = OneWrite(one_pass.url)
    with httpx.Client(base_url=direct.url, timeout=30) as a, httpx.Client(base_url=routed.url, timeout=30) as b:
        for body, headers in REQUESTS:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            sent = {"content-type": "application/json", **headers}
            ra = a.post("/neural/process", content=data, headers=sent)
            rb = b.post("/neural/process", content=iter([data]), headers=sent)  # chunked: no Content-Length
            rc = c.post(data, sent)
            for r in (ra, rc):
                assert _comparable(r) == _comparable(rb), (body, headers, r.text, rb.text)
                assert _headers(r) == _headers(rb), (body, headers)
                assert r.headers["x-request-id"] == r.json().get("request_id", r.json().get("error", {}).get("request_id"))
                if r.status_code == 200:
                    assert "connection" not in r.headers  # kept alive
            statuses.append(ra.status_code)
        first = json.dumps(REQUESTS[0][0]).encode()
        rid = a.post("/neural/process", content=first, headers={"content-type": "application/json", "x-request-id": "caller-7"})
        assert rid.headers["x-request-id"] == "caller-7"
        assert c.post(first, {"content-type": "application/json", "x-request-id": "caller-7"}).headers["x-request-id"] == "caller-7"
        b.post("/neural/process", content=iter([first]), headers={"content-type": "application/json", "x-request-id": "caller-7"})
        c.close()
        assert _metrics(a) == _metrics(b)
        with httpx.Client(base_url=one_pass.url, timeout=30) as d:
            assert _metrics(d) == _metrics(b)
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
