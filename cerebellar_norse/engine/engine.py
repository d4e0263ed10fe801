"""The engine: per-market ordering, micro-batching and the state pool, on an asyncio loop.

Ticks are submitted from coroutines (HTTP handlers, the stream socket, tests). They
are validated for order against their market (state and pending ticks) on arrival,
queued, and stepped in batches by the backend on the event loop's thread:

* an idle engine flushes on the next loop iteration, so a lone tick is not delayed,
  and ticks that arrived in the same iteration share the batch;
* under load (a batch ended less than ``max_batch_delay_us`` ago) the engine waits up
  to ``max_batch_delay_us`` from the first queued tick, or until ``batch_size`` ticks
  are queued, whichever comes first; event-loop timers have millisecond resolution, so
  a delay under half a millisecond waits one loop iteration instead (what uvloop does
  with such a timer; asyncio would round it up to a whole millisecond);
* the queue holds at most ``queue_size`` ticks; beyond it callers get
  :class:`~cerebellar_norse.errors.CapacityError` (HTTP 503 + Retry-After);
* ticks of one market are applied strictly in arrival order (the backend applies a
  batch in order, and the parallel kernel keeps a market on one thread); a batch with
  more markets than the pool has slots is stepped in parts, so that a market evicted
  to make room is never one whose tick is still in the same backend step;
* a failing batch fails only its own ticks; the engine keeps serving;
* with ``busy_poll_us`` set, the loop keeps polling its sockets instead of sleeping for
  that long after a batch whose first tick came within ``busy_poll_us`` of the batch
  before (:meth:`Engine._poll`): the next tick then finds the CPU awake and its caches
  warm, and ticks that come further apart than that cost no polling at all; polling
  stops while the host has a task waiting for a CPU;
* with ``warm_step_interval_us`` set (the default), while ticks keep coming (for
  ``warm_window_ms`` after each batch) a timer steps the last batch's first tick again,
  on a state slot no market holds, every ``warm_step_interval_us``
  (:meth:`Engine.warm_step`): with milliseconds between ticks the next tick then finds
  the network's code, branch history and weights in the CPU's caches instead of
  starting cold; while the loop polls, its second round after each batch steps one
  too (the batch's own Python evicted them; the client's next tick is due within
  ``busy_poll_us``).

Running the kernel on the loop thread avoids a thread hand-off per tick (tens of µs),
which for single ticks costs more than the kernel (a few µs).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import Config, PerformanceConfig, pool_capacity
from ..errors import (
    CapacityError,
    CerebellarNorseError,
    CheckpointError,
    EngineFatalError,
    ForeignStateDirError,
    ForeignStateError,
    StorageError,
    TickOrderError,
)
from ..neurons.backends import Backend, make_backend
from ..neurons.parameters import encoder_parameters, network_parameters
from ..neurons.state import StateArrays
from ..neurons.topology import Weights, generate_weights
from ..observability.ratelimit import SummaryLog
from ..observability.timelines import Timeline
from ..storage import read_state_file
from ..ticks import Tick, check_order
from ..training.climbing_fibre import OnlineLearner
from .peak import RecentPeak
from .persistence import (
    STATE_FILE,
    PoolSnapshot,
    load_pool,
    quarantine,
    save_pool,
    snapshot_pool,
)
from .pipeline import StepBuffers, step_ticks, tick_results, warm_step
from .pool import Bookkeeping, StatePool
from .recorder import TickRecorder
from .records import BatchRecord, EngineSnapshot, PoolFigures, RecordSink, TickResult
from .runqueue import cpu_wanted
from .selfeval import LiveScorer

if TYPE_CHECKING:
    from .journal import Durability

log = logging.getLogger("cerebellar_norse.engine")

# Shortest delay given to an event-loop timer; shorter waits run on the next loop iteration.
MIN_TIMER_DELAY_S = 0.0005

# The busy-polling round after a batch that steps a warm step (Engine._poll): by the second, the loop has polled its
# sockets at least once since the batch, whether it runs ready callbacks before I/O (asyncio) or after it (uvloop) and
# whether the batch ran from a timer or not, so a tick that came meanwhile is queued and goes first.
WARM_POLL_ROUND = 2


IDLE_EVICTION_S = 300.0  # markets idle this long may be evicted above the pool threshold
EVICTION_LOG_INTERVAL_S = 60.0  # evictions are logged at most once per this interval, with their count
# the warm steps' pause and resumption are logged at most once per this interval (a pool that fills up again after
# every reset, release or idle eviction paused and resumed them each time, two lines each)
WARM_PAUSE_LOG_INTERVAL_S = 60.0
# the queue's high-water mark covers the last 15 to 30 s: every tick admitted between two scrapes 15 s apart (the
# shipped scrape interval) is in one of them
QUEUE_PEAK_WINDOW_S = 15.0
# Busy polling asks whether a task waits for a CPU at most this often (s): the question costs about 1.5 µs of system
# calls, and under load a polling round comes with every turn of the event loop.
CPU_CHECK_S = 50e-6


@dataclass
class EngineStats:
    """Counters of the engine since start (read by the metrics collector)."""

    ticks: int = 0
    batches: int = 0
    failed_batches: int = 0
    failed_ticks: int = 0
    rejected_full: int = 0
    rejected_order: int = 0
    spikes: np.ndarray = field(default_factory=lambda: np.zeros(3, dtype=np.int64))
    last_batch_size: int = 0
    busy_ns: int = 0
    warm_steps: int = 0
    polled_s: float = 0.0  # time busy polling kept the loop awake, windows that ended (s; performance.busy_poll_us)


Settled = Callable[["asyncio.Future[TickResult]"], None]  # called with a tick's future once it is settled
Pending = tuple[Tick, "asyncio.Future[TickResult]", Timeline | None, Settled | None]


class Engine:
    """Micro-batching engine over one backend and one state pool.

    Args:
        cfg: the service configuration.
        weights: model weights (default: generated from the config's seed).
        model_version: reported with every result.
        backend: a backend name (``fused``, ``reference``, ``cuda``; default ``fused``) built by
            :func:`~cerebellar_norse.neurons.backends.make_backend` over the engine's slot arrays.
        backend_options: options of the cuda backend (``device``, ``use_graphs``).
    """

    def __init__(self, cfg: Config, weights: Weights | None = None, model_version: str = "", backend: str | None = None,
                 backend_options: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        perf = cfg.performance
        self.weights = weights if weights is not None else generate_weights(cfg)
        self.params = network_parameters(cfg, float(self.weights.golgi_init))
        self.model_version = model_version or f"seed-{cfg.neural.seed}"
        self.arrays = StateArrays.allocate(pool_capacity(cfg), self.params, cfg.neural.precision,
                                           touch=perf.memory_pool_enabled)
        self.pool = StatePool(self.arrays, self._reset_slot)
        self.backend: Backend = make_backend(backend or "fused", self.weights, self.params, self.arrays,
                                             encoder_parameters(cfg.neural), perf.batch_size, perf.cpu_threads,
                                             {"cfg": cfg, **(backend_options or {})})
        self.batch_size = perf.batch_size
        self.apply_live_settings(perf)
        self._poll_until = 0.0
        self._cpu_check_at = 0.0  # when polling next asks whether a task waits for a CPU (monotonic s)
        self.polling = False  # the loop is kept awake by _poll (performance.busy_poll_us)
        self._poll_started = 0.0  # when the running polling window began (monotonic s)
        self._came_soon = False  # the queued batch's first tick came within busy_poll_us of the batch before
        self._warm_in_rounds = 0  # the poll round this many rounds on steps a warm step (0: none; see _poll)
        self._warm_when_polling = self.backend.fused_step() is not None  # (the fused CPU kernel: see _poll)
        self._warm_until = 0.0
        self._warm_handle: asyncio.TimerHandle | None = None
        self._warm_paused = False  # the last round found every state slot taken
        self._warm_said_paused = False  # what the last line about it said
        self._warm_said_at = -math.inf  # when (monotonic s)
        self._warm_pauses = 0  # pauses since that line
        self.learner = self._make_learner()
        self.scorer = LiveScorer.from_config(cfg, self.pool.capacity) if cfg.training.live_evaluation else None
        self.recorder: TickRecorder | None = None
        self._scratch = False  # stepping warm-up ticks: not learned from, not recorded
        self.journal: Durability | None = None  # set by Durability.recover: applied ticks are journaled before results return
        self.restored_journal_seq: int | None = None  # journal position of the checkpoint restore_state loaded
        self.restored_state_id: str | None = None  # the state dir identity the checkpoint restore_state loaded carries
        self.restore_refused: tuple[CheckpointError, Path] | None = None  # why restore_state moved the file aside, where to
        self.state_id: str | None = None  # this state dir's identity, written into every checkpoint (set by Durability)
        # the stored model of a version (None when not stored or unusable), so that states saved with another model
        # of this network can be restored with it (restore_state); and the model to swap in after that
        self.model_for: Callable[[str], Weights | None] | None = None
        self.swap_after_restore: tuple[Weights, str] | None = None
        self.restore_problem: str | None = None  # why saved market state could not be restored, when it should have
        self.stats = EngineStats()
        self.eviction_log = SummaryLog(log, "evicted least recently used markets", EVICTION_LOG_INTERVAL_S, "evicted")
        self.idle_eviction_log = SummaryLog(log, "evicted idle markets above the pool threshold", EVICTION_LOG_INTERVAL_S,
                                            "evicted")
        self.sinks: list[RecordSink] = []  # called with every backend step's record (metrics, timelines, trackers)
        self._pending: list[Pending] = []
        self._pending_ts: dict[str, int] = {}
        self.queue_peak = RecentPeak(QUEUE_PEAK_WINDOW_S)  # most ticks queued at once lately (noted at each flush)
        self._flush_handle: asyncio.Handle | asyncio.TimerHandle | None = None
        self._last_batch_end = 0.0
        self._last_gc = 0.0
        self._accepting = True
        self.started = time.monotonic()
        self._buf = StepBuffers.allocate(self.backend, self.batch_size, self.arrays.slots)
        self._last_stepped_ns = 0  # when the last backend step ended (perf_counter ns), for request timelines

    # -- state ------------------------------------------------------------------

    def apply_live_settings(self, perf: PerformanceConfig) -> None:
        """Take the ``[performance]`` keys a reload may change: batch delay, queue size, busy polling and warm steps."""
        self.delay_s = perf.max_batch_delay_us / 1e6
        self.queue_size = perf.queue_size
        self.busy_poll_s = perf.busy_poll_us / 1e6
        self.warm_interval_s = perf.warm_step_interval_us / 1e6
        self.warm_window_s = perf.warm_window_ms / 1e3

    def _reset_slot(self, slot: int) -> None:
        self.arrays.reset_slot(slot, self.params, float(self.weights.golgi_init))

    def fingerprint(self) -> dict[str, Any]:
        """What a saved pool must match to be restored into this engine."""
        return {"shape": list(self.params.shape), "seed": self.cfg.neural.seed, "precision": self.cfg.neural.precision,
                "steps_per_tick": self.params.steps_per_tick, "model_version": self.model_version}

    def state_path(self) -> Path:
        """Where the pool is saved on shutdown."""
        return Path(self.cfg.paths.state_dir) / STATE_FILE

    def save_state(self, path: Path | None = None) -> int:
        """Atomically save every live market's state; returns the number saved."""
        self.backend.sync_to_host()
        n = save_pool(self.pool, path or self.state_path(), self.fingerprint(), self.journal.seq if self.journal is not None else 0,
                      self.state_id)
        log.info("saved market state", extra={"fields": {"markets": n, "path": str(path or self.state_path())}})
        return n

    def restore_state(self, path: Path | None = None, state_id: str | None = None) -> int:
        """Load saved market states if present and of this network; returns how many were restored.

        A missing file restores nothing; a corrupt or foreign one is logged and moved aside
        (``<name>.corrupt-<UTC time>``, ``<name>.foreign-<UTC time>``), never overwritten.
        ``state_id``: this state dir's identity; a file written by another state dir is
        foreign (see :func:`~.persistence.load_pool`).
        """
        p = path or self.state_path()
        self.restored_journal_seq = None
        self.restored_state_id = None
        self.restore_refused = None
        if not p.exists() and not p.is_symlink():  # a dangling link or a loop of links is an unreadable file, not none
            return 0
        meta: dict[str, Any] = {}
        data = read_state_file(p, "the market state")  # None: load_pool tries it, fails, and it is moved aside
        try:
            try:
                n = load_pool(self.pool, p, self.fingerprint(), meta, state_id, data)
            except ForeignStateError as exc:
                if not self._use_saved_model(exc):
                    raise
                n = load_pool(self.pool, p, self.fingerprint(), meta, state_id, data)
        except CheckpointError as exc:
            moved = quarantine(p, "foreign" if isinstance(exc, (ForeignStateError, ForeignStateDirError)) else "corrupt")
            self.restore_refused = (exc, moved)
            saved_with = exc.other_model(self.fingerprint()) if isinstance(exc, ForeignStateError) else None
            if saved_with is not None:  # this network, but a model that is gone: say so, and not as "another network"
                self.restore_problem = (f"market state was saved with model {saved_with}, which is not stored or not "
                                        f"usable: every market started from rest (the state was moved aside to {moved}; "
                                        f"restore models/{saved_with} and the file to get it back)")
                log.error("market state not restored: %s", self.restore_problem,
                          extra={"fields": {"path": str(p), "moved_to": str(moved), "saved_with": saved_with}})
                return 0
            log.error("market state not restored: %s; the file was moved aside to %s", exc, moved,
                      extra={"fields": {"path": str(p), "moved_to": str(moved)}})
            return 0
        self.restored_journal_seq = int(meta["journal_seq"])
        self.restored_state_id = meta.get("state_id")
        if n:
            self.backend.sync_from_host()
        log.info("restored market state", extra={"fields": {"markets": n, "path": str(p)}})
        dropped = int(meta.get("not_restored", 0))
        if dropped:
            log.warning("market state: %d of the %d saved markets were not restored: the pool holds "
                        "performance.max_markets = %d; the %d least recently used start from rest (as if evicted); "
                        "raise max_markets and restore the file from a backup to keep them", dropped, n + dropped,
                        self.pool.capacity, dropped,
                        extra={"fields": {"restored": n, "not_restored": dropped, "path": str(p)}})
        return n

    def _use_saved_model(self, exc: ForeignStateError) -> bool:
        """Serve, for now, the model a state file was saved with, when only the model differs and ``model_for`` has
        it; the model meant to be served goes to ``swap_after_restore``. False (nothing changed) otherwise.

        The states, and the journal after them, were computed with that model: restored and replayed with it, they
        are what they were; the model meant to be served is then swapped in as a live swap would be (see
        :meth:`finish_restore`). So a model activated while the service was stopped keeps every market.
        """
        version = exc.other_model(self.fingerprint())
        weights = self.model_for(version) if version is not None and self.model_for is not None else None
        if weights is None or version is None:
            return False
        log.info("market state was saved with model %s: restored with it, then model %s is swapped in", version,
                 self.model_version, extra={"fields": {"saved_with": version, "serving": self.model_version}})
        self.swap_after_restore = (self.weights, self.model_version)
        self._use_model(weights, version)
        return True

    def finish_restore(self, reset_states: bool) -> None:
        """After :meth:`restore_state` (and the journal's replay): swap in the model meant to be served, if the states
        were restored with the model they were saved with (``reset_states`` as for a live swap)."""
        if self.swap_after_restore is not None:
            weights, version = self.swap_after_restore
            self.swap_after_restore = None
            self.set_weights(weights, version, reset_states)

    def snapshot_state(self) -> PoolSnapshot:
        """A copy of every live market's state (call between batches), for a checkpoint written later."""
        self.backend.sync_to_host()
        return snapshot_pool(self.pool)

    def _make_learner(self) -> OnlineLearner | None:
        if not self.cfg.training.online_learning:
            return None
        if self.backend.learning_views() is None:
            log.warning("training.online_learning needs the CPU fused backend; disabled on %s", self.backend.name)
            return None
        return OnlineLearner(self.weights, self.cfg.neural.horizon_ticks, self.cfg.training.flat_band,
                             self.cfg.training.climbing_fibre_rate)

    def _learn(self, ticks: Sequence[Tick], probs: np.ndarray) -> None:
        views = self.backend.learning_views()
        assert self.learner is not None and views is not None
        for j, t in enumerate(ticks):
            self.learner.observe(t.market_id, t.price, probs[j], views.active[j], views.pf_w, views.pf_ptr, views.pf_post,
                                 views.pf_rows)

    def _use_model(self, weights: Weights, model_version: str) -> None:
        self.backend.set_weights(weights)
        self.weights = weights
        self.model_version = model_version
        self.learner = self._make_learner()

    def write_refusal(self) -> CerebellarNorseError | None:
        """Once a journal write has failed, the error refusing any further change of state (a new one per call, the
        failure being logged once); while the journal waits for a file descriptor or disk space for its next file
        (and trying again finds none), the 503 refusing it for now; None while state changes can be made durable (or
        nothing is journaled)."""
        journal = self.journal
        if journal is None:
            return None
        if journal.failed is not None:
            return journal.refusal()
        return journal.resume() if journal.stalled is not None else None

    def set_weights(self, weights: Weights, model_version: str, reset_states: bool = False) -> None:
        """Swap the model between batches (callers on the loop thread: no batch is running).

        With a journal the swap is made durable by a checkpoint; when that fails (full or
        read-only disk, a journal that failed before) the swap is undone, the markets a
        reset released included, and the error raised: the model and the states the
        service saves at shutdown are then those it had, never those of a refused swap.
        The undo also keeps each market's slot and recency (least recently used first, and
        its last-use time, which idle eviction reads) and the online learner with its pending
        predictions and counts, and the synapses it has changed since the model was loaded.
        """
        refused = self.write_refusal()
        if refused is not None:  # the swap could not be made durable: change nothing
            raise refused
        journal = self.journal
        before = (self.weights, self.model_version)
        learner = self.learner
        learned = self._learned_synapses() if journal is not None else None
        kept = self.snapshot_state() if reset_states and journal is not None else None
        bookkeeping = self.pool.table.bookkeeping() if kept is not None else None
        self._use_model(weights, model_version)
        if reset_states:
            table = self.pool.table
            on_release, table.on_release = table.on_release, None  # the swap's checkpoint records the reset
            try:
                for market in table.markets():
                    table.release(market)
            finally:
                table.on_release = on_release
        if journal is None:
            return
        try:  # no journal record is ever replayed under another model
            journal.model_changed()
        except BaseException:
            self._use_model(*before)
            self.learner = learner
            if learned is not None:  # the weights online learning changed since the model was loaded
                views = self.backend.learning_views()
                assert views is not None
                np.copyto(views.pf_w, learned[0])
                np.copyto(views.pf_rows, learned[1])
            if kept is not None and bookkeeping is not None:
                self._put_back(kept, bookkeeping)
            raise

    def _learned_synapses(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Copies of the parallel-fibre weights as online learning left them (CSR and dense rows), to put back when a
        swap is undone (repacking the model's weights would drop what was learned); None without a learner."""
        views = self.backend.learning_views() if self.learner is not None else None
        return None if views is None else (views.pf_w.copy(), views.pf_rows.copy())

    def _put_back(self, kept: PoolSnapshot, bookkeeping: Bookkeeping) -> None:
        """Every market a refused swap's reset released, back in its own slot with its state (``kept``) and its place
        and last-use time in the table (``bookkeeping``, taken with ``kept``)."""
        table = self.pool.table
        table.put_back(bookkeeping)
        for j, market in enumerate(kept.markets):
            slot = table.get(market)
            assert slot is not None  # bookkeeping holds every market of the snapshot
            self.arrays.write_slot(slot, {name: arr[j] for name, arr in kept.arrays.items()})
        if kept.markets:
            self.backend.sync_from_host()

    def reset_market(self, market_id: str) -> bool:
        """Forget one market's state (its next tick starts from rest); False when it holds no state.

        Ticks of the market already queued are applied after the reset, in order. Raises
        the journal's StorageError (nothing changes) once a journal write has failed: the
        reset could not be made durable.
        """
        refused = self.write_refusal()
        if refused is not None:
            raise refused
        if not self.pool.table.release(market_id):
            return False
        if self.learner is not None:
            self.learner.pending.pop(market_id, None)
        if self.scorer is not None:
            self.scorer.forget(market_id)
        log.info("market reset", extra={"fields": {"market_id": market_id}})
        return True

    # -- submission ---------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Ticks waiting for a batch."""
        return len(self._pending)

    def flush_now(self) -> None:
        """Step every queued tick now (on the loop thread, between batches): nothing stays admitted but unapplied.

        The handover calls it after freezing a market, so that the state it exports
        includes every tick of the market that was ever admitted.
        """
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._pending:
            self._flush()

    def _admit(self, ticks: Sequence[Tick], batch: bool) -> None:
        if not self._accepting:
            raise CapacityError("engine is shutting down", retry_after_s=1.0)
        journal = self.journal
        if journal is not None and journal.failed is not None:  # could not be journaled: refused before any change
            raise journal.refusal()  # (inline, not write_refusal(): this runs per request)
        if journal is not None and journal.stalled is not None:  # no descriptor or space for the journal's next file
            refused = journal.resume()
            if refused is not None:
                raise refused
        if len(self._pending) + len(ticks) > self.queue_size:
            self.stats.rejected_full += len(ticks)
            raise CapacityError(f"queue full ({len(self._pending)} of {self.queue_size} ticks waiting)", retry_after_s=max(self.delay_s, 0.001))
        try:
            check_order(ticks, lambda m: self._pending_ts.get(m) or self.pool.last_timestamp(m), batch)
        except TickOrderError:
            self.stats.rejected_order += 1
            raise

    async def submit(self, tick: Tick, timeline: Timeline | None = None) -> TickResult:
        """Process one validated tick; returns its result.

        With a ``timeline``, the engine notes the batch the tick ran in (stages
        ``batch_started``, ``stepped``, ``completed``).
        """
        return await self.submit_nowait(tick, timeline)

    def submit_nowait(self, tick: Tick, timeline: Timeline | None = None,
                      on_settled: Settled | None = None) -> asyncio.Future[TickResult]:
        """:meth:`submit` without waiting: the tick is admitted (or refused, raising, with nothing changed) and queued
        now; the future settles with its result, or the error that refused its batch, once the batch has run.

        ``on_settled(future)`` is then called at once, in the same round of the event loop as the batch (a future's
        done-callbacks run from the loop's next round: answering from one cost every batch another round, several µs
        of CPU per tick under load, docs/http.md). It must not raise (an exception is logged and dropped); it is
        called once, also when the future was cancelled meanwhile."""
        self._admit((tick,), batch=False)
        return self._enqueue(tick, timeline, on_settled)

    async def submit_many(self, ticks: Sequence[Tick], timeline: Timeline | None = None) -> list[TickResult]:
        """Process validated ticks in order; all are admitted (order, capacity) or none is.

        They may run in several steps (``batch_size`` ticks each). When a step is refused unapplied
        (:class:`~cerebellar_norse.errors.CapacityError`: no GPU memory, the journal waiting) after another was applied,
        "try again" no longer holds for the whole: :class:`~cerebellar_norse.errors.EngineFatalError` (outcome partly
        applied) instead.
        """
        if not ticks:
            return []
        self._admit(ticks, batch=True)
        futs = [self._enqueue(t, timeline, None) for t in ticks]
        try:
            return list(await asyncio.gather(*futs))
        except CapacityError as exc:  # (a flush steps every queued batch at once: each future is settled by now)
            applied = sum(f.done() and not f.cancelled() and f.exception() is None for f in futs)
            if not applied:
                raise
            raise EngineFatalError(
                f"{applied} of the {len(ticks)} ticks were applied, the others refused: {exc}; read the markets' "
                "last ticks (GET /debug/markets/{id}/state) before sending the rest again") from exc

    def _enqueue(self, tick: Tick, timeline: Timeline | None, on_settled: Settled | None) -> asyncio.Future[TickResult]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[TickResult] = loop.create_future()
        self._pending.append((tick, fut, timeline, on_settled))
        self._pending_ts[tick.market_id] = tick.timestamp
        since = -1.0  # s since the last batch ended; read once per batch, not per tick
        if len(self._pending) == 1:
            since = time.monotonic() - self._last_batch_end
            self._came_soon = since < self.busy_poll_s
        if len(self._pending) >= self.batch_size:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            self._flush_handle = loop.call_soon(self._flush)
        elif self._flush_handle is None:
            if since < 0.0:
                since = time.monotonic() - self._last_batch_end
            busy = since < self.delay_s
            wait = busy and self.delay_s >= MIN_TIMER_DELAY_S
            self._flush_handle = loop.call_later(self.delay_s, self._flush) if wait else loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._flush_handle = None
        depth = len(self._pending)  # the queue only grows between flushes: this is its most since the last one
        while self._pending:
            batch = self._pending[:self.batch_size]
            del self._pending[:self.batch_size]
            self._run_batch(batch)
        self._pending_ts.clear()
        self._last_batch_end = time.monotonic()
        self.queue_peak.note(depth, self._last_batch_end)
        if self._last_batch_end - self._last_gc >= 1.0:
            self.collect_idle(self._last_batch_end)
        if self.warm_interval_s > 0.0 and self._accepting:
            self._warm_until = self._last_batch_end + self.warm_window_s
            if self._warm_handle is None:
                self._warm_handle = asyncio.get_running_loop().call_later(self.warm_interval_s, self._warm_timer)
        if self._came_soon and self.busy_poll_s > 0.0 and self._accepting:
            self._poll_until = self._last_batch_end + self.busy_poll_s
            self._warm_in_rounds = WARM_POLL_ROUND if self.warm_interval_s > 0.0 and self._warm_when_polling else 0
            if not self.polling:
                self.polling = True
                self._poll_started = self._last_batch_end
                asyncio.get_running_loop().call_soon(self._poll)

    def _poll(self) -> None:
        """Keep the event loop awake until ``busy_poll_us`` after the last batch (``performance.busy_poll_us``).

        Started by a batch whose first tick came within ``busy_poll_us`` of the batch
        before it: a client that comes back that quickly is likely to again, while
        polling for ticks that come further apart would only keep a core busy until the
        window ran out, and the tick would find the CPU idle all the same. Polling stops
        early when a task waits for a CPU (:func:`~cerebellar_norse.engine.runqueue.cpu_wanted`,
        asked at most every ``CPU_CHECK_S``): the client woken by its answer may be the one
        waiting, queued behind this loop.

        While a callback is ready the loop polls its sockets without blocking, so the
        thread never sleeps: a CPU left idle between ticks is given to other work or put
        into a power state that empties its caches, and the next tick's network step
        then takes several times its back-to-back time (docs/benchmarks.md, "In-service
        processing time"). Each round is one non-blocking poll of the sockets.

        With warm steps on (``warm_step_interval_us``), the round :data:`WARM_POLL_ROUND`
        after each batch steps one (:meth:`warm_step`) if polling goes on and no tick is
        queued: the batch's own work (parsing, answering, the socket's system calls)
        evicts the network's code and branch history, and the next tick would otherwise
        find them cold (docs/benchmarks.md, "A warm step after each polled batch"). Only
        where the backend steps the fused CPU kernel (``Backend.fused_step``): a few µs of
        compiled code on this thread; a CUDA step runs on a device whose code the loop's
        Python does not evict, and would hold the loop for a synchronisation.
        """
        now = time.monotonic()
        wanted = False
        if now >= self._cpu_check_at:
            self._cpu_check_at = now + CPU_CHECK_S
            wanted = cpu_wanted()
        if self._accepting and self.busy_poll_s > 0.0 and now < self._poll_until and not wanted:
            if self._warm_in_rounds:
                self._warm_in_rounds -= 1
                if not self._warm_in_rounds and not self._pending and self.warm_interval_s > 0.0:
                    self._warm_round()
            asyncio.get_running_loop().call_soon(self._poll)
        else:
            self.polling = False
            self.stats.polled_s += now - self._poll_started

    def polled_s(self) -> float:
        """Time busy polling has kept the event loop awake since start (s), the running window included."""
        running = time.monotonic() - self._poll_started if self.polling else 0.0
        return self.stats.polled_s + running

    def _warm_timer(self) -> None:
        """One round of ``warm_step_interval_us``: a warm step unless ticks wait, then the next round while the window lasts."""
        self._warm_handle = None
        if not self._accepting or self.warm_interval_s <= 0.0 or time.monotonic() >= self._warm_until:
            return
        if not self._pending and not self._warm_round():  # a queued tick goes first; its flush is already scheduled
            return
        self._warm_handle = asyncio.get_running_loop().call_later(self.warm_interval_s, self._warm_timer)

    def _warm_round(self) -> bool:
        """A warm step, its pause or resumption logged; False when it failed (warm steps are then off)."""
        try:
            stepped = self.warm_step()
        except Exception:  # never worth more than the ticks: stop warming, keep serving
            self.warm_interval_s = 0.0
            log.exception("warm step failed: warm steps are off until the next restart or applied reload")
            return False
        if stepped == self._warm_paused:
            self._warm_paused = not stepped
            self._warm_pauses += not stepped
        self._say_warm_pause()
        return True

    def _say_warm_pause(self) -> None:
        """Log that the warm steps paused or resumed, when that differs from the last line about them and that line
        is at least :data:`WARM_PAUSE_LOG_INTERVAL_S` old; ``pauses`` counts the pauses since it (a pool that keeps
        filling up pauses them at every market reset, release or idle eviction)."""
        if self._warm_paused == self._warm_said_paused:
            return
        now = time.monotonic()
        if now - self._warm_said_at < WARM_PAUSE_LOG_INTERVAL_S:
            return
        log.info("warm steps paused: every state slot holds a market (raise performance.max_markets by one to keep them)"
                 if self._warm_paused else "warm steps resumed: a state slot is free",
                 extra={"fields": {"markets": self.pool.used, "capacity": self.pool.capacity,
                                   "pauses": self._warm_pauses}})
        self._warm_said_paused, self._warm_said_at, self._warm_pauses = self._warm_paused, now, 0

    def warm_step(self) -> bool:
        """Step the last batch's first tick again on a state slot no market holds (call between batches).

        What the CPU's caches hold between ticks milliseconds apart is otherwise lost to
        other work on the host, and the next tick's network step takes about twice its
        back-to-back time (docs/benchmarks.md, "Warm steps"). Nothing a client sees
        changes: the slot is reset before any market is given it, and the step is not
        journaled, learned from, recorded, scored or counted as a tick (only in
        ``stats.warm_steps``). Returns False, stepping nothing, when every slot holds a
        market or no batch has run yet.
        """
        slot = self.pool.table.spare()
        if slot is None or not warm_step(self.backend, self.weights, self.arrays.enc, self._buf, slot):
            return False
        self.stats.warm_steps += 1
        return True

    def collect_idle(self, now: float | None = None) -> int:
        """Above ``garbage_collection_threshold`` pool usage, evict markets idle for over ``IDLE_EVICTION_S``."""
        now = time.monotonic() if now is None else now
        self._last_gc = now
        if self.learner is not None:
            self.learner.retain(set(self.pool.table.markets()))
        if self.scorer is not None:  # markets evicted from the pool are no longer scored
            self.scorer.retain(self.pool.table)
        threshold = self.cfg.performance.garbage_collection_threshold
        keep = int(threshold * self.pool.capacity)
        if self.pool.used <= keep or (self.journal is not None and self.journal.stalled is not None):
            return 0  # (a stalled journal takes no release records: evict later)
        gone = self.pool.table.evict_idle(keep, IDLE_EVICTION_S, now)
        if gone:
            self.idle_eviction_log.add(len(gone), threshold=threshold, markets=self.pool.used, capacity=self.pool.capacity)
        return len(gone)

    def _run_batch(self, batch: list[Pending]) -> None:
        journal = self.journal
        if journal is not None and journal.failed is not None:  # queued before the journal failed: never stepped, so
            self._refuse_batch(batch, journal.refusal)  # a refused tick changes no state (and no later save can keep it)
            return
        if journal is not None and journal.stalled is not None and journal.resume() is not None:
            # queued before the journal stalled: refused unstepped, as at admission
            self._refuse_batch(batch, lambda: journal.refusal() if journal.failed is not None else journal.wait_error())
            return
        ticks = [t for t, _, _, _ in batch]
        started = time.perf_counter_ns()
        ids = [tl.request_id if tl is not None else None for _, _, tl, _ in batch] if self.cfg.debug.record_requests else None
        try:
            results = self.process_now(ticks, ids)
        except Exception as exc:  # one bad batch must not stop the engine
            if isinstance(exc, StorageError):  # logged once by the journal, with path and errno
                err: CerebellarNorseError = exc
            elif isinstance(exc, CapacityError):  # not applied, for want of something the host may have again (GPU
                log.warning("batch of %d ticks refused (503 capacity): %s", len(batch), exc)  # memory): no traceback
                err = exc
            else:
                log.exception("batch of %d ticks failed", len(batch))
                err = EngineFatalError(f"batch failed: {type(exc).__name__}: {exc}")
            self._refuse_batch(batch, lambda: err)
            return
        completed = time.perf_counter_ns()
        stepped, seq, size = self._last_stepped_ns, self.stats.batches, len(batch)
        for (_, fut, tl, _), res in zip(batch, results, strict=True):
            if tl is not None:
                tl.batched(started, stepped, completed, size, seq)
            if not fut.done():
                fut.set_result(res)
        self._tell_settled(batch)

    def _refuse_batch(self, batch: list[Pending], error: Callable[[], BaseException]) -> None:
        """Settle every tick of a batch that was refused or failed with ``error()`` (called per tick), count the batch
        as failed, and tell the ticks' callers."""
        self.stats.failed_batches += 1
        self.stats.failed_ticks += len(batch)
        for _, fut, _, _ in batch:
            if not fut.done():
                fut.set_exception(error())
        self._tell_settled(batch)

    @staticmethod
    def _tell_settled(batch: list[Pending]) -> None:
        """Call the ``on_settled`` of each tick of a batch whose futures are all settled (see :meth:`submit_nowait`);
        one that raises is logged and does not keep the others from being told."""
        for _, fut, _, on_settled in batch:
            if on_settled is not None:
                try:
                    on_settled(fut)
                except Exception:
                    log.exception("a tick's settled callback failed")

    def process_now(self, ticks: Sequence[Tick], request_ids: Sequence[str | None] | None = None) -> list[TickResult]:
        """Step a batch synchronously (at most ``batch_size`` ticks, order already checked).

        ``request_ids`` (one per tick, or None) go into recordings with their ticks.

        A batch with more distinct markets than the pool has slots is stepped in parts,
        each with at most ``capacity`` markets: acquiring a slot for a new market may
        evict (and reset) the least recently used one, which must not be a market whose
        tick sits earlier in the same backend step.
        """
        cap = self.pool.capacity
        if len(ticks) <= cap:
            return self._step(ticks, request_ids)
        out: list[TickResult] = []
        start, seen = 0, set[str]()
        for j, t in enumerate(ticks):
            if t.market_id not in seen and len(seen) == cap:
                out.extend(self._step(ticks[start:j], request_ids[start:j] if request_ids is not None else None))
                start, seen = j, set()
            seen.add(t.market_id)
        out.extend(self._step(ticks[start:], request_ids[start:] if request_ids is not None else None))
        return out

    def _record(self, ticks: Sequence[Tick], probs: np.ndarray | None = None,
                request_ids: Sequence[str | None] | None = None) -> None:
        """Hand applied ticks to the recorder while ``debug.record_requests`` is on (it can change on reload).

        ``probs`` (B, 3), the probabilities served, are recorded with them when given. The
        recorder writes on its own thread; when it falls behind it drops ticks and counts them.
        """
        if self.cfg.debug.record_requests:
            self._open_recorder().record(ticks, probs, self.model_version, request_ids)
        elif self.recorder is not None:
            self.recorder.close(wait=False)
            self.recorder = None

    def close_recording_if_off(self) -> None:
        """Close the recording now when ``debug.record_requests`` was switched off (a reload), so that its file is
        checksummed at once rather than at the next batch (which may never come to an idle service)."""
        if not self.cfg.debug.record_requests and self.recorder is not None:
            self.recorder.close(wait=False)
            self.recorder = None

    def _open_recorder(self) -> TickRecorder:
        """The recorder, started on first use (``debug.record_requests`` can be switched on by a reload)."""
        if self.recorder is None:
            self.recorder = TickRecorder(Path(self.cfg.paths.state_dir) / "recordings")
        return self.recorder

    def _step(self, ticks: Sequence[Tick], request_ids: Sequence[str | None] | None = None) -> list[TickResult]:
        b = len(ticks)
        evictions = self.pool.table.evictions
        if self.cfg.debug.record_requests and not self._scratch:  # where each market starts, before the step changes it
            self._open_recorder().before_step(self.pool, ticks)
        probs, spikes, elapsed = step_ticks(self.pool, self.backend, self.weights, ticks, self._buf)
        self._last_stepped_ns = time.perf_counter_ns()
        evicted = self.pool.table.evictions - evictions
        if evicted:
            self.eviction_log.add(evicted, last=self.pool.table.last_evicted)
        out = tick_results(ticks, self._buf, elapsed, self.cfg.neural.warmup_ticks, self.model_version)
        if not self._scratch:  # warm-up ticks are neither learned from nor recorded
            if self.journal is not None:  # before any result is returned
                self.journal.ticks(ticks)
            if self.learner is not None:
                self._learn(ticks, probs)
            if self.scorer is not None:
                self.scorer.observe_batch(ticks, probs, [r.warming_up for r in out])
            self._record(ticks, probs, request_ids)
        st = self.stats
        st.ticks += b
        st.batches += 1
        st.last_batch_size = b
        st.busy_ns += elapsed
        st.spikes += self._buf.populations
        if self.sinks and not self._scratch:  # scratch ticks (warm-up, journal replay) are not client ticks
            rec = BatchRecord(b, elapsed, self._buf.slots[:b], self._buf.ticks[:, :b], spikes)
            for sink in self.sinks:
                sink(rec)
        return out

    # -- lifecycle ------------------------------------------------------------------

    def warm_up(self) -> None:
        """Run scratch ticks through the batch path (loads every compiled kernel variant), then forget them.

        The scratch ticks all belong to one scratch market in a free slot, so no live
        market (e.g. one just restored) is evicted; with every slot taken the warm-up is
        skipped and the first batch loads the kernels. They are neither recorded
        (``debug.record_requests``) nor learned from (``training.online_learning``).
        """
        if self.pool.used >= self.pool.capacity:
            log.info("warm-up skipped: every market slot is taken")
            return
        name = "\x00warmup"
        stats = self.stats
        self.stats = EngineStats()
        self._scratch = True
        try:
            for _ in range(self.backend.warmup_rounds):
                for n in self.backend.warmup_batch_sizes(self.batch_size):
                    self.process_now([Tick(100.0, 1.0, 1_600_000_000_000, name)] * n)
        finally:
            self.pool.table.release(name)
            self._scratch = False
            self.stats = stats

    async def drain(self, save: bool = True) -> None:
        """Stop accepting, finish every queued tick, then save the pool (if ``save``)."""
        self._accepting = False
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._warm_handle is not None:
            self._warm_handle.cancel()
            self._warm_handle = None
        self._flush()
        await asyncio.sleep(0)
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        self.eviction_log.flush()
        self.idle_eviction_log.flush()
        if self.journal is not None:  # final checkpoint (if save), then the journal it covers is removed
            self.journal.close(save)
        elif save:
            self.save_state()

    def close(self) -> None:
        """Release the backend (device memory); the host state is made current first."""
        self.backend.close()

    def snapshot(self) -> EngineSnapshot:
        """Pool, queue, counters and the backend's description, as of now (call between batches)."""
        st = self.stats
        learner = self.learner
        journal = self.journal
        accepting = self._accepting and (journal is None or journal.failed is None)  # a failed state write refuses all
        return EngineSnapshot(
            pool=PoolFigures(self.pool.used, self.pool.capacity, self.pool.table.evictions, self.arrays.nbytes),
            queue_depth=self.queue_depth, queue_capacity=self.queue_size, accepting=accepting,
            queue_peak=max(self.queue_peak.peak(time.monotonic()), self.queue_depth),
            model_version=self.model_version, ticks=st.ticks, batches=st.batches, failed_batches=st.failed_batches,
            failed_ticks=st.failed_ticks, rejected_full=st.rejected_full, rejected_order=st.rejected_order,
            spikes=(int(st.spikes[0]), int(st.spikes[1]), int(st.spikes[2])), busy_ns=st.busy_ns, warm_steps=st.warm_steps,
            polled_s=self.polled_s(),
            online_judged=learner.judged if learner is not None else None,
            online_updates=learner.updates if learner is not None else None,
            backend=self.backend.describe(),
            journal_waiting=journal is not None and journal.stalled is not None,
            journal_waits=journal.stalls if journal is not None else 0)

    def health(self) -> dict[str, Any]:
        """Pool usage, queue depth and counters for /health (the engine's part)."""
        return self.snapshot().health()
