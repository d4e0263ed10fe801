"""The event loop's lag: a stall shows in ``cerebellar_norse_event_loop_lag_seconds`` and in a WARNING line."""

from __future__ import annotations

import asyncio
import time

import pytest

from cerebellar_norse.observability.looplag import STALL_LOG_S, watch_loop_lag
from cerebellar_norse.observability.metrics import LOOP_LAG_BUCKETS, TickHistogram


def _above(hist: TickHistogram, edge: float) -> int:
    """Observations above ``edge`` (s)."""
    return sum(hist.counts[hist.bounds.index(edge) + 1:])


def test_a_blocked_loop_is_observed_once_as_its_stall() -> None:
    hist = TickHistogram(LOOP_LAG_BUCKETS)
    stalls: list[float] = []

    async def main() -> None:
        watch = asyncio.create_task(watch_loop_lag(hist, 0.05, stalls.append))
        await asyncio.sleep(0.3)  # on time: well under a second late
        assert sum(hist.counts) >= 2 and _above(hist, 1.0) == 0
        time.sleep(1.3)  # the loop blocked, as by SIGSTOP or a long callback
        await asyncio.sleep(0.2)
        watch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watch

    asyncio.run(main())
    assert len(stalls) == 1 and 1.1 <= stalls[0] <= 5.0
    assert _above(hist, 1.0) == 1
    assert hist.sum >= stalls[0]


def test_a_late_timer_under_the_threshold_is_not_a_stall() -> None:
    hist = TickHistogram(LOOP_LAG_BUCKETS)
    stalls: list[float] = []

    async def main() -> None:
        watch = asyncio.create_task(watch_loop_lag(hist, 0.05, stalls.append))
        await asyncio.sleep(0.1)
        time.sleep(STALL_LOG_S / 4)
        await asyncio.sleep(0.15)
        watch.cancel()

    asyncio.run(main())
    assert stalls == []
    assert _above(hist, 0.1) == 1  # the late firing, in the buckets above 100 ms
