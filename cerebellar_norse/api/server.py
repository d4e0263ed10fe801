"""Serving: build the engine and app from a config and run them under uvicorn (uvloop + httptools).

Startup: check the host/token rule, pick the device, build the engine, restore the
saved market states, warm the kernel up, then report ready. Shutdown (SIGTERM or
SIGINT, handled by uvicorn): with ``server.drain_s``, a SIGTERM first keeps serving that
long while /health answers 503 and every answer closes its connection (see
:class:`GracefulServer`); then stop accepting, drain queued ticks, save market states.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from ..config import Config
from ..engine.engine import Engine
from ..errors import CheckpointError, ModelUnreadableError, StorageError
from ..neurons.topology import Weights, seed_version_weights
from ..observability import systemd
from ..observability.logging import setup_logging
from ..observability.looplag import watch_loop_lag
from ..observability.metrics import (
    ServiceMetrics,
    connection_families,
    engine_families,
    health_families,
    training_job_families,
    wakeup_families,
)
from ..observability.ratelimit import SummaryLog, installed_alike_limit
from ..training.bootstrap import bootstrap_model
from ..training.checkpoints import NOT_ACTIVATED, ModelStore, StoredModel, shape_mismatch
from ..training.jobs import JobManager
from ..wakeup import WakeupLatency
from .accepting import Acceptor
from .app import ServiceApp, create_app
from .degradation import Degradation
from .deps import ServiceState, current_degradation, journal_wait_reason
from .exposure import check_exposure
from .heap import freeze_startup_heap
from .lifecycle import (
    announce_when_listening,
    check_state_dir,
    file_values_overridden,
    ignore_sighup_while_starting,
    install_sighup,
    periodic_summary,
    prepare_state,
    start_checkpoints,
    stop_engine,
    sweep_alike_lines,
)
from .modelswap import activate_version
from .protocol import DirectRoute, guarded_protocol, websocket_protocol
from .routes import training as training_routes
from .starting import StartingResponder, bind_listener

log = logging.getLogger("cerebellar_norse.server")


def select_device(cfg: Config) -> str:
    """``cpu`` or ``cuda`` for this host; ``cuda`` configured without CUDA is an error, never a fallback."""
    if cfg.performance.device == "cpu":
        return "cpu"
    from ..cuda.device import resolve_device

    return resolve_device(cfg)


def _cuda_memory(device: str) -> Any:
    if device != "cuda":
        return lambda: (0, 0)
    from ..cuda.device import cuda_memory

    return cuda_memory


def build_engine(cfg: Config, device: str, weights: Weights | None, model_version: str) -> Engine:
    """The engine on the chosen device."""
    if device == "cuda":
        from ..cuda.backend import make_cuda_engine

        return make_cuda_engine(cfg, weights, model_version)
    return Engine(cfg, weights, model_version)


def served_model(cfg: Config, store: ModelStore, usable: Callable[[StoredModel], object] | None = None) -> StoredModel | None:
    """The stored model to serve, or None for the untrained network (training one first on a fresh state dir when
    enabled); a stored model for which ``usable`` raises is passed over (see :meth:`ModelStore.load_for_service`).

    A state dir whose models were all refused (a corrupt active model, models of another network size) is no first
    run: a model trained on generated data would be activated over the operator's and served as if it were theirs
    (``status: ok`` after the next restart), so the untrained network is served, degraded, until they act.
    """
    model = store.load_for_service(cfg, usable)
    if model is None and cfg.training.bootstrap_on_first_run and not store.refused:
        model = bootstrap_model(cfg, store)
    if model is None:
        if store.refused:  # models are stored, but none can be served here (each refusal is logged above)
            log.warning("no usable trained model in the state dir (%d stored, each refused: %s): serving the "
                        "untrained network of seed %d", len(store.refused), ", ".join(store.refused), cfg.neural.seed)
        else:
            log.warning("no trained model in the state dir: serving the untrained network of seed %d", cfg.neural.seed)
        return None
    log.info("serving stored model", extra={"fields": {"model_version": model.version, "path": str(model.path)}})
    return model


def stored_weights(cfg: Config, store: ModelStore) -> Callable[[str], Weights | None]:
    """The weights of a stored, valid model of ``cfg``'s network by version (None otherwise; a refusal is logged)."""
    def weights_of(version: str) -> Weights | None:
        if version not in store.versions():
            # seed-<N>, the untrained network served before any model was stored, is regenerated (as replay does), so
            # a state saved while it was served survives a model activated meanwhile; any other version is unknown
            return seed_version_weights(cfg, version)
        try:
            model = store.load(version)
        except ModelUnreadableError as exc:  # the states saved with it are not moved aside for a permission
            raise exc.storage_error() from None
        except CheckpointError as exc:
            log.error("model %s cannot be loaded: %s", version, exc)
            return None
        return None if shape_mismatch(model.neural, cfg.neural) else model.weights

    return weights_of


def last_training_loss(jobs: JobManager, model: StoredModel | None) -> float | None:
    """The training loss known at start: the latest loss of a job (the gauge's value when the service stopped: a job
    that failed before its first step, a bad file, left it alone), else that of the served model's last epoch (nats)."""
    for job in reversed(jobs.jobs.values()):  # oldest first
        if job.loss is not None and math.isfinite(job.loss):
            return job.loss
    history = model.metrics.get("history") if model is not None else None
    last = history[-1].get("train_loss") if isinstance(history, list) and history and isinstance(history[-1], dict) else None
    return float(last) if isinstance(last, (int, float)) and math.isfinite(last) else None


def build_service(cfg: Config, started: float | None = None) -> ServiceState:
    """Engine, metrics, model store and jobs of a service (not yet ready: see :func:`make_app`).

    ``started`` (``time.monotonic()``, s) is when the service started, for ``uptime_s`` and the uptime metric;
    default now.
    """
    started = time.monotonic() if started is None else started
    device = select_device(cfg)
    store = ModelStore(Path(cfg.paths.state_dir))
    built: dict[str, Engine] = {}

    def engine_of(m: StoredModel) -> None:  # a model whose engine cannot be built is not served
        built[m.version] = build_engine(cfg, device, m.weights, m.version)

    model = served_model(cfg, store, engine_of)
    engine = built.get(model.version) if model is not None else None
    if engine is None:  # the untrained network, or a model just trained on first run
        engine = build_engine(cfg, device, model.weights if model else None, model.version if model else "")
    engine.model_for = stored_weights(cfg, store)
    metrics = ServiceMetrics()
    engine.sinks.append(metrics.on_batch)
    metrics.add_source(engine_families(engine, device, _cuda_memory(device), started))
    state = ServiceState(cfg=cfg, engine=engine, metrics=metrics, device=device, started=started)
    state.store = store
    metrics.add_source(health_families(lambda: state.ready and journal_wait_reason(state) is None,
                                       lambda: current_degradation(state) is not None))
    metrics.add_source(connection_families(
        lambda: len(state.server.server_state.connections) if state.server is not None else 0,  # (0: in-process app)
        lambda: min(state.cfg.server.max_connections, state.connection_budget or state.cfg.server.max_connections)))
    if store.fallback is not None:  # the active model could not be served: /health says "degraded"
        level = logging.WARNING if store.fallback == NOT_ACTIVATED else logging.ERROR
        log.log(level, "model fallback: %s; serving model %s instead", store.fallback, engine.model_version)
    untrained = model is None  # nothing trained is served (none stored, or none usable): answers carry no information
    if store.fallback is not None or untrained:
        state.degraded = Degradation(engine.model_version, fallback=store.fallback,
                                     untrained_seed=cfg.neural.seed if untrained else None,
                                     refused=tuple(store.refused) if untrained else ())
    # the jobs read state.cfg when they need it, so what a SIGHUP reload applies holds for them too
    state.jobs = JobManager(lambda: state.cfg, lambda v: activate_version(state, store, v), metrics.training_loss.set,
                            metrics.job_ended)
    jobs = state.jobs
    metrics.add_source(training_job_families(lambda: jobs.stalled))
    metrics.add_source(wakeup_families(lambda: state.wakeup.held, lambda: bool(state.wakeup.refusal)))
    loss = last_training_loss(state.jobs, model)
    if loss is not None:
        metrics.training_loss.set(loss)
    return state


def make_app(state: ServiceState, restore: bool = True, save_on_shutdown: bool = True) -> ServiceApp:
    """The app with a lifespan that restores state, warms up, and drains + saves on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        eng = state.engine
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=state.cfg.server.worker_threads, thread_name_prefix="cerebellar-norse-worker"))
        if restore:
            prepare_state(state)  # done by serve() before the socket opens; here for an app run by other means
        if state.starting is not None:
            state.starting.reason = "warming up the kernels"
        eng.warm_up()  # scratch ticks: no records reach the metrics
        state.ready = True
        state.not_ready_reason = ""
        if state.starting is not None:  # uvicorn serves the socket right after this startup
            state.starting.stop()
        log.info("service ready", extra={"fields": {"model_version": eng.model_version, "device": state.device,
                                                     "markets": eng.pool.used, "host": state.cfg.server.host,
                                                     "port": state.cfg.server.port}})
        server = state.server
        announcer = None
        summary = asyncio.create_task(periodic_summary(state))
        alike = asyncio.create_task(sweep_alike_lines())
        lag_watch = asyncio.create_task(watch_loop_lag(state.metrics.loop_lag))
        checkpoints = start_checkpoints(state)
        if server is not None:
            announcer = asyncio.create_task(announce_when_listening(state, lambda: bool(getattr(server, "started", False))))
            install_sighup(state, state.config_path)
        try:
            yield
        finally:
            systemd.stopping("draining queued ticks and saving market state")
            jobs = state.jobs
            if jobs is not None:
                await jobs.close()
            summary.cancel()
            alike.cancel()
            lag_watch.cancel()
            if checkpoints is not None:
                checkpoints.cancel()
            if announcer is not None:
                announcer.cancel()
            state.ready = False
            state.not_ready_reason = "shutting down"
            server = state.server
            # An instance that never got its socket (e.g. port taken) must not overwrite the saved states.
            served = server is None or bool(getattr(server, "started", False))
            await stop_engine(state, save=save_on_shutdown and served)
            limit = installed_alike_limit()
            if limit is not None:  # the counts of lines held back so far, before the last line
                limit.flush()
            log.info("service stopped", extra={"fields": {"ticks": eng.stats.ticks}})

    return create_app(state, extra_routers=[training_routes.router], lifespan=lifespan)


FD_RESERVE = 64  # descriptors kept for the state dir (journal, checkpoints, models), logs and a training job


def connection_budget(max_connections: int) -> int | None:
    """How many connections the open-file limit leaves room for, after :data:`FD_RESERVE` (None: no limit known).

    The soft ``RLIMIT_NOFILE`` is first raised towards the hard one (as far as ``max_connections`` plus the reserve
    needs). Where it stays below that, one WARNING says so at start: connections beyond the budget are answered
    503 at once instead of taking the descriptors that the next journal segment or checkpoint needs (without a
    descriptor the journal cannot go on and the service would stop).
    """
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    want = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want and (hard == resource.RLIM_INFINITY or hard > soft):
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    if soft == resource.RLIM_INFINITY or soft >= want:
        return None
    budget = max(1, soft - FD_RESERVE)
    log.warning("open-file limit %d leaves room for %d connections, fewer than server.max_connections (%d): "
                "connections beyond %d are answered 503; raise the limit (LimitNOFILE= in the unit, ulimit -n) "
                "or lower server.max_connections", soft, budget, max_connections, budget,
                extra={"fields": {"nofile": soft, "nofile_hard": hard, "max_connections": max_connections,
                                  "connection_budget": budget}})
    return budget


def uvicorn_config(app: FastAPI, cfg: Config, on_timeout: Callable[[str], None] | None = None,
                   on_refused: Callable[[str], None] | None = None, max_open: int | None = None,
                   draining: Callable[[], bool] | None = None, direct: DirectRoute | None = None) -> uvicorn.Config:
    """uvicorn settings from ``[server]`` (uvloop, httptools, no access log on the hot path).

    The protocol is httptools with request deadlines (``server.request_timeout``, see
    :mod:`.protocol`); ``server.max_connections`` is enforced by the app's request
    middleware, which answers with the JSON error shape, ``Retry-After`` and a request id
    (uvicorn's own limit answers plain text). ``draining`` says whether a stop's drain runs (every answer then closes
    its connection). ``direct``: the route the protocol answers itself (the app's ``direct``, see :mod:`.direct`).
    """
    return uvicorn.Config(
        app,
        host=cfg.server.host,
        port=cfg.server.port,
        loop="uvloop",
        http=guarded_protocol(cfg.server.request_timeout, on_timeout, on_refused, max_open, draining, direct),
        ws=websocket_protocol(on_refused),
        ws_max_size=int(cfg.server.max_body_size),  # a stream message is bounded as a request body is (close 1009)
        lifespan="on",
        log_config=None,
        access_log=False,
        proxy_headers=False,  # nothing reads the client address; the rewrite cost µs per request
        # the seconds as configured: uvicorn's settings say int, but it only hands them to call_later and wait_for;
        # truncated, a connection_timeout of 0.5 s left in-flight requests 0.1 s at shutdown (int: 0) before they were
        # cut off, and a keep_alive_timeout of 0.3 s kept idle connections a whole second
        timeout_keep_alive=cfg.server.keep_alive_timeout,  # type: ignore[arg-type]
        timeout_graceful_shutdown=cfg.server.connection_timeout,  # type: ignore[arg-type]
    )


def timeout_counter(state: ServiceState) -> Callable[[str], None]:
    """What the protocol calls per request cut off by ``server.request_timeout``: metrics and an aggregated log line."""
    m = state.metrics
    summary = SummaryLog(log, "requests cut off by server.request_timeout (408)", 60.0, "requests")

    def count(phase: str) -> None:
        m.request_timeouts.labels(phase).inc()
        m.errors.labels("request_timeout").inc()
        summary.add(1, phase=phase)

    return count


def refusal_counter(state: ServiceState) -> Callable[[str], None]:
    """What the protocols call per request or WebSocket handshake they refuse themselves (malformed, headers too
    large): the errors metric."""
    errors = state.metrics.errors
    return lambda kind: errors.labels(kind).inc()


UVICORN_CUT_OFF = "Cancel %s running task(s), timeout graceful shutdown exceeded"  # (its ERROR line, said by ours)


def _not_a_cancellation(record: logging.LogRecord) -> bool:
    """False for uvicorn's ERRORs about the requests it cancels at shutdown (said once by the WARNING of the forced quit
    or of server.connection_timeout instead): a traceback per request, and its own line for the timeout."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, asyncio.CancelledError) and record.msg != UVICORN_CUT_OFF


DRAIN_REASON = ("stopping: draining for {s:g} s (server.drain_s) before the service stops; requests are still "
                "answered, each with Connection: close")


class GracefulServer(uvicorn.Server):
    """uvicorn's server, exiting 0 after a graceful SIGTERM/SIGINT shutdown instead of re-raising the signal.

    With ``server.drain_s`` > 0 (read from ``service``'s running config, so a reload applies it), a SIGTERM to a
    started, ready service first drains (lame duck): for ``drain_s`` seconds the socket still accepts and every request
    is answered as usual, but ``/health`` answers 503 (reason ``stopping: …``, ``cerebellar_norse_ready`` 0) and every
    answer says ``Connection: close`` and closes its connection. A load balancer's health check takes the service out
    and its kept connections are closed by the answers, each after a whole exchange, so that the stop that follows
    finds none on which a request could be on its way. A second SIGTERM, or a SIGINT, ends the drain at once (and
    the stop goes on as without it; a further SIGINT is the forced quit).
    """

    stopped_by: list[int]
    service: ServiceState | None = None
    drain_ends: float | None = None  # time.monotonic() at which the drain begun by a SIGTERM ends
    drain_s = 0.0  # the drain's length, as configured when it began (s)
    drain_said = False  # the drain's start has been logged (not from the signal handler: logging takes locks)
    drain_cut_by: int | None = None  # the signal that ended the drain early

    def handle_exit(self, sig: int, frame: Any) -> None:
        svc = self.service
        drain_s = svc.cfg.server.drain_s if svc is not None else 0.0
        if (svc is not None and sig == signal.SIGTERM and drain_s > 0 and self.drain_ends is None
                and not self.should_exit and self.started and svc.ready):
            self._captured_signals.append(sig)
            self.drain_ends = time.monotonic() + drain_s
            self.drain_s = drain_s
            svc.ready = False
            svc.not_ready_reason = DRAIN_REASON.format(s=drain_s)
            svc.draining = True
            return
        if self.drain_ends is not None and not self.should_exit:
            self.drain_cut_by = sig
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        ends = self.drain_ends
        if ends is not None and not self.drain_said:
            self.drain_said = True
            log.info("stopping: draining for %g s (server.drain_s) before the service stops accepting; /health "
                     "answers 503, every answer closes its connection (a second SIGTERM or a SIGINT ends the drain)",
                     self.drain_s, extra={"fields": {"drain_s": self.drain_s}})
            systemd.stopping(f"stopping: draining for {self.drain_s:g} s (server.drain_s), /health 503")
        if ends is not None and not self.should_exit and time.monotonic() >= ends:
            self.should_exit = True
        return await super().on_tick(counter)

    async def startup(self, sockets: list[Any] | None = None) -> None:
        """uvicorn's startup for the sockets given (the service's own), accepting on them with :class:`.Acceptor`
        instead of the loop's server, whose failed accepts for want of a descriptor spin a core (see
        :mod:`.accepting`)."""
        if not sockets:
            await super().startup(sockets)
            return
        await self.lifespan.startup()
        if self.lifespan.should_exit:  # the app's startup failed (logged): not started, so serve() exits 1
            self.should_exit = True  # (uvicorn's own startup exits with its code 3 instead, outside the exit codes)
            return
        config = self.config

        def create_protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state)

        loop = asyncio.get_running_loop()
        self.servers = [Acceptor(loop, sock, create_protocol).start() for sock in sockets]  # type: ignore[misc]
        self.started = True

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        """uvicorn's shutdown (after the drain, if one ran: its end is logged); after a forced quit (SIGINT while
        draining) too, the requests still running are cancelled here and the app's shutdown (drain, save) runs in
        order, where uvicorn would skip it and leave the save to the cancelled lifespan, each cancellation logged as
        an ERROR traceback."""
        if self.drain_ends is not None:
            left = self.drain_ends - time.monotonic()
            if self.drain_cut_by is not None:
                log.info("drain ended %.1f s early by a second signal (%s): stopping", max(0.0, left),
                         signal.Signals(self.drain_cut_by).name, extra={"fields": {"drain_left_s": round(left, 3)}})
            elif left > 0:
                log.info("drain ended %.1f s early: stopping", left, extra={"fields": {"drain_left_s": round(left, 3)}})
            else:
                log.info("drain over (%g s): stopping", self.drain_s, extra={"fields": {"drain_s": self.drain_s}})
        logging.getLogger("uvicorn.error").addFilter(_not_a_cancellation)  # (each cut-off is said by one WARNING)
        await super().shutdown(sockets)
        if not self.force_exit:
            return
        cut = [t for t in self.server_state.tasks if not t.done()]
        log.warning("forced quit (a second signal while draining): %d request(s) still running are cut off, their ticks "
                    "not acknowledged; the market state is saved", len(cut), extra={"fields": {"requests": len(cut)}})
        for t in cut:
            t.cancel()
        await asyncio.gather(*cut, return_exceptions=True)
        await self.lifespan.shutdown()

    async def _wait_tasks_to_complete(self) -> None:
        """uvicorn's wait for the open connections at shutdown, cancelled once ``server.connection_timeout`` has passed
        (uvicorn then cancels the requests still running): one WARNING says so, as for a forced quit."""
        try:
            await super()._wait_tasks_to_complete()
        except asyncio.CancelledError:
            if not self.force_exit:
                running = sum(1 for t in self.server_state.tasks if not t.done())
                open_now = len(self.server_state.connections)
                log.warning("server.connection_timeout (%g s) passed at shutdown: %d request(s) still running are cut "
                            "off, their ticks not acknowledged, and %d connection(s) still open are dropped; the market "
                            "state is saved", self.config.timeout_graceful_shutdown, running, open_now,
                            extra={"fields": {"requests": running, "connections": open_now}})
            raise

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self.stopped_by = list(self._captured_signals)
                self._captured_signals.clear()


def serve(cfg: Config, config_path: str | None = None, server_overrides: dict[str, Any] | None = None,
          config_data: dict[str, Any] | None = None) -> int:
    """Run the service until SIGTERM/SIGINT (SIGHUP reloads ``config_path``); returns the exit code.

    ``server_overrides`` are the ``[server]`` keys given on the command line (``--host``,
    ``--port``): a reload keeps them over the file's values, as the start did. ``config_data``: the file as read
    to build ``cfg`` (read again when not given).
    """
    setup_logging(cfg.logging)
    ignore_sighup_while_starting()
    check_exposure(cfg)
    lock = check_state_dir(cfg)  # unwritable or in use: start-up fails with one line on stderr, exit code 1
    sock = bind_listener(cfg.server.host, cfg.server.port)  # port taken: the same, before anything else starts
    starting = StartingResponder(sock).start()  # 503 on the port until the app serves it
    wakeup = WakeupLatency()
    wakeup.apply(cfg.performance.cpu_wakeup_latency_us)  # a host that refuses is logged; serving goes on without it
    try:
        starting.reason = "loading the model" + (" (or training one on first run)" if cfg.training.bootstrap_on_first_run else "")
        state = build_service(cfg, starting.started)  # one start time: uptime_s runs on when the app takes over
        state.state_lock = lock
        state.wakeup = wakeup
        starting.reason = "restoring market state"
        prepare_state(state)  # restore + journal replay, before the app serves the socket
    except BaseException as exc:
        starting.stop()
        sock.close()
        wakeup.release()
        if isinstance(exc, OSError):  # e.g. the disk filled up during first-run training: one line, no traceback
            # a full or read-only disk (during first-run training, say) is a failed write; anything else (an
            # unreadable journal directory) is named without claiming one
            doing = "writing failed at" if StorageError.is_write_failure(exc) else "cannot use"
            raise StorageError.from_os_error(f"cannot start: {doing}", exc.filename or cfg.paths.state_dir, exc) from None
        raise
    state.starting = starting
    state.connection_budget = connection_budget(cfg.server.max_connections)
    app = make_app(state)
    server = GracefulServer(uvicorn_config(app, cfg, timeout_counter(state), refusal_counter(state),
                                           state.connection_budget, lambda: state.draining, app.direct))
    server.service = state
    state.server = server
    state.config_path = config_path
    state.server_overrides = dict(server_overrides or {})
    state.file_overridden = file_values_overridden(config_path, cfg, state.server_overrides, config_data)
    try:
        freeze_startup_heap()
        server.run(sockets=[sock])
    finally:
        starting.stop()
        sock.close()
        state.wakeup.release()
    return int(state.exit_code) if server.started else 1
