"""Request timelines: when each stage of a request happened, kept for the most recent and the slowest requests.

A request's stages, in order (times are ``time.perf_counter_ns()`` readings):

``received``       the request reached the service (ASGI entry, before the body is read)
``validated``      the body was parsed and checked, the ticks handed to the engine queue
``batch_started``  the engine batch holding the request's (first) tick began
``stepped``        the backend step holding its (last) tick ended
``completed``      the batch's results were ready (journal, learning, scoring done)
``serialised``     the answer's JSON was built
``sent``           the answer was handed to the server

A stage a request never reached (refused by validation, say) stays unset. The book
keeps the last :data:`RECENT` finished requests and the :data:`SLOWEST` slowest of the
current and the previous hour, both bounded; looking up a request id finds it in
either. Recording costs a few clock reads per request and per batch and one small
object per request; nothing is computed until somebody asks.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from typing import Any

STAGES = ("received", "validated", "batch_started", "stepped", "completed", "serialised", "sent")
RECEIVED, VALIDATED, BATCH_STARTED, STEPPED, COMPLETED, SERIALISED, SENT = range(len(STAGES))
RECENT = 1024  # finished requests kept, most recent first
SLOWEST = 64  # slowest requests kept per hour
SLOW_WINDOW_S = 3600.0


class Timeline:
    """The stage times (ns, perf_counter) of one request; 0 marks a stage not reached."""

    __slots__ = ("batch_seq", "batch_size", "market_id", "marks", "request_id", "route", "status", "ticks", "wall_s")

    def __init__(self, request_id: str, route: str, received_ns: int) -> None:
        self.request_id = request_id
        self.route = route
        self.marks = [received_ns, 0, 0, 0, 0, 0, 0]
        self.market_id = ""
        self.ticks = 0
        self.batch_size = 0  # ticks in the engine batch with the request's last tick
        self.batch_seq = 0  # that batch's engine step number
        self.status = 0
        self.wall_s: float | None = None  # wall clock minus perf_counter (s) when the request finished

    def batched(self, started_ns: int, stepped_ns: int, completed_ns: int, size: int, seq: int) -> None:
        """Record the engine batch of one of the request's ticks (a batch request may span several)."""
        m = self.marks
        if not m[BATCH_STARTED]:
            m[BATCH_STARTED] = started_ns
        m[STEPPED], m[COMPLETED] = stepped_ns, completed_ns
        self.batch_size, self.batch_seq = size, seq

    @property
    def total_ns(self) -> int:
        """Received to the last stage reached (ns)."""
        m = self.marks
        return (m[SENT] or max(m)) - m[RECEIVED]

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``GET /debug/requests/{id}``: offsets from ``received`` in µs, and each stage's duration."""
        t0 = self.marks[RECEIVED]
        wall_s = self.wall_s if self.wall_s is not None else wall_minus_perf_s()
        stages: list[dict[str, Any]] = []
        prev = t0
        for name, t in zip(STAGES, self.marks, strict=True):
            if t == 0 and name != "received":
                stages.append({"stage": name, "at_us": None, "took_us": None})
                continue
            stages.append({"stage": name, "at_us": (t - t0) / 1e3, "took_us": (t - prev) / 1e3})
            prev = t
        return {"request_id": self.request_id, "route": self.route, "market_id": self.market_id or None,
                "ticks": self.ticks, "status": self.status, "batch_size": self.batch_size or None,
                "batch_seq": self.batch_seq or None, "received_at": _iso(wall_s + t0 / 1e9),
                "total_us": self.total_ns / 1e3,
                "stages": stages}


def wall_minus_perf_s() -> float:
    """What to add to a perf_counter reading (s) for the wall-clock time (s) it was taken at, now: read again for
    each request, since the wall clock may be stepped (NTP, an operator) while perf_counter runs on."""
    return time.time() - time.perf_counter_ns() / 1e9


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1e6) % 1_000_000:06d}Z"


class TimelineBook:
    """The most recent and the slowest finished requests' timelines, bounded."""

    def __init__(self, recent: int = RECENT, slowest: int = SLOWEST, window_s: float = SLOW_WINDOW_S) -> None:
        self.recent: deque[Timeline] = deque(maxlen=recent)
        self.slowest = slowest
        self.window_s = window_s
        self._slow: list[tuple[int, int, Timeline]] = []  # min-heap of (total ns, n, timeline), this window
        self._slow_prev: list[tuple[int, int, Timeline]] = []  # the previous window's
        self._window_end = time.monotonic() + window_s
        self._n = 0

    def finish(self, tl: Timeline) -> None:
        """Keep a finished request's timeline."""
        tl.wall_s = wall_minus_perf_s()
        self.recent.append(tl)
        self._n = n = self._n + 1
        total = tl.total_ns
        slow = self._slow
        if len(slow) < self.slowest:
            heapq.heappush(slow, (total, n, tl))
        elif total > slow[0][0]:
            heapq.heapreplace(slow, (total, n, tl))
        if not n & 255 and time.monotonic() >= self._window_end:
            self._slow_prev, self._slow = self._slow, []
            self._window_end = time.monotonic() + self.window_s

    def get(self, request_id: str) -> Timeline | None:
        """The newest kept timeline of ``request_id`` (ids may repeat when callers send their own)."""
        for tl in reversed(self.recent):
            if tl.request_id == request_id:
                return tl
        best = [e for e in (*self._slow, *self._slow_prev) if e[2].request_id == request_id]
        return max(best, key=lambda e: e[1])[2] if best else None

    def slowest_first(self, limit: int) -> list[Timeline]:
        """The slowest kept requests (this hour and the last, and the recent ring), slowest first."""
        seen: dict[int, Timeline] = {id(tl): tl for _, _, tl in (*self._slow, *self._slow_prev)}
        for tl in self.recent:
            seen.setdefault(id(tl), tl)
        return sorted(seen.values(), key=lambda tl: tl.total_ns, reverse=True)[:limit]

    def newest_first(self, limit: int) -> list[Timeline]:
        """The most recent finished requests, newest first."""
        out: list[Timeline] = []
        for tl in reversed(self.recent):
            if len(out) == limit:
                break
            out.append(tl)
        return out


def ascii_timeline(tl: dict[str, Any], width: int = 50) -> str:
    """A timeline (the JSON of ``GET /debug/requests/{id}``) drawn as text, one bar per stage."""
    total = max(float(tl.get("total_us") or 0.0), 1e-9)
    head = (f"request {tl['request_id']}  {tl['route']}  market {tl.get('market_id') or '-'}  ticks {tl['ticks']}  "
            f"status {tl['status']}  batch {tl.get('batch_size') or '-'} ticks (step {tl.get('batch_seq') or '-'})  "
            f"at {tl['received_at']}")
    lines = [head, f"{'stage':<14} {'at µs':>10} {'took µs':>10}  0{'':{width - 2}}{total:.1f} µs"]
    for st in tl["stages"]:
        if st["at_us"] is None:
            lines.append(f"{st['stage']:<14} {'-':>10} {'-':>10}  (not reached)")
            continue
        start = round((st["at_us"] - st["took_us"]) / total * width)
        end = max(round(st["at_us"] / total * width), start + (1 if st["took_us"] > 0 else 0))
        bar = " " * start + "#" * (end - start)
        lines.append(f"{st['stage']:<14} {st['at_us']:>10.1f} {st['took_us']:>10.1f}  |{bar:<{width}}|")
    lines.append(f"{'total':<14} {total:>10.1f}")
    return "\n".join(lines)
