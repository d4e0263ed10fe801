"""A stopped service's stall is visible afterwards: in the event-loop lag histogram and a WARNING line."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from live_helpers import LiveServer
from prometheus_client.parser import text_string_to_metric_families

LAG = "cerebellar_norse_event_loop_lag_seconds"


def _lag_buckets(srv: LiveServer) -> dict[str, float]:
    for fam in text_string_to_metric_families(httpx.get(f"{srv.url}/metrics", timeout=10).text):
        if fam.name == LAG:
            assert fam.type == "histogram"
            return {s.labels["le"]: s.value for s in fam.samples if s.name == f"{LAG}_bucket"}
    raise AssertionError(f"{LAG} not exported")


def test_sigstop_shows_as_event_loop_lag(tmp_path: Path, start_server: Callable[..., LiveServer]) -> None:
    srv = start_server(tmp_path / "state")
    before = _lag_buckets(srv)
    assert before["+Inf"] - before["1.0"] == 0  # no stall of a second or more yet
    srv.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(2.0)
    finally:
        srv.proc.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 10
    after = _lag_buckets(srv)
    while after["+Inf"] - after["1.0"] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        after = _lag_buckets(srv)
    assert after["+Inf"] - after["1.0"] == 1, after  # the one late timer, 1 s or more late
    assert after["5.0"] - after["1.0"] == 1  # ... about the 2 s it was stopped
    warnings = [json.loads(line) for line in srv.log().splitlines() if "event loop stalled" in line]
    assert len(warnings) == 1 and warnings[0]["level"] == "WARNING"
    assert 1.5 <= warnings[0]["fields"]["stall_s"] <= 5.0
