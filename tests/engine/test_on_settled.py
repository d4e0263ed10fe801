"""``Engine.submit_nowait(..., on_settled=)``: the engine tells a tick's caller in the round its batch runs.

A future's done-callbacks run from the event loop's next round; the protocol's direct route answers
through ``on_settled`` instead, so that a batch's answers are written in the round that stepped it.
Whatever happens to the batch (stepped, refused, failed), each tick's ``on_settled`` is called once
with its settled future, and one that raises keeps no other from being called.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from engine_helpers import T0, ConfigFactory, tick

from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.errors import EngineFatalError

pytestmark = pytest.mark.asyncio


async def test_each_tick_is_told_in_the_round_of_its_batch_before_the_future_callbacks(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config(warm_step_interval_us=0))
    order: list[tuple[str, str]] = []
    futs = []
    for m in ("A", "B", "C"):
        fut = engine.submit_nowait(tick(m, T0), None, lambda f, m=m: order.append(("settled", f.result().market_id)))
        fut.add_done_callback(lambda f, m=m: order.append(("callback", m)))
        futs.append(fut)
    engine._flush()  # (what the loop's round runs): the batch, then each tick told, before any await
    assert order == [("settled", "A"), ("settled", "B"), ("settled", "C")]
    await asyncio.sleep(0)
    assert order[3:] == [("callback", "A"), ("callback", "B"), ("callback", "C")]
    assert [f.result().market_id for f in futs] == ["A", "B", "C"]


async def test_a_failed_batch_tells_each_tick_with_its_error(engine_config: ConfigFactory,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(engine_config(warm_step_interval_us=0))

    def broken(b: int) -> object:
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.backend, "step_buffered", broken)
    monkeypatch.setattr(engine.backend, "fused_step", lambda: None)  # (steps then go through step_buffered)
    told: list[Any] = []
    for m in ("A", "B"):
        engine.submit_nowait(tick(m, T0), None, told.append)
    engine._flush()
    assert len(told) == 2 and all(isinstance(f.exception(), EngineFatalError) for f in told)


async def test_a_callback_that_raises_is_logged_and_the_others_are_told(engine_config: ConfigFactory,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(engine_config(warm_step_interval_us=0))
    told: list[str] = []

    def bad(fut: Any) -> None:
        raise ValueError("caller's bug")

    engine.submit_nowait(tick("A", T0), None, bad)
    engine.submit_nowait(tick("B", T0), None, lambda f: told.append(f.result().market_id))
    engine._flush()
    assert told == ["B"]
    assert engine.stats.ticks == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == ["a tick's settled callback failed"]


async def test_a_future_cancelled_before_its_batch_is_still_told(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config(warm_step_interval_us=0))
    told: list[Any] = []
    fut = engine.submit_nowait(tick("A", T0), None, told.append)
    fut.cancel()
    engine._flush()
    assert told == [fut] and fut.cancelled()
    assert engine.stats.ticks == 1  # (queued ticks are stepped: the engine does not look at who still waits)
