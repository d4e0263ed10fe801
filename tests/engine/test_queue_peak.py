"""The queue's high-water mark (``cerebellar_norse_queue_peak_ticks``), what ``CerebellarNorseQueueSaturated`` reads.

The engine steps queued ticks on the event loop's own thread at its next turn, so the
queue depth a scrape reads is 0 whenever the scrape is not handled in the very turn that
admitted the ticks: against a live service refusing hundreds of ticks a second for a full
queue, Prometheus read 0 at about every other scrape and the alert flapped between
pending and inactive without ever firing. The high-water mark keeps what the queue held.
"""

from __future__ import annotations

import asyncio

import pytest
from engine_helpers import T0, ConfigFactory, tick

from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.peak import RecentPeak
from cerebellar_norse.engine.records import TickResult
from cerebellar_norse.errors import CapacityError
from cerebellar_norse.observability.metrics import ServiceMetrics, engine_families


def test_recent_peak_keeps_a_value_for_one_to_two_windows() -> None:
    p = RecentPeak(10.0)
    assert p.peak(0.0) == 0
    p.note(7, 100.0)
    p.note(3, 101.0)
    assert p.peak(101.0) == 7
    assert p.peak(109.9) == 7  # same window
    assert p.peak(115.0) == 7  # the window before the current one
    assert p.peak(120.0) == 0  # two windows on: forgotten
    p.note(2, 112.0)  # a new window; 7 is still the previous one's
    assert p.peak(112.0) == 7 and p.peak(121.9) == 7
    assert p.peak(122.0) == 2
    p.note(1, 140.0)  # more than two windows after 112: the previous window saw nothing
    assert p.peak(140.0) == 1


@pytest.mark.parametrize("window_s", [0.0, -1.0, float("nan")])
def test_recent_peak_refuses_a_window_that_is_not_positive(window_s: float) -> None:
    with pytest.raises(ValueError, match="window_s"):
        RecentPeak(window_s)


@pytest.mark.asyncio
async def test_a_full_queue_shows_in_the_peak_after_it_drained(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config(queue_size=4, batch_size=4))
    tasks = [asyncio.create_task(engine.submit(tick(f"F{k}", T0))) for k in range(6)]
    out = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(r) for r in out] == [TickResult] * 4 + [CapacityError] * 2

    snap = engine.snapshot()
    assert snap.queue_depth == 0  # what a scrape after the turn reads
    assert snap.queue_peak == 4 and snap.queue_capacity == 4
    metrics = ServiceMetrics()
    metrics.add_source(engine_families(engine, "cpu", lambda: (0, 0)))
    text = metrics.render().decode()
    assert "\ncerebellar_norse_queue_depth_ticks 0.0\n" in text
    assert "\n# TYPE cerebellar_norse_queue_peak_ticks gauge\ncerebellar_norse_queue_peak_ticks 4.0\n" in text

    # a lone tick later does not lower the mark within its window
    await engine.submit(tick("F0", T0 + 10))
    assert engine.snapshot().queue_peak == 4
