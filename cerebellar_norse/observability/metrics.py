"""Prometheus metrics.

Names used by the operations guide's alert rules are kept exactly:
``processing_duration_seconds`` (histogram of neural processing time per tick,
buckets from 1 µs with 10 µs an edge), ``cuda_memory_used_bytes``,
``cuda_memory_total_bytes`` (0 on CPU) and ``training_loss``. Everything else is
prefixed ``cerebellar_norse_`` with unit suffixes. The HELP texts of the two latency
histograms say "latency", so the operations guide's ``curl -s …/metrics | grep latency``
finds them.

The per-tick histogram is kept in plain counters updated once per batch (every tick
of a batch has the same amortised time), and exposed by a custom collector at scrape
time, so the hot path pays O(1) per batch instead of one lock per tick.

Bucket edges and the error of ``histogram_quantile``. Prometheus finds the bucket
(a, b] where the cumulative count first reaches the rank q·N and interpolates
linearly inside it. The exact quantile (the smallest observation x with at least q·N
observations ≤ x) lies in the same bucket, so estimate e and exact x both lie in
[a, b], and with r = b/a:

* over-estimate  (e − x)/x ≤ (b − a)/a = r − 1   (worst: x just above a, e = b),
* under-estimate (x − e)/x ≤ (b − a)/b = 1 − 1/r (worst: x = b, e just above a).

Both edge ladders use 13 edges per decade whose consecutive ratios are all ≤ 1.2
(mantissas :data:`LADDER`), so the estimate is within +20 % / −16.7 % of the exact
quantile for any value from 1 µs to 1 ms (``processing_duration_seconds``; 10 µs, the
operations guide's alert threshold, is an exact edge) and from 20 µs to 10 ms
(``cerebellar_norse_http_request_duration_seconds``). 13 edges per decade is the
fewest that keep r ≤ 1.2 (1.2¹² < 10). Outside those ranges the edges are coarse
(processing: 2.5, 5 and 10 ms; requests: 25 ms, 100 ms, 1 s); a quantile below the
first edge is interpolated from 0, one above the last finite edge is reported as that
edge.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from ..engine.records import BatchRecord
    from ..engine.selfeval import LiveScorer

disable_created_metrics()  # *_created series only add noise for operators

LADDER = ("1", "1.2", "1.42", "1.7", "2.04", "2.44", "2.92", "3.5", "4.2", "5", "6", "7", "8.4")
"""Mantissas of one decade of bucket edges: consecutive ratios 1.17–1.2, including 8.4 → 10."""


def ladder(first_exp: int, last_exp: int) -> tuple[float, ...]:
    """The :data:`LADDER` edges of the decades 10**first_exp … 10**last_exp (seconds), written as decimals.

    Built from decimal text (``float("1.42e-6")``), so each edge prints as written in
    its ``le`` label.
    """
    return tuple(float(f"{m}e{e}") for e in range(first_exp, last_exp + 1) for m in LADDER)


# 1 µs … 1 ms at ratio ≤ 1.2 (40 edges), then 2.5, 5, 10 ms: 43 edges
PROCESSING_BUCKETS = (*ladder(-6, -4), 1e-3, 2.5e-3, 5e-3, 1e-2)
# 17 µs (the edge below 20 µs) … 10 ms at ratio ≤ 1.2 (37 edges), then 25 ms, 100 ms, 1 s: 40 edges
REQUEST_BUCKETS = (*(b for b in ladder(-5, -3) if b >= 1.7e-5), 1e-2, 2.5e-2, 0.1, 1.0)
LOOP_LAG_INTERVAL_S = 0.25  # seconds between the event-loop lag watch's timers (observability.looplag)
# 1 ms (a timer's usual lateness) … a minute (a process stopped for that long)
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
POPULATIONS = ("granule", "purkinje", "dcn")
# Error kinds of the 5xx answers (capacity, engine, market_moving: 503; internal: 500), exported at 0 from the start:
# a series that first appears with 1 hides that first error from rate() and increase().
SERVER_ERROR_KINDS = ("capacity", "engine", "market_moving", "internal")
JOB_END_STATES = ("succeeded", "failed", "cancelled")


class TickHistogram:
    """A histogram whose observations come in groups of equal values (a batch), in plain counters.

    Updated from the event loop only; read at scrape time (a scrape on another thread may
    see one observation's bucket before its sum, never a torn count).
    """

    def __init__(self, buckets: Iterable[float]) -> None:
        self.bounds = list(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe_many(self, value: float, n: int) -> None:
        """Record ``n`` observations of ``value``."""
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n

    def cumulative(self) -> list[tuple[str, float]]:
        """The cumulative ``(le, count)`` buckets, ``+Inf`` last."""
        cum = list(itertools.accumulate(self.counts))
        buckets = [(_fmt(b), float(c)) for b, c in zip(self.bounds, cum[:-1], strict=True)]
        buckets.append(("+Inf", float(cum[-1])))
        return buckets

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        """Cumulative buckets as a Prometheus histogram family."""
        return HistogramMetricFamily(name, doc, buckets=self.cumulative(), sum_value=self.sum)


class RequestCounts:
    """Answered HTTP requests by (route, method, status), and their latency (s) by route, in plain counters.

    prometheus_client's ``Counter`` and ``Histogram`` take a lock per update and the
    histogram scans its edges one by one: several µs of every tick's request. These are
    updated from the event loop only and turned into metric families at scrape time.
    """

    def __init__(self, buckets: Iterable[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts: dict[tuple[str, str, int], int] = {}
        self.latency: dict[str, TickHistogram] = {}

    def add(self, route: str, method: str, status: int, seconds: float) -> None:
        """One answered request."""
        key = (route, method, status)
        self.counts[key] = self.counts.get(key, 0) + 1
        hist = self.latency.get(route)
        if hist is None:
            hist = self.latency[route] = TickHistogram(self.buckets)
        hist.observe_many(seconds, 1)

    def families(self) -> Iterable[Metric]:
        """``cerebellar_norse_http_requests_total`` and ``cerebellar_norse_http_request_duration_seconds``."""
        total = CounterMetricFamily("cerebellar_norse_http_requests", "HTTP requests by route, method and status.",
                                    labels=["route", "method", "status"])
        for (route, method, status), n in list(self.counts.items()):
            total.add_metric([route, method, str(status)], float(n))
        yield total
        latency = HistogramMetricFamily("cerebellar_norse_http_request_duration_seconds",
                                        "HTTP request latency (handling time) by route.", labels=["route"])
        for route, hist in list(self.latency.items()):
            latency.add_metric([route], hist.cumulative(), hist.sum)
        yield latency


def _fmt(b: float) -> str:
    return repr(float(b))


LATENCY_QUANTILES = (0.5, 0.95, 0.99)


class RecentLatency:
    """Per-tick latencies of the last ``size`` batches (value, ticks), for quantile gauges and log summaries."""

    def __init__(self, size: int = 4096) -> None:
        self.values = np.zeros(size)
        self.weights = np.zeros(size)
        self.added = 0  # batches recorded since start; the latest is in slot (added - 1) % size

    def add(self, value: float, count: int) -> None:
        """Record a batch whose ``count`` ticks took ``value`` seconds each."""
        i = self.added % self.values.shape[0]
        self.values[i] = value
        self.weights[i] = count
        self.added += 1

    def quantiles(self, qs: Iterable[float], since: int | None = None) -> dict[float, float]:
        """Tick-weighted quantiles over the batches kept, or over those recorded after the first ``since`` (of
        :attr:`added`; the last ``size`` of them when more); NaN without a batch."""
        kept = min(self.added, self.values.shape[0])
        n = kept if since is None else min(kept, max(self.added - since, 0))
        if n == 0:
            return dict.fromkeys(qs, math.nan)
        idx = (self.added - n + np.arange(n)) % self.values.shape[0]  # the last n recorded
        v, w = self.values[idx], self.weights[idx]
        order = np.argsort(v)
        cum = np.cumsum(w[order])
        total = cum[-1]
        return {q: float(v[order][min(int(np.searchsorted(cum, q * total)), n - 1)]) for q in qs}


class LatestValue:
    """A gauge's value that is unknown until first set: exposed without a sample until then, never as 0."""

    def __init__(self) -> None:
        self.value: float | None = None

    def set(self, value: float) -> None:
        """The latest value."""
        self.value = float(value)

    def family(self, name: str, documentation: str) -> GaugeMetricFamily:
        """The gauge, with its one sample when a value is known."""
        fam = GaugeMetricFamily(name, documentation)
        if self.value is not None:
            fam.add_metric([], self.value)
        return fam


class ServiceMetrics:
    """All metrics of one service instance, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.processing = TickHistogram(PROCESSING_BUCKETS)
        self.recent = RecentLatency()
        self.batch_sizes = TickHistogram(BATCH_BUCKETS)
        self.requests = RequestCounts(REQUEST_BUCKETS)
        self.loop_lag = TickHistogram(LOOP_LAG_BUCKETS)  # observed by observability.looplag
        self.errors = Counter("cerebellar_norse_errors_total", "Errors by kind (the error.type of the answer: validation, "
                              "malformed_json, out_of_order, future_timestamp, capacity, unauthorized, request_timeout, ...).",
                              ["kind"], registry=r)
        self.request_timeouts = Counter("cerebellar_norse_http_request_timeouts_total",
                                        "Requests cut off by server.request_timeout (408), by the part still missing "
                                        "(headers or body).", ["phase"], registry=r)
        for kind in SERVER_ERROR_KINDS:
            self.errors.labels(kind)
        self.training_jobs = Counter("cerebellar_norse_training_jobs_total", "Training jobs ended, by final state "
                                     "(succeeded, failed, cancelled); a job left running by a stopped service is "
                                     "counted failed at the next start.", ["state"], registry=r)
        for state in JOB_END_STATES:
            self.training_jobs.labels(state)
        self.training_loss = LatestValue()
        self.stream_connections = Gauge("cerebellar_norse_stream_connections", "Open /neural/stream websockets.", registry=r)
        self._sources: list[Callable[[], Iterable[Metric]]] = []
        r.register(_CallbackCollector(self))

    def count_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """One answered HTTP request: counted by route, method and status, its latency (s) by route."""
        self.requests.add(route, method, status, seconds)

    def job_ended(self, state: str) -> None:
        """A training job ended in ``state`` (succeeded, failed or cancelled)."""
        self.training_jobs.labels(state).inc()

    def on_batch(self, rec: BatchRecord) -> None:
        """Engine sink: one backend step of ``rec.size`` ticks took ``rec.step_ns``."""
        per_tick = rec.per_tick_s
        self.processing.observe_many(per_tick, rec.size)
        self.batch_sizes.observe_many(float(rec.size), 1)
        self.recent.add(per_tick, rec.size)

    def add_source(self, source: Callable[[], Iterable[Metric]]) -> None:
        """Register a callable yielding metric families at scrape time."""
        self._sources.append(source)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


class _CallbackCollector(Collector):
    def __init__(self, m: ServiceMetrics) -> None:
        self.m = m

    def collect(self) -> Iterable[Metric]:
        yield self.m.processing.family("processing_duration_seconds", "Neural processing latency per tick (s), batch time amortised over its ticks.")
        yield self.m.batch_sizes.family("cerebellar_norse_batch_size_ticks", "Ticks per engine batch.")
        yield from self.m.requests.families()
        yield self.m.loop_lag.family("cerebellar_norse_event_loop_lag_seconds", "How late the event loop ran a timer "
                                     f"due every {LOOP_LAG_INTERVAL_S} s (s): a stall (process stopped or starved of CPU) shows here, "
                                     "not in the request latencies.")
        # A summary: quantiles over a recent window, _sum and _count since start (those of the histogram above);
        # a gauge with a quantile label is what promtool's lint refuses.
        name = "cerebellar_norse_processing_latency_seconds"
        lat = SummaryMetricFamily(name, "Neural processing latency per tick (s): quantiles over the last 4096 batches, "
                                        "sum and count over all ticks since start.")
        for q, v in self.m.recent.quantiles(LATENCY_QUANTILES).items():
            lat.add_sample(name, {"quantile": repr(q)}, v)
        hist = self.m.processing
        lat.add_metric([], count_value=sum(hist.counts), sum_value=hist.sum)
        yield lat
        yield self.m.training_loss.family("training_loss", "Latest training loss (cross-entropy, nats) of the running or "
                                          "last job, or of the served model's training; no sample before any is known.")
        for source in self.m._sources:
            yield from source()


READY_HELP = ("1 while GET /health answers 200 (ok or degraded), 0 while it answers 503 (starting, shutting down, "
              "a state write failed, the journal waiting for a file descriptor or disk space).")
UPTIME_HELP = "Seconds since the service started."


def starting_exposition(uptime_s: float) -> bytes:
    """What ``GET /metrics`` answers while the service starts (text format): ready 0 and the uptime (s).

    The scrape succeeds (``up`` is 1: the process runs), and ``cerebellar_norse_ready`` says
    it does not serve yet; every other metric appears once it does.
    """

    class Starting:
        def collect(self) -> Iterable[Metric]:
            yield GaugeMetricFamily("cerebellar_norse_ready", READY_HELP, value=0.0)
            yield GaugeMetricFamily("cerebellar_norse_uptime_seconds", UPTIME_HELP, value=uptime_s)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Starting())
    return generate_latest(registry)


def health_families(ready: Callable[[], bool], degraded: Callable[[], bool]) -> Callable[[], Iterable[Metric]]:
    """Scrape-time gauges of what ``GET /health`` answers: ``ready()`` (200, ``ok`` or ``degraded``) and
    ``degraded()`` (200 ``degraded``: a fallback, the untrained network or lost market states served)."""

    def collect() -> Iterable[Metric]:
        is_ready = ready()
        yield GaugeMetricFamily("cerebellar_norse_ready", READY_HELP, value=float(is_ready))
        yield GaugeMetricFamily("cerebellar_norse_degraded", "1 while GET /health answers \"degraded\" (a fallback "
                                "model, the untrained network or lost market states served; its reason says which).",
                                value=float(is_ready and degraded()))

    return collect


def training_job_families(stalled: Callable[[], bool]) -> Callable[[], Iterable[Metric]]:
    """Scrape-time gauge of whether the running training job is stalled (``stalled()``: no progress and no CPU time
    for ``training.stall_warning_s``, :mod:`cerebellar_norse.training.stall`)."""

    def collect() -> Iterable[Metric]:
        yield GaugeMetricFamily("cerebellar_norse_training_job_stalled", "1 while the running training job has "
                                "reported no progress and its process used no CPU time for training.stall_warning_s "
                                "(stopped, frozen or hung: every new job is refused 409 meanwhile); 0 otherwise.",
                                value=float(stalled()))

    return collect


def wakeup_families(held: Callable[[], bool], refused: Callable[[], bool]) -> Callable[[], Iterable[Metric]]:
    """Scrape-time gauges of the service's CPU wake-up latency limit (``performance.cpu_wakeup_latency_us``,
    :mod:`cerebellar_norse.wakeup`): whether it is held (``held()``), and whether the key is set and the host refused
    it (``refused()``)."""

    def collect() -> Iterable[Metric]:
        # the helps name no "latency": the operations guide's `grep latency` of a scrape finds the tick latencies only
        yield GaugeMetricFamily("cerebellar_norse_cpu_wakeup_limit_held", "1 while the service holds its limit on how "
                                "long the host's idle CPUs take to wake up (docs/install.md, CPU wake-up); 0 when none "
                                "is configured, or the host refused it (see cerebellar_norse_cpu_wakeup_limit_refused).",
                                value=float(held()))
        yield GaugeMetricFamily("cerebellar_norse_cpu_wakeup_limit_refused", "1 while the service's CPU wake-up limit "
                                "is configured and the host refused it (no device, no permission: logged at WARNING with the "
                                "reason and the fix), so the service serves without it; 0 otherwise.",
                                value=float(refused()))

    return collect


def connection_families(open_connections: Callable[[], int],
                        limit: Callable[[], int]) -> Callable[[], Iterable[Metric]]:
    """Scrape-time gauges of the server's open connections (``open_connections()``: HTTP keep-alive and WebSocket
    sockets, the scrape's own included) and of the limit (``limit()``: ``server.max_connections``, or the fewer
    connections the open-file limit leaves room for), beyond which a connection's requests are answered 503
    ``capacity``."""

    def collect() -> Iterable[Metric]:
        yield GaugeMetricFamily("cerebellar_norse_http_connections", "Open client connections (HTTP keep-alive and "
                                "/neural/stream websockets, the scrape's own included).", value=open_connections())
        yield GaugeMetricFamily("cerebellar_norse_http_connections_limit", "Connections beyond which a new one's "
                                "requests are answered 503 capacity: server.max_connections, or fewer where the "
                                "open-file limit leaves room for fewer (logged at start).", value=limit())

    return collect


def engine_families(engine: Engine, device: str, cuda_memory: Callable[[], tuple[int, int]],
                    started: float | None = None) -> Callable[[], Iterable[Metric]]:
    """Scrape-time metric families of an engine, read from its snapshot (pool, queue, counters, model) and CUDA memory;
    uptime counts from ``started`` (``time.monotonic()``, s; default now)."""
    started = time.monotonic() if started is None else started

    def collect() -> Iterable[Metric]:
        snap = engine.snapshot()
        used, total = cuda_memory()
        yield GaugeMetricFamily("cuda_memory_used_bytes", "CUDA memory in use on the device, by every process, as the "
                                "driver (and nvidia-smi) reports it (bytes; 0 on CPU).", value=used)
        yield GaugeMetricFamily("cuda_memory_total_bytes", "CUDA memory of the device (bytes; 0 on CPU).", value=total)
        yield CounterMetricFamily("cerebellar_norse_ticks", "Ticks processed.", value=snap.ticks)
        yield CounterMetricFamily("cerebellar_norse_batches", "Engine batches run.", value=snap.batches)
        yield CounterMetricFamily("cerebellar_norse_failed_batches", "Engine batches that failed.", value=snap.failed_batches)
        rej = CounterMetricFamily("cerebellar_norse_rejected_ticks", "Ticks refused before processing, by reason.", labels=["reason"])
        rej.add_metric(["queue_full"], snap.rejected_full)
        rej.add_metric(["out_of_order"], snap.rejected_order)
        yield rej
        spk = CounterMetricFamily("cerebellar_norse_spikes", "Spikes emitted, by population.", labels=["population"])
        for pop, n in zip(POPULATIONS, snap.spikes, strict=True):
            spk.add_metric([pop], float(n))
        yield spk
        yield GaugeMetricFamily("cerebellar_norse_queue_depth_ticks", "Ticks waiting for a batch.", value=snap.queue_depth)
        yield GaugeMetricFamily("cerebellar_norse_queue_capacity_ticks", "Queue capacity (ticks).", value=snap.queue_capacity)
        yield GaugeMetricFamily("cerebellar_norse_queue_peak_ticks", "Most ticks waiting for a batch at once over the last "
                                "15 to 30 s: ticks wait only until the event loop's next turn, so the depth at the "
                                "moment of a scrape is nearly always 0 even while ticks are refused for want of room.",
                                value=snap.queue_peak)
        pool = snap.pool
        yield GaugeMetricFamily("cerebellar_norse_pool_markets", "Markets holding a state slot.", value=pool.markets)
        yield GaugeMetricFamily("cerebellar_norse_pool_capacity_markets", "State slots.", value=pool.capacity)
        yield GaugeMetricFamily("cerebellar_norse_pool_usage_ratio", "Fraction of state slots in use.", value=pool.usage)
        yield GaugeMetricFamily("cerebellar_norse_pool_bytes", "Memory of the state pool (bytes).", value=pool.bytes)
        yield CounterMetricFamily("cerebellar_norse_pool_evictions", "Markets evicted (least recently used).", value=pool.evictions)
        yield CounterMetricFamily("cerebellar_norse_engine_busy_seconds", "Time spent stepping batches (s).", value=snap.busy_ns / 1e9)
        yield CounterMetricFamily("cerebellar_norse_warm_steps", "Scratch steps between batches keeping the network in cache "
                                  "(performance.warm_step_interval_us); not ticks.", value=snap.warm_steps)
        yield CounterMetricFamily("cerebellar_norse_busy_poll_seconds", "Time the event loop was kept from sleeping by "
                                  "busy polling for a client's next tick (performance.busy_poll_us; s), ticks served "
                                  "meanwhile included: at most that much CPU time.", value=snap.polled_s)
        yield GaugeMetricFamily("cerebellar_norse_uptime_seconds", UPTIME_HELP, value=time.monotonic() - started)
        yield GaugeMetricFamily("cerebellar_norse_journal_waiting", "1 while the journal's next file cannot be created "
                                "for want of a file descriptor (EMFILE, ENFILE) or disk space (ENOSPC, EDQUOT): ticks, "
                                "market resets, model activations and imports are refused with 503.", value=float(snap.journal_waiting))
        yield CounterMetricFamily("cerebellar_norse_journal_waits", "Times a full journal file's next one could not be "
                                  "created for want of a file descriptor or disk space.", value=snap.journal_waits)
        if snap.online_judged is not None and snap.online_updates is not None:
            yield CounterMetricFamily("cerebellar_norse_online_judged_ticks", "Ticks judged after their horizon by climbing-fibre learning.",
                                      value=snap.online_judged)
            yield CounterMetricFamily("cerebellar_norse_online_updates", "Climbing-fibre weight updates (wrong predictions).",
                                      value=snap.online_updates)
        info = GaugeMetricFamily("cerebellar_norse_model_info", "Active model (value 1).", labels=["model_version", "device"])
        info.add_metric([snap.model_version, device], 1.0)
        yield info
        if engine.scorer is not None:
            yield from live_evaluation_families(engine.scorer)

    return collect


LIVE_GAUGES = (  # (name, HELP, side, figure) of the rolling-window figures of all markets together
    ("cerebellar_norse_live_directional_accuracy_ratio",
     "Live directional accuracy of the served signal over the rolling window (ticks labelled up or down; a tie counts 0.5).",
     "model", "directional_accuracy"),
    ("cerebellar_norse_live_base_rate_directional_accuracy_ratio",
     "Directional accuracy of the causal base rate (always the more frequent of up/down so far) over the same window.",
     "base_rate", "directional_accuracy"),
    ("cerebellar_norse_live_direction_log_loss",
     "Live direction log loss (binary, nats) of P(up)/(P(up)+P(down)) over the rolling window's up/down ticks.",
     "model", "direction_log_loss"),
    ("cerebellar_norse_live_base_rate_direction_log_loss",
     "Direction log loss (binary, nats) of the causal base rate over the same window.",
     "base_rate", "direction_log_loss"),
    ("cerebellar_norse_live_log_loss", "Live 3-class log loss (nats) of the served probabilities over the rolling window.",
     "model", "log_loss"),
    ("cerebellar_norse_live_base_rate_log_loss", "3-class log loss (nats) of the causal base rate over the same window.",
     "base_rate", "log_loss"),
)


def live_evaluation_families(scorer: LiveScorer) -> Iterable[Metric]:
    """Live self-evaluation of all markets together (per market only in /neural/metrics: label cardinality).

    A gauge without a defined value (empty window) has no sample rather than NaN.
    """
    window, total = scorer.overall()
    for name, doc, side, figure in LIVE_GAUGES:
        fam = GaugeMetricFamily(name, doc)
        value = window[side][figure]
        if value is not None:
            fam.add_metric([], value)
        yield fam
    yield GaugeMetricFamily("cerebellar_norse_live_window_ticks", "Judged ticks in the live evaluation's rolling window.",
                            value=window["judged"])
    yield CounterMetricFamily("cerebellar_norse_live_judged_ticks", "Served predictions judged after their horizon (all markets).",
                              value=total["judged"])


def finite_or_nan(x: float) -> float:
    """``x`` when finite, else NaN (Prometheus accepts NaN)."""
    return x if math.isfinite(x) else math.nan
