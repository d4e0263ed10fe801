"""A batch request cut by a crash between its engine steps: what the restart holds of it (docs/operations.md).

A batch request is stepped, and journaled, in engine steps of at most ``performance.batch_size`` ticks. A kill -9
after some of its steps were journaled and before its answer was sent leaves those steps in the journal, and the
restart replays them: the request is partly in. What the documentation promises of it is that each market holds a
prefix of its ticks in the request, so that a client can read each market's last tick and resend the ticks after it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import T0, ConfigFactory, crash, tick

from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.neurons.encoder import S_LAST_TS, S_N_TICKS

pytestmark = pytest.mark.asyncio

STEP = 8  # performance.batch_size: ticks per engine step


async def test_a_batch_cut_between_its_steps_leaves_each_market_a_prefix_of_its_ticks(engine_config: ConfigFactory,
                                                                                       tmp_path: Path) -> None:
    cfg = engine_config(state_dir=tmp_path / "state", max_markets=16, batch_size=STEP, queue_size=256)
    first = Engine(cfg)
    d = Durability(first)
    d.recover()
    markets = ["A", "B", "C"]
    ticks = [tick(markets[k % 3], T0 + 1000 * (k // 3), 100.0 + 0.1 * k) for k in range(5 * STEP)]  # 5 steps
    real_step = first._run_batch
    steps = 0

    def step_then_die(batch: list) -> None:  # type: ignore[type-arg]
        nonlocal steps
        if steps == 2:  # the process dies here: two steps journaled, three not
            crash(d)
            raise RuntimeError("killed")
        steps += 1
        real_step(batch)

    first._run_batch = step_then_die  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    died: list[BaseException] = []
    loop.set_exception_handler(lambda _loop, ctx: died.append(ctx.get("exception")))  # type: ignore[arg-type]
    task = asyncio.ensure_future(first.submit_many(ticks))
    for _ in range(50):
        await asyncio.sleep(0)
        if d.closed:
            break
    assert d.closed
    task.cancel()

    second = Engine(cfg)
    d2 = Durability(second)
    d2.recover()
    try:
        held = 0
        for m in markets:
            slot = second.pool.table.get(m)
            mine = [t for t in ticks if t.market_id == m]
            n = 0 if slot is None else int(second.arrays.enc[slot, S_N_TICKS])
            assert 0 < n < len(mine), (m, n)  # partly in
            assert int(second.arrays.enc[slot, S_LAST_TS]) == mine[n - 1].timestamp  # its first n ticks, in order
            twin = Engine(engine_config(state_dir=tmp_path / f"twin-{m}", max_markets=16))
            twin.process_now(mine[:n])
            for f, a in twin.arrays.read_slot(twin.pool.table.get(m)).items():  # type: ignore[arg-type]
                assert np.array_equal(a, second.arrays.read_slot(slot)[f]), (m, f)  # type: ignore[arg-type]
            held += n
        assert held == 2 * STEP  # exactly the two steps journaled before the kill
    finally:
        crash(d2)
