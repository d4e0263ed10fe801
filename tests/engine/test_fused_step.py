"""The fused kernel and the finishing pass in one compiled call give what the two calls give.

:func:`cerebellar_norse.engine.pipeline.step_ticks` runs a step of the fused backend and
the engine's finishing pass (ticks seen, calibrated head, confidence, spike sums) as one
call into compiled code when the backend offers its kernel's arguments
(``Backend.fused_step``); otherwise it calls ``step_buffered`` and then the finishing pass.
Here two engines with the same weights step the same ticks, one each way, and must agree
bit for bit: results and every state array.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba as nb
import numpy as np
import pytest
from engine_helpers import ConfigFactory, moving_ticks

from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.records import TickResult
from cerebellar_norse.neurons.backends import FusedBackend
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.ticks import Tick


def _two_engines(cfg_factory: ConfigFactory, head: bool, **performance: object) -> tuple[Engine, Engine]:
    cfg = cfg_factory(warm_step_interval_us=0, **performance)
    weights = generate_weights(cfg)
    if head:
        weights = weights.with_head(np.array([0.7, 1.6, 1.2]), np.array([0.2, -0.1, 0.05]))
    one_call, two_calls = Engine(cfg, weights=weights), Engine(cfg, weights=weights)
    assert isinstance(one_call.backend, FusedBackend) and one_call.backend.fused_step() is not None
    two_calls.backend.fused_step = lambda: None  # type: ignore[method-assign]  # step_buffered, then the pass
    return one_call, two_calls


def _step_all(engine: Engine, ticks: Sequence[Tick], sizes: Sequence[int]) -> list[TickResult]:
    out, k, j = [], 0, 0
    while k < len(ticks):
        n = sizes[j % len(sizes)]
        out.extend(engine.process_now(ticks[k:k + n]))
        k, j = k + n, j + 1
    return out


def _network_part(r: TickResult) -> tuple[object, ...]:
    return (r.market_id, r.down, r.flat, r.up, r.confidence, r.spike_count, r.warming_up)


@pytest.mark.parametrize("head", [False, True])
def test_one_compiled_call_equals_the_kernel_then_the_finishing_pass(engine_config: ConfigFactory, head: bool) -> None:
    one_call, two_calls = _two_engines(engine_config, head)
    ticks = moving_ticks(("A", "B", "C", "D", "E"), 30)
    sizes = (1, 5, 7, 1, 16)  # one tick; a round of the markets; several ticks of a market in one step; a full batch
    got, want = _step_all(one_call, ticks, sizes), _step_all(two_calls, ticks, sizes)
    assert [_network_part(r) for r in got] == [_network_part(r) for r in want]
    assert all(r.processing_time_ns > 0 for r in got)
    np.testing.assert_array_equal(one_call.arrays.flat, two_calls.arrays.flat)
    np.testing.assert_array_equal(one_call.arrays.enc, two_calls.arrays.enc)
    if head:  # the head changed what was served: the finishing pass ran inside the one call
        raw = Engine(engine_config(warm_step_interval_us=0), weights=generate_weights(engine_config()))
        plain = _step_all(raw, ticks, sizes)
        assert [r.up for r in plain] != [r.up for r in got]


def test_a_weight_swap_gives_the_next_step_the_new_weights(engine_config: ConfigFactory) -> None:
    one_call, two_calls = _two_engines(engine_config, head=False)
    ticks = moving_ticks(("A", "B"), 20)
    _step_all(one_call, ticks[:20], (2,))
    _step_all(two_calls, ticks[:20], (2,))
    before = one_call.backend.fused_step()
    other = generate_weights(engine_config(neural={"seed": 7}))
    for engine in (one_call, two_calls):
        engine.backend.set_weights(other)
    after = one_call.backend.fused_step()
    assert after is not None and before is not None and after.table is not before.table
    got, want = _step_all(one_call, ticks[20:], (2,)), _step_all(two_calls, ticks[20:], (2,))
    assert [_network_part(r) for r in got] == [_network_part(r) for r in want]


@pytest.mark.skipif(nb.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")  # type: ignore[attr-defined]
def test_batches_split_over_threads_go_through_step_buffered(engine_config: ConfigFactory) -> None:
    one_call, two_calls = _two_engines(engine_config, head=False, cpu_threads=2, max_markets=64)
    fused = one_call.backend.fused_step()
    assert fused is not None and fused.threaded_from == one_call.backend.parallel_min_batch
    real, staged = one_call.backend.step_buffered, []

    def counting(b: int) -> tuple[np.ndarray, np.ndarray]:
        staged.append(b)
        return real(b)

    one_call.backend.step_buffered = counting  # type: ignore[method-assign]
    markets = tuple(f"M{k:02d}" for k in range(fused.threaded_from))
    ticks = moving_ticks(markets, 3)
    sizes = (1, fused.threaded_from)
    got, want = _step_all(one_call, ticks, sizes), _step_all(two_calls, ticks, sizes)
    assert staged and all(b >= fused.threaded_from for b in staged)  # the small steps went through the one call
    assert [_network_part(r) for r in got] == [_network_part(r) for r in want]
    np.testing.assert_array_equal(one_call.arrays.flat, two_calls.arrays.flat)
