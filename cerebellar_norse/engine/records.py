"""What the engine reports: a typed result per tick, a typed record per backend step, a typed snapshot.

The engine produces these and knows nothing of who reads them. Readers are *sinks*
(:data:`RecordSink`): the Prometheus metrics, the periodic log summary, the request
timelines and the debug trackers subscribe to batch records; ``/health``, ``/metrics``
and ``/neural/metrics`` read :class:`EngineSnapshot`. So a new reader is a new sink,
never a new reach into the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


class TickResult(NamedTuple):
    """The network's answer to one tick.

    Probabilities are over the horizon's classes (down, flat, up), after the model's
    calibrated head; ``confidence = 1 - H(p)/ln 3`` in [0, 1]; ``spike_count`` the
    spikes of all populations during the tick; ``processing_time_ns`` the backend
    step's time (ns) divided evenly among the ticks of its batch; ``warming_up`` True
    until the market has seen ``neural.warmup_ticks`` ticks.

    Immutable; a named tuple because one is built per tick on the hot path, where a
    frozen dataclass costs four times as much.
    """

    market_id: str
    down: float
    flat: float
    up: float
    confidence: float
    spike_count: int
    processing_time_ns: int
    warming_up: bool
    model_version: str = ""

    @property
    def prediction(self) -> float:
        """P(up) - P(down), in [-1, 1]."""
        return self.up - self.down

    def as_dict(self) -> dict[str, Any]:
        """The result as the Python API returns it (no model version, no request id)."""
        return {
            "market_id": self.market_id,
            "prediction": self.up - self.down,
            "probabilities": {"down": self.down, "flat": self.flat, "up": self.up},
            "confidence": self.confidence,
            "spike_count": self.spike_count,
            "processing_time_ns": self.processing_time_ns,
            "warming_up": self.warming_up,
        }

    def as_json_object(self, request_id: str) -> dict[str, Any]:
        """The result as the HTTP API and the stream answer it (``ResultOut``)."""
        out = self.as_dict()
        out["model_version"] = self.model_version
        out["request_id"] = request_id
        return out


@dataclass(slots=True)
class BatchRecord:
    """One backend step of the engine, handed to every sink right after the step.

    ``slots`` (B,), ``ticks`` (3, B) and ``spikes`` (B, 3) (granule, Purkinje, DCN per
    tick) are views of the engine's buffers, valid only during the sink call: a sink that keeps them
    copies them.
    """

    size: int  # ticks in the step
    step_ns: int  # backend step and calibrated head (ns)
    slots: np.ndarray
    ticks: np.ndarray  # (3, B) price, volume, time (ms since the epoch)
    spikes: np.ndarray

    @property
    def per_tick_s(self) -> float:
        """The step's time amortised over its ticks (s)."""
        return self.step_ns / 1e9 / max(self.size, 1)


RecordSink = Callable[[BatchRecord], None]


@dataclass(frozen=True, slots=True)
class PoolFigures:
    """Occupancy of the state pool."""

    markets: int
    capacity: int
    evictions: int
    bytes: int

    @property
    def usage(self) -> float:
        """Fraction of slots in use, in [0, 1]."""
        return self.markets / self.capacity

    def as_dict(self) -> dict[str, Any]:
        """The ``pool`` object of /health."""
        return {"markets": self.markets, "capacity": self.capacity, "usage": self.usage, "evictions": self.evictions,
                "bytes": self.bytes}


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The engine's state at one moment (between batches), for /health, metrics and logs.

    ``backend`` is the backend's own description (device, streams, memory) or None.
    """

    pool: PoolFigures
    queue_depth: int
    queue_capacity: int
    accepting: bool
    model_version: str
    ticks: int
    batches: int
    failed_batches: int
    failed_ticks: int
    rejected_full: int
    rejected_order: int
    spikes: tuple[int, int, int]
    busy_ns: int
    warm_steps: int  # scratch steps between batches (performance.warm_step_interval_us)
    polled_s: float  # time busy polling kept the event loop awake (s; performance.busy_poll_us)
    online_judged: int | None  # climbing-fibre learning's judged ticks (None when learning is off)
    online_updates: int | None
    backend: dict[str, Any] | None
    journal_waiting: bool = False  # the journal's next file cannot be created for want of a file descriptor or space
    journal_waits: int = 0  # times that happened
    queue_peak: int = 0  # most ticks queued at once over the last 15 to 30 s (engine.QUEUE_PEAK_WINDOW_S)

    def health(self) -> dict[str, Any]:
        """The engine's part of /health."""
        out: dict[str, Any] = {"pool": self.pool.as_dict(), "queue_depth": self.queue_depth,
                               "queue_capacity": self.queue_capacity, "accepting": self.accepting}
        if self.backend is not None:
            out[str(self.backend.get("backend", "backend"))] = self.backend
        return out
