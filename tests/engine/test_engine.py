"""The engine: per-market ordering under concurrency, batching, back-pressure, failures, eviction, restarts.

The ground truth is :class:`CerebellarNetwork` fed the same ticks one at a time. A
market's dynamics do not depend on other markets, so a market's results from the
engine must equal a sequential run over that market's ticks alone, bit for bit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_helpers import (
    T0,
    ConfigFactory,
    StreamFactory,
    assert_same_state,
    core,
    sequential,
    sequential_markets,
    tick,
)

from cerebellar_norse.engine import engine as engine_module
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.persistence import STATE_FILE
from cerebellar_norse.engine.records import TickResult
from cerebellar_norse.errors import CapacityError, EngineFatalError, TickOrderError
from cerebellar_norse.observability.metrics import ServiceMetrics, engine_families
from cerebellar_norse.storage import read_checksummed
from cerebellar_norse.ticks import Tick

pytestmark = pytest.mark.asyncio


def market_state(engine: Engine, market: str) -> dict[str, np.ndarray]:
    slot = engine.pool.table.get(market)
    assert slot is not None, f"{market} holds no slot"
    return engine.arrays.read_slot(slot)


def record_batches(engine: Engine) -> list[int]:
    sizes: list[int] = []
    engine.sinks.append(lambda rec: sizes.append(rec.size))
    return sizes


# -- ordering --------------------------------------------------------------------------


async def test_per_market_order_under_64_concurrent_submitters(engine_config: ConfigFactory, streams: StreamFactory) -> None:
    """64 submitters, 2 own markets each plus 4 markets all of them share, awaited and fire-and-forget mixed.

    A tick is taken from its market's queue in the same synchronous step as submit()
    admits it, so the take order is the engine's acceptance order; each market's
    results in that order must equal a sequential run of the market's ticks.
    """
    cfg = engine_config()
    by_market = streams(5000, 132, seed=3)
    names = sorted(by_market)
    owned = {i: names[2 * i:2 * i + 2] for i in range(64)}
    shared = names[128:]
    queues = {m: deque(enumerate(by_market[m])) for m in names}
    got: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in names}
    engine = Engine(cfg)
    engine.warm_up()
    sizes = record_batches(engine)

    async def fire(m: str) -> None:
        if not queues[m]:  # emptied by others since this task was created
            return
        k, t = queues[m].popleft()  # taken and admitted with no suspension in between
        got[m][k] = await engine.submit(t)

    async def submitter(i: int) -> None:
        rng = random.Random(i)
        background: list[asyncio.Task[None]] = []
        mine = owned[i]
        while True:
            live_own = [m for m in mine if queues[m]]
            live_shared = [m for m in shared if queues[m]]
            if not live_own and not live_shared:
                break
            if live_shared and (not live_own or rng.random() < 0.3):
                m = rng.choice(live_shared)
            else:
                m = rng.choice(live_own)
            if rng.random() < 0.5:
                await fire(m)
            else:
                background.append(asyncio.create_task(fire(m)))
            if rng.random() < 0.3:
                await asyncio.sleep(0)
        await asyncio.gather(*background)

    await asyncio.gather(*(submitter(i) for i in range(64)))

    total = sum(len(v) for v in by_market.values())
    assert engine.stats.ticks == total and sum(sizes) == total
    assert engine.stats.rejected_order == 0
    assert len(sizes) < total  # ticks were batched
    net, want = sequential_markets(cfg, by_market)
    for m in names:
        assert [core(got[m][k]) for k in range(len(by_market[m]))] == want[m], m
        assert_same_state(market_state(engine, m), net.snapshot(m))


@pytest.mark.parametrize("threads", [1, 2])
async def test_ticks_of_one_market_in_one_batch_apply_in_arrival_order(engine_config: ConfigFactory, streams: StreamFactory,
                                                                       threads: int) -> None:
    """submit_many and un-awaited submits put many ticks of a market in one batch (with 2 threads: the parallel kernel)."""
    cfg = engine_config(cpu_threads=threads)
    by_market = streams(120, 3, seed=5)
    ticks = sorted((t for ts in by_market.values() for t in ts), key=lambda t: (t.timestamp, t.market_id))
    first, second = ticks[:60], ticks[60:]
    engine = Engine(cfg)
    engine.warm_up()
    sizes = record_batches(engine)

    many = await engine.submit_many(first)
    tasks = [asyncio.create_task(engine.submit(t)) for t in second]
    concurrent = await asyncio.gather(*tasks)

    assert sizes == [len(first), len(second)]  # one batch each, several ticks per market in it
    net, want = sequential_markets(engine_config(cpu_threads=1), by_market)
    for m in by_market:
        results = [core(r) for r, t in zip([*many, *concurrent], ticks, strict=True) if t.market_id == m]
        assert results == want[m], m
        assert_same_state(market_state(engine, m), net.snapshot(m))


async def test_order_is_checked_against_pending_ticks(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config())
    later = asyncio.create_task(engine.submit(tick("A", T0 + 500)))
    await asyncio.sleep(0)  # admitted, not yet stepped
    assert engine.queue_depth == 1
    with pytest.raises(TickOrderError) as exc:
        await engine.submit(tick("A", T0 + 100))
    assert exc.value.field == "timestamp"
    await later
    assert engine.stats.ticks == 1


# -- batching --------------------------------------------------------------------------


async def test_batches_form_under_load(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config())
    engine.warm_up()
    sizes = record_batches(engine)

    async def submitter(i: int) -> None:
        for k in range(20):
            await engine.submit(tick(f"S{i:02d}", T0 + 100 * k, 100.0 + 0.01 * k))

    await asyncio.gather(*(submitter(i) for i in range(64)))
    assert engine.stats.ticks == 64 * 20
    assert engine.stats.ticks / engine.stats.batches > 1
    assert np.mean(sizes) > 1 and max(sizes) > 32


async def test_lone_tick_on_an_idle_engine_does_not_wait_for_the_batch_delay(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config(max_batch_delay_us=200_000))
    engine.warm_up()
    t0 = time.perf_counter()
    await engine.submit(tick("A", T0))
    assert time.perf_counter() - t0 < 0.05  # far below the 200 ms delay


async def test_engine_under_load_waits_for_more_ticks(engine_config: ConfigFactory) -> None:
    """Right after a batch, ticks arriving in separate loop iterations are gathered into one batch."""
    engine = Engine(engine_config(max_batch_delay_us=100_000))
    engine.warm_up()
    sizes = record_batches(engine)
    await engine.submit(tick("A", T0))
    tasks = []
    for k in range(3):
        tasks.append(asyncio.create_task(engine.submit(tick("B", T0 + k))))
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert sizes == [1, 3]


async def test_sub_millisecond_batch_delay_never_costs_a_millisecond(engine_config: ConfigFactory) -> None:
    """The default 50 us delay: asyncio rounds timers up to 1 ms; a sequential client must not pay it per tick."""
    engine = Engine(engine_config(max_batch_delay_us=50))
    engine.warm_up()
    n = 300
    t0 = time.perf_counter()
    for k in range(n):
        await engine.submit(tick("A", T0 + k))
    assert time.perf_counter() - t0 < n * 0.5e-3


@pytest.mark.usefixtures("cpus_free")
async def test_busy_polling_keeps_the_loop_awake_for_its_window_after_each_batch(engine_config: ConfigFactory) -> None:
    """``busy_poll_us``: after a batch the loop runs poll rounds (it never blocks) until the window ends."""
    engine = Engine(engine_config(busy_poll_us=150_000))
    engine.warm_up()
    rounds = 0

    def counted() -> None:
        nonlocal rounds
        rounds += 1
        Engine._poll(engine)

    engine._poll = counted  # type: ignore[method-assign]
    await engine.submit(tick("A", T0))
    assert not engine.polling and rounds == 0  # the first tick after idle time: nothing says the next comes soon
    await engine.submit(tick("A", T0 + 1))
    assert engine.polling
    await asyncio.sleep(0.03)
    assert engine.polling and rounds > 10  # one round per loop iteration: the loop did not sleep
    await asyncio.sleep(0.6)
    assert not engine.polling
    stopped_at = rounds
    await asyncio.sleep(0.02)
    assert rounds == stopped_at


@pytest.mark.usefixtures("cpus_free")
async def test_busy_polling_is_on_by_default_off_at_0_and_stops_on_drain(engine_config: ConfigFactory) -> None:
    off = Engine(engine_config(busy_poll_us=0))
    off.warm_up()
    await off.submit(tick("A", T0))
    await off.submit(tick("A", T0 + 1))
    assert not off.polling
    engine = Engine(engine_config())
    assert engine.cfg.performance.busy_poll_us == 250
    engine.warm_up()
    await engine.submit(tick("A", T0))
    await engine.submit(tick("A", T0 + 1))
    assert engine.polling
    await engine.drain(save=False)
    await asyncio.sleep(0.01)
    assert not engine.polling


@pytest.mark.usefixtures("cpus_free")
async def test_busy_polling_starts_only_for_ticks_that_come_within_its_window(engine_config: ConfigFactory) -> None:
    """Ticks further apart than ``busy_poll_us`` start no polling (it would run out before they came); closer ones do."""
    engine = Engine(engine_config(busy_poll_us=20_000))
    engine.warm_up()
    for k in range(3):
        await asyncio.sleep(0.05)
        await engine.submit(tick("A", T0 + k))
        assert not engine.polling
    await engine.submit(tick("A", T0 + 3))
    assert engine.polling
    await asyncio.sleep(0.05)  # the window runs out
    assert not engine.polling
    await engine.submit(tick("A", T0 + 4))
    assert not engine.polling
    results = await engine.submit_many([tick("A", T0 + 5), tick("B", T0)])  # a batch within the window
    assert len(results) == 2 and engine.polling


async def test_busy_polling_stops_at_the_next_round_while_a_task_waits_for_a_cpu(
        engine_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client woken by its answer may be queued behind the polling loop: the loop sleeps instead."""
    waiting = False
    checks = 0

    def wanted() -> bool:
        nonlocal checks
        checks += 1
        return waiting

    monkeypatch.setattr(engine_module, "cpu_wanted", wanted)
    engine = Engine(engine_config(busy_poll_us=5_000_000))
    engine.warm_up()
    await engine.submit(tick("A", T0))
    started = time.monotonic()
    await engine.submit(tick("A", T0 + 1))
    await asyncio.sleep(0.01)
    assert engine.polling and checks > 5  # asked again and again while polling
    assert checks <= (time.monotonic() - started) / engine_module.CPU_CHECK_S + 1  # at most every CPU_CHECK_S
    waiting = True
    await asyncio.sleep(0.01)
    assert not engine.polling
    stopped_at = checks
    await asyncio.sleep(0.01)
    assert checks == stopped_at
    waiting = False
    await engine.submit(tick("A", T0 + 2))  # the next batch polls again
    assert engine.polling
    await engine.drain(save=False)


@pytest.mark.usefixtures("cpus_free")
async def test_the_time_kept_awake_by_polling_is_counted_and_scraped(engine_config: ConfigFactory) -> None:
    """``cerebellar_norse_busy_poll_seconds_total``: each window's time, the running one included, never a sleep's."""
    engine = Engine(engine_config(busy_poll_us=50_000))
    engine.warm_up()
    await engine.submit(tick("A", T0))
    await asyncio.sleep(0.01)
    assert engine.polled_s() == engine.stats.polled_s == 0.0  # a lone tick: no window
    t0 = time.monotonic()
    await engine.submit(tick("A", T0 + 1))
    await asyncio.sleep(0.01)
    running = engine.polled_s()
    assert engine.polling and engine.stats.polled_s == 0.0 and 0.0 < running <= time.monotonic() - t0
    await asyncio.sleep(0.2)  # the window ends after 50 ms; the loop then sleeps
    assert not engine.polling
    first = engine.stats.polled_s
    assert 0.05 <= first < 0.2 and engine.polled_s() == first
    await asyncio.sleep(0.05)
    assert engine.polled_s() == first
    metrics = ServiceMetrics()
    metrics.add_source(engine_families(engine, "cpu", lambda: (0, 0)))
    text = metrics.render().decode()
    assert f"\n# TYPE cerebellar_norse_busy_poll_seconds_total counter\ncerebellar_norse_busy_poll_seconds_total {first!r}\n" in text


# -- back-pressure and bad input -------------------------------------------------------------


async def test_full_queue_refuses_ticks_without_changing_state(engine_config: ConfigFactory) -> None:
    cfg = engine_config(queue_size=4)
    engine = Engine(cfg)
    x1, x2 = tick("X", T0, 100.0), tick("X", T0 + 10, 101.0)
    await engine.submit(x1)
    before = market_state(engine, "X")

    fill = [tick(f"F{k}", T0) for k in range(4)]
    tasks = [asyncio.create_task(engine.submit(t)) for t in [*fill, x2, tick("Y", T0)]]
    out = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, TickResult) for r in out[:4])
    assert all(isinstance(r, CapacityError) and r.retry_after_s > 0 for r in out[4:])
    assert engine.stats.rejected_full == 2
    assert_same_state(market_state(engine, "X"), before)
    assert "Y" not in engine.pool.table

    with pytest.raises(CapacityError, match="queue full"):
        await engine.submit_many([tick(f"G{k}", T0) for k in range(5)])
    assert engine.stats.ticks == 5 and not any(f"G{k}" in engine.pool.table for k in range(5))
    assert engine.health()["queue_capacity"] == 4

    # the refused tick was not applied: X continues as if it never came
    got = core(await engine.submit(x2))
    assert got == sequential(cfg, [x1, x2])[1][1]


async def test_out_of_order_tick_is_refused_naming_the_timestamp(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config())
    await engine.submit(tick("A", T0 + 1000))
    before = market_state(engine, "A")
    with pytest.raises(TickOrderError) as exc:
        await engine.submit(tick("A", T0 + 999))
    assert exc.value.field == "timestamp"
    assert str(T0 + 999) in str(exc.value) and str(T0 + 1000) in str(exc.value)
    assert_same_state(market_state(engine, "A"), before)
    assert engine.stats.rejected_order == 1 and engine.stats.ticks == 1
    await engine.submit(tick("A", T0 + 1000))  # an equal timestamp is in order


@pytest.mark.parametrize(("batch", "bad"), [
    # older than an earlier tick of the same batch
    ([("A", 2000), ("B", 0), ("B", 10), ("A", 1500), ("C", 0)], 3),
    # older than the market's state
    ([("B", 0), ("A", 500)], 1),
])
async def test_batch_with_a_bad_order_applies_none_of_its_ticks(engine_config: ConfigFactory, batch: list[tuple[str, int]],
                                                                bad: int) -> None:
    engine = Engine(engine_config())
    await engine.submit(tick("A", T0 + 1000))
    before = market_state(engine, "A")
    with pytest.raises(TickOrderError) as exc:
        await engine.submit_many([tick(m, T0 + dt) for m, dt in batch])
    assert exc.value.field == f"ticks.{bad}.timestamp"
    assert engine.stats.ticks == 1 and engine.queue_depth == 0
    assert engine.pool.table.markets() == ["A"]
    assert_same_state(market_state(engine, "A"), before)


# -- failures --------------------------------------------------------------------------------


async def test_failing_batch_fails_only_its_own_ticks(engine_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    cfg = engine_config(batch_size=2, warm_step_interval_us=0)  # only the batches step: a warm step would count too
    engine = Engine(cfg)
    real_step = engine.backend.step_buffered
    calls = {"n": 0}

    def flaky(b: int) -> tuple[np.ndarray, np.ndarray]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("kernel exploded")
        return real_step(b)

    monkeypatch.setattr(engine.backend, "step_buffered", flaky)
    monkeypatch.setattr(engine.backend, "fused_step", lambda: None)  # (steps then go through step_buffered)
    ticks = [tick(m, T0) for m in "ABCD"]
    with caplog.at_level(logging.ERROR, logger="cerebellar_norse.engine"):
        out = await asyncio.gather(*(asyncio.create_task(engine.submit(t)) for t in ticks), return_exceptions=True)
    assert calls["n"] == 2  # two batches in one flush
    assert all(isinstance(r, EngineFatalError) and "kernel exploded" in str(r) for r in out[:2])
    assert all(isinstance(r, TickResult) for r in out[2:])
    assert engine.stats.failed_batches == 1 and engine.stats.failed_ticks == 2 and engine.stats.ticks == 2
    assert "batch of 2 ticks failed" in caplog.text

    # the engine keeps serving, and the failed ticks left no trace in their markets
    again = [core(r) for r in await engine.submit_many(ticks[:2])]
    assert again == sequential(cfg, ticks[:2])[1]
    assert engine.health()["accepting"] is True


# -- pool and eviction ---------------------------------------------------------------------


async def test_lru_eviction_restarts_the_evicted_market(engine_config: ConfigFactory) -> None:
    cfg = engine_config(max_markets=4)
    engine = Engine(cfg)
    for k in range(6):
        await engine.submit(tick(f"M{k}", T0 + k, 100.0 + k))
    assert engine.pool.table.evictions == 2
    health = engine.health()["pool"]
    assert health["evictions"] == 2 and health["markets"] == 4 and health["capacity"] == 4 and health["usage"] == 1.0
    assert engine.pool.table.markets() == ["M2", "M3", "M4", "M5"]

    # M0 was evicted: its next tick starts from rest, like a fresh market's first tick
    nxt = tick("M0", T0 + 100, 101.0)
    got = core(await engine.submit(nxt))
    assert got == sequential(cfg, [nxt])[1][0]
    assert engine.pool.table.evictions == 3 and engine.pool.table.last_evicted == "M2"


async def test_batch_with_more_markets_than_slots(engine_config: ConfigFactory) -> None:
    """A batch of 6 markets on 4 slots: evicting a market of the same batch must not hand its state to another."""
    cfg = engine_config(max_markets=4)
    engine = Engine(cfg)
    batch = [tick(f"M{k}", T0 + k, 100.0 + k, 500.0 + k) for k in range(6)]
    batch += [tick("M0", T0 + 50, 103.0), tick("M5", T0 + 60, 99.0)]
    got = [core(r) for r in await engine.submit_many(batch)]
    assert got == sequential(cfg, batch, max_markets=4)[1]  # the same ticks one at a time through the same LRU
    for r, t in zip(got[:6], batch[:6], strict=True):
        assert r == sequential(cfg, [t])[1][0]  # every first tick from rest
    assert engine.pool.table.evictions == 3
    assert engine.health()["pool"]["evictions"] == 3


async def test_warm_up_evicts_no_live_market(engine_config: ConfigFactory) -> None:
    """A pool filled by restore_state before warm_up (the service's start order) keeps every market."""
    cfg = engine_config(max_markets=4, cpu_threads=2)
    engine = Engine(cfg)
    for k in range(3):
        await engine.submit(tick(f"M{k}", T0))
    engine.warm_up()  # one free slot: scratch ticks go there
    assert engine.pool.table.markets() == ["M0", "M1", "M2"] and engine.pool.table.evictions == 0
    await engine.submit(tick("M3", T0))
    before = {m: market_state(engine, m) for m in engine.pool.table.markets()}
    engine.warm_up()  # no free slot: nothing to warm, nothing evicted
    assert engine.pool.table.markets() == ["M0", "M1", "M2", "M3"] and engine.pool.table.evictions == 0
    for m, st in before.items():
        assert_same_state(market_state(engine, m), st)
    assert engine.stats.ticks == 4


async def test_warm_up_ticks_are_neither_learned_from_nor_recorded(engine_config: ConfigFactory, tmp_path: Path) -> None:
    cfg = engine_config(state_dir=tmp_path / "state", cpu_threads=2, training={"online_learning": True},
                        debug={"record_requests": True})
    engine = Engine(cfg)
    assert engine.learner is not None
    weights = engine.backend.pf_views()[0].copy()  # type: ignore[attr-defined]
    engine.warm_up()
    np.testing.assert_array_equal(engine.backend.pf_views()[0], weights)  # type: ignore[attr-defined]
    assert engine.learner.pending == {} and engine.learner.judged == 0
    assert not (tmp_path / "state" / "recordings").exists()
    served = await engine.submit(tick("A", T0))  # real ticks still are, with what was served
    assert list(engine.learner.pending) == ["A"]
    await engine.drain(save=False)
    (rec,) = (tmp_path / "state" / "recordings").glob("*.csv")
    p = served.as_dict()["probabilities"]
    (line,) = rec.read_text().splitlines()[1:]  # the real tick only, starting from rest (batch, seq, start at the end)
    assert line == f"{T0},A,100.0,1000.0,{p['down']!r},{p['flat']!r},{p['up']!r},{engine.model_version},,0,0,rest"


# -- persistence across restarts -------------------------------------------------------------


async def run_in_chunks(engine: Engine, ticks: list[Tick], size: int = 64) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for start in range(0, len(ticks), size):
        out.extend(core(r) for r in await engine.submit_many(ticks[start:start + size]))
    return out


def interleaved(by_market: dict[str, list[Tick]]) -> list[Tick]:
    return sorted((t for ts in by_market.values() for t in ts), key=lambda t: (t.timestamp, t.market_id))


async def test_state_survives_a_restart(engine_config: ConfigFactory, streams: StreamFactory, tmp_path: Path) -> None:
    cfg = engine_config(state_dir=tmp_path / "state")
    ticks = interleaved(streams(600, 8, seed=11))
    part1, part2 = ticks[:300], ticks[300:]

    first = Engine(cfg)
    await run_in_chunks(first, part1)
    order = first.pool.table.markets()
    await first.drain(save=True)
    assert sorted(os.listdir(tmp_path / "state")) == [STATE_FILE]
    with pytest.raises(CapacityError, match="shutting down"):
        await first.submit(part2[0])

    second = Engine(cfg)
    assert second.restore_state() == 8
    assert second.pool.table.markets() == order  # LRU order kept
    resumed = await run_in_chunks(second, part2)

    never_stopped = Engine(cfg)
    await run_in_chunks(never_stopped, part1)
    assert resumed == await run_in_chunks(never_stopped, part2)
    for m in order:
        assert_same_state(market_state(second, m), market_state(never_stopped, m))

    # the order check survives too: a tick older than a market's last one is still refused
    last = part2[-1]
    with pytest.raises(TickOrderError):
        await second.submit(tick(last.market_id, last.timestamp - 1))


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
async def test_corrupt_state_file_is_refused(engine_config: ConfigFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                            damage: str) -> None:
    cfg = engine_config(state_dir=tmp_path / "state")
    first = Engine(cfg)
    await first.submit_many([tick(f"M{k}", T0) for k in range(5)])
    await first.drain(save=True)
    path = tmp_path / "state" / STATE_FILE
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    elif damage == "truncate":
        data = data[:len(data) - 100]
    else:
        data = bytearray()
    path.write_bytes(bytes(data))

    second = Engine(cfg)
    with caplog.at_level(logging.WARNING, logger="cerebellar_norse.engine"):
        assert second.restore_state() == 0
    assert second.pool.used == 0
    assert "market state not restored" in caplog.text and str(path) in caplog.text
    (moved,) = path.parent.glob(f"{STATE_FILE}.corrupt-*")  # quarantined as it was, never overwritten
    assert moved.read_bytes() == bytes(data) and not path.exists()
    assert core(await second.submit(tick("M0", T0))) == sequential(cfg, [tick("M0", T0)])[1][0]


async def test_state_of_another_network_is_refused(engine_config: ConfigFactory, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    first = Engine(engine_config(state_dir=tmp_path / "state"))
    await first.submit_many([tick(f"M{k}", T0) for k in range(3)])
    await first.drain(save=True)

    other = Engine(engine_config(state_dir=tmp_path / "state", neural={"seed": 7}))
    with caplog.at_level(logging.WARNING, logger="cerebellar_norse.engine"):
        assert other.restore_state() == 0
    assert other.pool.used == 0
    assert "another network" in caplog.text
    # the file was moved aside (never to be overwritten by the next save), whole: renamed back, it restores
    (moved,) = (tmp_path / "state").glob(f"{STATE_FILE}.foreign-*")
    assert not (tmp_path / "state" / STATE_FILE).exists() and str(moved) in caplog.text
    moved.rename(tmp_path / "state" / STATE_FILE)
    assert Engine(engine_config(state_dir=tmp_path / "state")).restore_state() == 3


async def test_missing_state_file_restores_nothing(engine_config: ConfigFactory, tmp_path: Path) -> None:
    engine = Engine(engine_config(state_dir=tmp_path / "nowhere"))
    assert engine.restore_state() == 0 and engine.pool.used == 0


async def test_save_replaces_the_file_whole(engine_config: ConfigFactory, tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg = engine_config(state_dir=state)
    engine = Engine(cfg)
    await engine.submit(tick("A", T0))
    assert engine.save_state() == 1
    path = state / STATE_FILE
    old = path.read_bytes()
    os.link(path, tmp_path / "old-link")  # a second name for the first file's inode

    await engine.submit_many([tick("B", T0), tick("A", T0 + 5)])
    assert engine.save_state() == 2
    # a new file took the name; the old one was never written into
    assert (tmp_path / "old-link").read_bytes() == old
    assert os.stat(path).st_ino != os.stat(tmp_path / "old-link").st_ino
    read_checksummed(path)
    assert sorted(os.listdir(state)) == [STATE_FILE]  # no temporary files left
    fresh = Engine(cfg)
    assert fresh.restore_state() == 2 and fresh.pool.table.markets() == ["B", "A"]


async def test_drain_finishes_queued_ticks_before_saving(engine_config: ConfigFactory, tmp_path: Path) -> None:
    cfg = engine_config(state_dir=tmp_path / "state", max_batch_delay_us=200_000)
    engine = Engine(cfg)
    await engine.submit(tick("A", T0))
    queued = asyncio.create_task(engine.submit(tick("A", T0 + 10)))
    await asyncio.sleep(0)
    assert engine.queue_depth == 1  # waiting for the (long) batch delay
    await engine.drain(save=True)
    assert queued.done() and isinstance(queued.result(), TickResult)
    fresh = Engine(cfg)
    assert fresh.restore_state() == 1
    assert_same_state(market_state(fresh, "A"), market_state(engine, "A"))


async def test_health_reports_pool_and_queue(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config(max_markets=8, queue_size=16))
    await engine.submit_many([tick("A", T0), tick("B", T0)])
    h = engine.health()
    assert h["pool"]["markets"] == 2 and h["pool"]["capacity"] == 8 and h["pool"]["usage"] == 0.25
    assert h["pool"]["evictions"] == 0 and h["pool"]["bytes"] == engine.arrays.nbytes
    assert h["queue_depth"] == 0 and h["queue_capacity"] == 16 and h["accepting"] is True
