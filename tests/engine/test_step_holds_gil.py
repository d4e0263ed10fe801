"""The engine's step holds the GIL: no other Python thread runs inside a tick's measured processing time.

A compiled call that releases the GIL hands it to any other Python thread waiting for it
(a checkpoint being written, a request's worker thread); the step then waits for it back,
up to ``sys.getswitchinterval()``, and that wait is counted in ``processing_time_ns``.
Here a thread waits for the GIL while the engine steps (batches of 200 ticks, whose
step takes long enough for the thread to wake, then single ticks and warm steps); with a
switch interval far longer than the steps, it can only run if a step releases the GIL.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

from engine_helpers import ConfigFactory, moving_ticks

from cerebellar_norse.engine.engine import Engine

SWITCH_INTERVAL_S = 10.0  # far longer than the steps below take, even on a loaded host


def runs_of_a_waiting_thread(steps: Sequence[Callable[[], object]]) -> int:
    """How often a thread waiting for the GIL got to run during ``steps`` (stops at the first step that let it)."""
    count = [0]
    go, stop = threading.Event(), threading.Event()

    def other() -> None:
        go.wait()
        while not stop.is_set():
            count[0] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    thread = threading.Thread(target=other, name="gil-waiter", daemon=True)
    try:
        thread.start()
        go.set()
        end = time.perf_counter() + 0.05  # hold the GIL while the thread wakes up and starts waiting for it
        while time.perf_counter() < end:
            pass
        before = count[0]
        for step in steps:
            step()
            if count[0] != before:
                break
        return count[0] - before
    finally:
        stop.set()
        sys.setswitchinterval(old)
        thread.join()


def test_steps_keep_the_gil(engine_config: ConfigFactory) -> None:
    engine = Engine(engine_config(warm_step_interval_us=0, max_markets=256))
    markets = tuple(f"M{k:03d}" for k in range(200))
    batches = [moving_ticks(markets, 1, start=k) for k in range(80)]  # a step of 200 ticks takes about 0.5 ms
    singles = moving_ticks(markets[:3], 20, start=80)
    engine.process_now(batches[0])  # compiled and warm before the thread waits
    engine.process_now(singles[:1])
    steps: list[Callable[[], object]] = [partial(engine.process_now, b) for b in batches[1:]]
    steps += [partial(engine.process_now, [t]) for t in singles[1:]]
    steps += [engine.warm_step] * 10
    assert runs_of_a_waiting_thread(steps) == 0


def test_live_evaluation_keeps_the_gil() -> None:
    """The served ticks' labelling and scoring (compiled, every 256 ticks, inside a batch's step) hold the GIL too,
    also while the pool of ticks waiting for their horizon grows (400 markets' ticks, 10 ticks each waiting: the pool
    doubles from its first size several times during the steps). Numpy's copies of a large array release the GIL, so
    the pool is grown by compiled code."""
    import numpy as np

    from cerebellar_norse.engine.selfeval import LiveScorer
    from cerebellar_norse.training.labels import LabelSpec

    markets = tuple(f"M{k:03d}" for k in range(400))
    scorer = LiveScorer(LabelSpec(horizon_ticks=10), window=50, max_markets=512)
    ticks = moving_ticks(markets, 30)
    probs = np.full((40, 3), 1 / 3)
    scorer.observe_batch(ticks[:400], probs.repeat(10, axis=0))  # every market tracked before the thread waits
    steps: list[Callable[[], object]] = [partial(scorer.observe_batch, ticks[k:k + 40], probs)
                                         for k in range(400, len(ticks), 40)]
    steps.append(lambda: scorer.judged)
    assert runs_of_a_waiting_thread(steps) == 0
    assert scorer.judged == len(ticks) - 400 * 10
