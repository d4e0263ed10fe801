"""Log lines for frequent events, aggregated: at most one line per interval, with the count.

Under an over-capacity load an event such as an LRU eviction can happen on every batch;
one INFO line each would flood the logs (tens of thousands of lines a minute). A
:class:`SummaryLog` writes the first event at once (so the start of a burst is visible)
and then at most one line per ``interval_s`` saying how many events it stands for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any


class SummaryLog:
    """One aggregated INFO line per ``interval_s`` for an event counted by ``add``.

    Each line's ``fields`` carry ``count_field`` (the events' total count since the
    previous line), ``occurrences`` (how many ``add`` calls that was), ``window_s``
    (the time they span) and the fields of the latest ``add``. Counts not yet written
    are written by :meth:`flush` or with the next line.
    """

    def __init__(self, logger: logging.Logger, message: str, interval_s: float, count_field: str = "count",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.message = message
        self.interval_s = interval_s
        self.count_field = count_field
        self.clock = clock
        self.lines = 0
        self._pending = 0
        self._occurrences = 0
        self._since: float | None = None
        self._last_line: float | None = None
        self._fields: dict[str, Any] = {}

    def add(self, count: int, **fields: Any) -> bool:
        """Count ``count`` events; returns True when this call wrote a line."""
        now = self.clock()
        if self._since is None:
            self._since = now
        self._pending += count
        self._occurrences += 1
        self._fields = fields
        if self._last_line is not None and now - self._last_line < self.interval_s:
            return False
        self._write(now)
        return True

    def flush(self) -> bool:
        """Write the counts not yet written (if any); returns True when a line was written."""
        if not self._occurrences:
            return False
        self._write(self.clock())
        return True

    def _write(self, now: float) -> None:
        since = self._since if self._since is not None else now
        self.logger.info(self.message, extra={"fields": {
            self.count_field: self._pending, "occurrences": self._occurrences, "window_s": round(now - since, 3),
            **self._fields}})
        self.lines += 1
        self._last_line = now
        self._pending = 0
        self._occurrences = 0
        self._since = None


# Loggers whose lines a client causes at will, one or more per connection or request: uvicorn's (a malformed request,
# each WebSocket opened, refused or closed; the websockets library logs through it too) and the protocol layer's own.
CLIENT_LOGGERS = ("uvicorn.error",)
ALIKE_BURST = 10  # lines of one message written per window before the rest are counted
ALIKE_WINDOW_S = 10.0


class AlikeLinesLimit(logging.Filter):
    """At most ``burst`` lines of one message (its template: ``"Invalid HTTP request received."``, ``'%s - "WebSocket
    %s" [accepted]'``, …) per ``window_s``; the others are counted, and one line says how many were not written once
    the window is over (at the next line of those loggers, or at the service's next :meth:`sweep`, within a window;
:meth:`flush` at shutdown).

    Installed on the loggers any client can make write (:data:`CLIENT_LOGGERS`): a client sending malformed requests
    or opening WebSockets in a loop wrote one to three lines per connection, thousands a second, to journald. A few
    connections a minute still show each line.
    """

    def __init__(self, burst: int = ALIKE_BURST, window_s: float = ALIKE_WINDOW_S,
                 report: logging.Logger | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self.report = report or logging.getLogger("cerebellar_norse.logging")
        self.clock = clock
        self.suppressed_total = 0
        # message template -> [window start, lines written, lines held back, highest level held back, logger name]
        self._windows: dict[str, list[Any]] = {}
        self._next_sweep = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        if now >= self._next_sweep:
            self.sweep(now)
        key = str(record.msg)
        w = self._windows.get(key)
        if w is not None and now - w[0] >= self.window_s:
            self._close(key, w, now)
            w = None
        if w is None:
            self._windows[key] = [now, 1, 0, record.levelno, record.name]
            return True
        if w[1] < self.burst:
            w[1] += 1
            return True
        w[2] += 1
        w[3] = max(w[3], record.levelno)
        self.suppressed_total += 1
        return False

    def flush(self) -> None:
        """Say now how many lines every window held back so far (and start those windows afresh)."""
        now = self.clock()
        for key, w in list(self._windows.items()):
            self._close(key, w, now)

    def sweep(self, now: float | None = None) -> None:
        """Close the windows that are over (their counts said, nothing kept of them): the table holds the messages
        of the last window only. The service calls it every window, so that a count is said when its flood ends."""
        now = self.clock() if now is None else now
        self._next_sweep = now + min(1.0, self.window_s)
        for key, w in list(self._windows.items()):
            if now - w[0] >= self.window_s:
                self._close(key, w, now)

    def _close(self, key: str, w: list[Any], now: float) -> None:
        del self._windows[key]
        if w[2]:
            self.report.log(w[3], "%d log lines like %r were not written (at most %d alike lines per %g s are)",
                            w[2], key, self.burst, self.window_s,
                            extra={"fields": {"suppressed": w[2], "like": key, "logger": w[4],
                                              "window_s": round(now - w[0], 3)}})


def install_alike_limit(limit: AlikeLinesLimit | None = None) -> AlikeLinesLimit:
    """Put ``limit`` (a new one by default) on :data:`CLIENT_LOGGERS`, replacing one installed before; returns it."""
    limit = limit or AlikeLinesLimit()
    for name in CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, AlikeLinesLimit)]:
            if old is not limit:
                old.flush()  # (logging set up again: the counts so far are said, not lost)
            logger.removeFilter(old)
        logger.addFilter(limit)
    return limit


def installed_alike_limit() -> AlikeLinesLimit | None:
    """The limit on the client loggers (None when none is installed)."""
    for f in logging.getLogger(CLIENT_LOGGERS[0]).filters:
        if isinstance(f, AlikeLinesLimit):
            return f
    return None
