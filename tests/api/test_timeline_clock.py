"""A request timeline's ``received_at`` after the wall clock was stepped (NTP, an operator's ``date -s``)."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from cerebellar_norse.observability.timelines import Timeline, TimelineBook


def test_received_at_is_on_the_wall_clock_of_the_request_not_of_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600.0)  # stepped an hour ahead after the service started
    tl = Timeline("r1", "/neural/process", time.perf_counter_ns())
    TimelineBook().finish(tl)
    received = datetime.fromisoformat(tl.as_dict()["received_at"].replace("Z", "+00:00")).timestamp()
    assert abs(received - (real() + 3600.0)) < 60.0  # what the log line of that request says (its ts), not an hour off
