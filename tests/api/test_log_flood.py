"""A client that misbehaves in a loop (malformed requests, WebSockets opened and closed) writes a bounded number of
log lines: a few alike ones per window, then one line counting those not written."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from pathlib import Path

import websockets
from live_helpers import LiveServer

from cerebellar_norse.observability.ratelimit import ALIKE_BURST, AlikeLinesLimit

BAD_REQUESTS = 150
STREAMS = 40


def _malformed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GARBAGE\x01 / HTTP/1.1\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 400")


async def _streams(url: str) -> None:
    for _ in range(STREAMS):
        async with websockets.connect(f"{url}/neural/stream"):
            pass


def _lines(srv: LiveServer) -> list[dict]:  # type: ignore[type-arg]
    out = []
    for raw in srv.log().splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out


def test_a_flood_of_malformed_requests_and_streams_writes_a_bounded_log(
        tmp_path: Path, start_server: Callable[..., LiveServer]) -> None:
    srv = start_server(tmp_path / "state")
    for _ in range(BAD_REQUESTS):
        _malformed(srv.port)
    asyncio.run(_streams(srv.ws_url))
    assert srv.stop() == 0  # the counts held back are said at shutdown at the latest
    lines = _lines(srv)
    invalid = [x for x in lines if x["message"] == "Invalid HTTP request received."]
    opened = [x for x in lines if x["message"] == "connection open"]
    said = {}
    for x in lines:
        f = x.get("fields") or {}
        if "suppressed" in f:
            said[f["like"]] = said.get(f["like"], 0) + f["suppressed"]
            assert x["level"] == ("WARNING" if f["like"] == "Invalid HTTP request received." else "INFO")
    # every line is written or counted, and most are counted (each window writes ALIKE_BURST of them)
    assert len(invalid) + said.get("Invalid HTTP request received.", 0) == BAD_REQUESTS
    assert len(opened) + said.get("connection open", 0) == STREAMS
    assert ALIKE_BURST <= len(invalid) < BAD_REQUESTS / 2, len(invalid)
    assert ALIKE_BURST <= len(opened) < STREAMS, len(opened)
    assert len(lines) < 150, len(lines)  # was one line per malformed request and two per stream: 230 and more


def test_alike_lines_limit_counts_per_message_and_window() -> None:
    now = [0.0]
    written: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            written.append(record)

    report = logging.getLogger("test.alike.report")
    report.handlers, report.propagate, report.level = [Keep()], False, logging.DEBUG
    source = logging.getLogger("test.alike.source")
    source.handlers, source.propagate, source.level = [Keep()], False, logging.DEBUG
    limit = AlikeLinesLimit(burst=3, window_s=10.0, report=report, clock=lambda: now[0])
    source.addFilter(limit)
    try:
        for i in range(100):
            source.warning("bad request %d", i)
            source.info("other")
        assert [r.getMessage() for r in written if r.name == source.name].count("other") == 3
        assert len(written) == 6
        now[0] = 10.0
        limit.sweep()
        summaries = [r for r in written if r.name == report.name]
        assert sorted((r.fields["like"], r.fields["suppressed"], r.levelno) for r in summaries) == [  # type: ignore[attr-defined]
            ("bad request %d", 97, logging.WARNING), ("other", 97, logging.INFO)]
        assert limit._windows == {}  # nothing kept of a window that is over
        source.warning("bad request %d", 100)  # a new window writes again
        assert written[-1].getMessage() == "bad request 100"
        limit.flush()
        assert len(written) == 9  # nothing held back: no count line
    finally:
        source.removeFilter(limit)
