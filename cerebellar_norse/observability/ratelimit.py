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
