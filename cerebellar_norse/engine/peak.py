"""The largest value of a quantity over a recent stretch of time, in two fixed windows.

The engine's queue holds ticks only until the event loop's next iteration (the backend
steps them on the loop's own thread), so the queue depth read at one instant, by a
scrape, is almost always 0 even while ticks are refused for want of room. What an
alert on a full queue needs is the most it held lately: :class:`RecentPeak` keeps the
largest value noted in the current window and in the one before it, so a reader sees
every value noted in the last ``window_s`` to ``2 * window_s`` seconds.
"""

from __future__ import annotations


class RecentPeak:
    """Largest value noted over the last ``window_s`` to ``2 * window_s`` seconds (monotonic clock, s).

    Noted from the event loop; :meth:`peak` only reads, so a reader on another thread at
    worst sees the value of a moment before.
    """

    def __init__(self, window_s: float) -> None:
        if not window_s > 0.0:
            raise ValueError(f"window_s must be > 0, not {window_s!r}")
        self.window_s = window_s
        self._start = float("-inf")  # when the current window began
        self._current = 0  # largest value noted in the current window
        self._previous = 0  # largest value noted in the window before it (0 when that window saw nothing)

    def note(self, value: int, now: float) -> None:
        """Record ``value`` as seen at ``now``."""
        if now - self._start >= self.window_s:
            self._previous = self._current if now - self._start < 2 * self.window_s else 0
            self._current = 0
            self._start = now
        if value > self._current:
            self._current = value

    def peak(self, now: float) -> int:
        """The largest value noted in the current and the previous window as of ``now`` (0 when none)."""
        age = now - self._start
        if age < self.window_s:
            return max(self._current, self._previous)
        if age < 2 * self.window_s:
            return self._current  # the current window has become the previous one
        return 0
