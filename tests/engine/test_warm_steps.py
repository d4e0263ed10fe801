"""Warm steps (``performance.warm_step_interval_us``): the network stepped on a free slot between batches.

They exist to keep the CPU's caches warm and must change nothing a client can see: no
market's state, no answer, no tick counter. The ground truth is the same engine fed the
same ticks without them.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from engine_helpers import T0, ConfigFactory, assert_same_state, core, moving_ticks, sequential, tick

from cerebellar_norse.engine import engine as engine_mod
from cerebellar_norse.engine.engine import Engine

pytestmark = pytest.mark.asyncio

MARKETS = ("A", "B", "C")


async def test_warm_steps_change_no_market_and_no_answer(engine_config: ConfigFactory) -> None:
    cfg = engine_config(warm_step_interval_us=0)
    plain, warmed = Engine(cfg), Engine(cfg)
    ticks = moving_ticks(MARKETS, 12)
    steps = 0
    for k, t in enumerate(ticks):
        want = plain.process_now([t])[0]
        got = warmed.process_now([t])[0]
        assert core(got) == core(want), f"tick {k}"
        for _ in range(k % 3):
            assert warmed.warm_step()
            steps += 1
    for m in MARKETS:
        slot_a, slot_b = plain.pool.table.get(m), warmed.pool.table.get(m)
        assert slot_a is not None and slot_a == slot_b
        assert_same_state(plain.arrays.read_slot(slot_a), warmed.arrays.read_slot(slot_b))
    assert warmed.stats.warm_steps == steps > 0
    assert plain.stats.warm_steps == 0
    assert (warmed.stats.ticks, warmed.stats.batches) == (plain.stats.ticks, plain.stats.batches)
    assert (warmed.stats.spikes == plain.stats.spikes).all()
    assert warmed.pool.used == len(MARKETS) and warmed.pool.table.evictions == 0
    assert warmed.snapshot().warm_steps == steps


async def test_the_warmed_slot_starts_from_rest_when_a_market_is_given_it(engine_config: ConfigFactory) -> None:
    cfg = engine_config(max_markets=2, memory_pool_enabled=False, warm_step_interval_us=0)
    engine = Engine(cfg)
    engine.process_now([tick("A", T0, 100.0)])
    spare = engine.pool.table.spare()
    assert spare is not None and spare != engine.pool.table.get("A")
    before = engine.arrays.read_slot(spare)
    for _ in range(5):
        assert engine.warm_step()
    after = engine.arrays.read_slot(spare)
    assert any((before[k] != after[k]).any() for k in before), "a warm step changes the spare slot's state"
    b_ticks = [tick("B", T0 + 10 * k, 100.0 + 0.3 * k) for k in range(6)]
    got = [core(engine.process_now([t])[0]) for t in b_ticks]
    assert engine.pool.table.get("B") == spare
    _, want = sequential(cfg, b_ticks)
    assert got == want


async def test_no_warm_step_without_a_free_slot_or_before_the_first_batch(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config(max_markets=2, memory_pool_enabled=False))
    assert not engine.warm_step()  # nothing stepped yet: no tick to step again
    engine.process_now([tick("A", T0)])
    engine.process_now([tick("B", T0)])
    assert engine.pool.table.spare() is None
    states = {m: engine.arrays.read_slot(s) for m, s in engine.pool.table.items()}
    assert not engine.warm_step()
    for m, s in engine.pool.table.items():
        assert_same_state(states[m], engine.arrays.read_slot(s))
    assert engine.stats.warm_steps == 0


async def test_warm_steps_run_while_ticks_keep_coming_then_stop(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config(warm_step_interval_us=1000, warm_window_ms=400))
    engine.warm_up()
    assert engine.stats.warm_steps == 0
    await engine.submit(tick("A", T0))
    await asyncio.sleep(0.05)
    during = engine.stats.warm_steps
    assert during >= 3  # one per millisecond timer, however slow the host
    deadline = time.monotonic() + 5.0
    while engine._warm_handle is not None and time.monotonic() < deadline:  # the window ends
        await asyncio.sleep(0.02)
    assert engine._warm_handle is None
    stopped = engine.stats.warm_steps
    await asyncio.sleep(0.03)
    assert engine.stats.warm_steps == stopped
    assert engine.stats.ticks == 1
    await engine.submit(tick("A", T0 + 10))  # the next batch opens a new window
    await asyncio.sleep(0.03)
    assert engine.stats.warm_steps > stopped


async def test_warm_steps_off_when_the_interval_is_zero_and_stopped_by_drain(engine_config: ConfigFactory) -> None:
    off = Engine(engine_config(warm_step_interval_us=0))
    off.warm_up()
    await off.submit(tick("A", T0))
    await asyncio.sleep(0.02)
    assert off.stats.warm_steps == 0 and off._warm_handle is None
    engine = Engine(engine_config(warm_window_ms=3_600_000))
    engine.warm_up()
    await engine.submit(tick("A", T0))
    await asyncio.sleep(0.01)
    await engine.drain(save=False)
    stopped = engine.stats.warm_steps
    await asyncio.sleep(0.02)
    assert engine._warm_handle is None and engine.stats.warm_steps == stopped


async def test_a_queued_tick_goes_before_the_warm_step(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config(warm_window_ms=3_600_000))
    engine.warm_up()
    await engine.submit(tick("A", T0))
    assert engine._warm_handle is not None
    engine._warm_handle.cancel()
    pending = asyncio.ensure_future(engine.submit(tick("A", T0 + 10)))
    await asyncio.sleep(0)  # queued; its flush is scheduled for the next iteration
    assert engine.queue_depth == 1
    steps = engine.stats.warm_steps
    engine._warm_timer()
    assert engine.stats.warm_steps == steps and engine._warm_handle is not None
    await pending
    assert engine.stats.ticks == 2
    await engine.drain(save=False)


async def test_a_full_pool_pauses_the_warm_steps_and_says_so_once(engine_config: ConfigFactory,
                                                                   caplog: pytest.LogCaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_mod, "WARM_PAUSE_LOG_INTERVAL_S", 0.0)
    engine = Engine(engine_config(max_markets=2, memory_pool_enabled=False, warm_window_ms=3_600_000))
    await engine.submit(tick("A", T0))
    await engine.submit(tick("B", T0))
    caplog.set_level("INFO", logger="cerebellar_norse.engine")
    steps = engine.stats.warm_steps
    await asyncio.sleep(0.03)
    assert engine.stats.warm_steps == steps  # no slot to step on
    paused = [r for r in caplog.records if r.getMessage().startswith("warm steps paused")]
    assert len(paused) == 1 and "max_markets" in paused[0].getMessage()
    assert engine.reset_market("B")
    await asyncio.sleep(0.03)
    assert engine.stats.warm_steps > steps
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm steps resumed")] == [
        "warm steps resumed: a state slot is free"]
    await engine.drain(save=False)


async def test_a_pool_that_keeps_filling_up_logs_its_pauses_once_per_interval(
        engine_config: ConfigFactory, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full pool whose slot is freed and taken again over and over (a market reset, released or evicted as idle,
    then a new one) paused and resumed the warm steps each time, two lines each: now one line per interval, which
    counts the pauses, and the state is said again once the interval is over."""
    engine = Engine(engine_config(max_markets=2, memory_pool_enabled=False, warm_window_ms=3_600_000))
    caplog.set_level("INFO", logger="cerebellar_norse.engine")
    await engine.submit(tick("A", T0))
    for k in range(20):
        await engine.submit(tick(f"B{k}", T0))  # the pool is full: paused
        engine._warm_timer()
        assert engine.reset_market(f"B{k}")  # a slot is free again: resumed
        engine._warm_timer()
    said = [r for r in caplog.records if r.getMessage().startswith("warm steps")]
    assert [r.getMessage()[:17] for r in said] == ["warm steps paused"], [r.getMessage() for r in said]
    monkeypatch.setattr(engine_mod, "WARM_PAUSE_LOG_INTERVAL_S", 0.0)  # the interval is over
    engine._warm_timer()
    said = [r for r in caplog.records if r.getMessage().startswith("warm steps")]
    assert [r.getMessage() for r in said][1:] == ["warm steps resumed: a state slot is free"]
    assert said[1].fields["pauses"] == 19  # type: ignore[attr-defined]  # (the first one had its own line)
    await engine.drain(save=False)


async def test_a_failing_warm_step_turns_them_off_and_the_engine_keeps_serving(
        engine_config: ConfigFactory, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(engine_config(warm_window_ms=3_600_000))
    await engine.submit(tick("A", T0))
    caplog.set_level("INFO", logger="cerebellar_norse.engine")
    before = engine.stats.warm_steps
    real = engine.backend.step_buffered
    calls = 0

    def broken(b: int) -> object:
        nonlocal calls
        calls += 1
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.backend, "step_buffered", broken)
    monkeypatch.setattr(engine.backend, "fused_step", lambda: None)  # (steps then go through step_buffered)
    await asyncio.sleep(0.03)
    assert calls == 1 and engine.warm_interval_s == 0.0 and engine._warm_handle is None
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "warm step failed: warm steps are off until the next restart or applied reload"]
    monkeypatch.setattr(engine.backend, "step_buffered", real)
    result = await engine.submit(tick("A", T0 + 10))
    assert result.market_id == "A" and engine.stats.ticks == 2
    await asyncio.sleep(0.01)
    assert engine.stats.warm_steps == before


@pytest.mark.usefixtures("cpus_free")
async def test_each_polled_batch_is_followed_by_one_warm_step_and_no_answer_changes(engine_config: ConfigFactory) -> None:
    """While the loop polls (``busy_poll_us``), its second round after each batch steps one warm step: the batch's own
    work evicted the network's code. The timer's steps are out of the way here (one a second)."""
    engine = Engine(engine_config(busy_poll_us=5_000_000, warm_step_interval_us=1_000_000, warm_window_ms=3_600_000))
    plain = Engine(engine_config(busy_poll_us=5_000_000, warm_step_interval_us=0))
    for k, t in enumerate(moving_ticks(MARKETS, 4)):
        got, want = await engine.submit(t), await plain.submit(t)
        assert core(got) == core(want), f"tick {k}"
        await asyncio.sleep(0.002)  # many poll rounds, one warm step
        assert engine.stats.warm_steps == k, f"tick {k}"  # (the first tick polls not: nothing says the next comes soon)
    assert engine.polling and plain.polling and plain.stats.warm_steps == 0  # warm steps off: polling only
    for m in MARKETS:
        slot = engine.pool.table.get(m)
        assert slot is not None and slot == plain.pool.table.get(m)
        assert_same_state(plain.arrays.read_slot(slot), engine.arrays.read_slot(slot))
    assert engine.stats.ticks == plain.stats.ticks
    await engine.drain(save=False)
    await plain.drain(save=False)
    other = Engine(engine_config(busy_poll_us=5_000_000, warm_step_interval_us=1_000_000), backend="reference")
    for t in moving_ticks(MARKETS, 2):  # a backend other than the fused CPU kernel: polling, no such step
        await other.submit(t)
        await asyncio.sleep(0.002)
    assert other.polling and other.stats.warm_steps == 0
    await other.drain(save=False)


@pytest.mark.usefixtures("cpus_free")
async def test_a_queued_tick_goes_before_the_polled_warm_step_and_a_wanted_cpu_stops_it(
        engine_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(engine_config(busy_poll_us=5_000_000, warm_step_interval_us=1_000_000, warm_window_ms=3_600_000,
                                  max_batch_delay_us=100_000))
    await engine.submit(tick("A", T0))
    await engine.submit(tick("A", T0 + 1))  # polled: the caller resumes before the poll rounds after its batch
    queued = engine.submit_nowait(tick("A", T0 + 2))  # waits for its batch (max_batch_delay_us) while the loop polls
    await asyncio.sleep(0.01)
    assert engine.polling and engine.queue_depth == 1 and engine.stats.warm_steps == 0  # the queued tick goes first
    await queued
    await asyncio.sleep(0.002)
    assert engine.stats.warm_steps == 1  # the one after the queued tick's batch
    monkeypatch.setattr(engine_mod, "cpu_wanted", lambda: True)  # a task waits for a CPU from now on
    await asyncio.sleep(0.002)
    assert not engine.polling
    await engine.submit(tick("A", T0 + 3))
    await asyncio.sleep(0.002)
    assert not engine.polling and engine.stats.warm_steps == 1  # its round asked first: no polling, no warm step
    assert engine.stats.ticks == 4
    await engine.drain(save=False)
