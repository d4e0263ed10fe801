"""How late the event loop runs its timers: stalls that no request's latency shows.

A request is timed from when the service reads it. While the process is stopped
(SIGSTOP, a debugger, the host starving the VM of CPU), frozen in a long system call or
busy in one long callback, requests wait in the kernel's socket buffers and accept
queue, unseen, and their latency figures later look normal. A timer that should fire
every ``LOOP_LAG_INTERVAL_S`` seconds and fires late by the stall's length shows it: the lateness
of each firing is observed into ``cerebellar_norse_event_loop_lag_seconds``, and a
stall of :data:`STALL_LOG_S` or more is logged at WARNING.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .metrics import LOOP_LAG_INTERVAL_S, TickHistogram

STALL_LOG_S = 1.0
"""A lag of at least this many seconds is logged at WARNING."""

log = logging.getLogger("cerebellar_norse.loop")


def log_stall(lag_s: float) -> None:
    """The WARNING line of one stall of ``lag_s`` seconds."""
    log.warning("event loop stalled for %.1f s (process stopped, starved of CPU or blocked): requests that arrived "
                "meanwhile waited unread, and the latency metrics do not include that wait", lag_s,
                extra={"fields": {"stall_s": round(lag_s, 3)}})


async def watch_loop_lag(hist: TickHistogram, interval_s: float = LOOP_LAG_INTERVAL_S,
                         on_stall: Callable[[float], None] = log_stall) -> None:
    """Every ``interval_s`` (s), observe into ``hist`` how late (s) the timer fired; call ``on_stall`` with the lag
    when it is at least :data:`STALL_LOG_S`. Runs until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        lag = max(0.0, loop.time() - due)
        hist.observe_many(lag, 1)
        if lag >= STALL_LOG_S:
            on_stall(lag)
