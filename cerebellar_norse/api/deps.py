"""Shared pieces of the routes: the service state, the bearer-token check, JSON-only routes, tick checks."""

from __future__ import annotations

import contextlib
import hmac
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Request, Response, Security
from fastapi.exceptions import HTTPException
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..config import Config
from ..engine.engine import Engine
from ..engine.handover import MarketMoves
from ..errors import CerebellarNorseError, EngineFatalError, InputError
from ..observability.metrics import ServiceMetrics
from ..observability.timelines import TimelineBook
from ..ticks import Tick, check_not_future
from ..wakeup import WakeupLatency
from .degradation import Degradation, reason
from .schemas import loads_utf8

if TYPE_CHECKING:
    import uvicorn

    from ..engine.journal import Durability
    from ..engine.state_dir import StateDirLock
    from ..training.checkpoints import ModelStore
    from ..training.jobs import JobManager
    from .starting import StartingResponder

# Keys this service adds to the ASGI scope of an HTTP request.
SCOPE_ROUTE = "cerebellar_norse.route"  # route label of the request metrics (set by the hot path)
SCOPE_REQUEST_ID = "cerebellar_norse.request_id"  # the request id, for answers written below the app (408)
SCOPE_TIMED_OUT = "cerebellar_norse.timed_out"  # set when the protocol answered the request 408
SCOPE_TIMELINE = "cerebellar_norse.timeline"  # the request's Timeline (tick routes only)


class AuthError(CerebellarNorseError):
    """Missing or wrong bearer token (HTTP 401)."""


@dataclass
class ServiceState:
    """Everything the routes need, attached to ``app.state.service``.

    Filled in by :func:`~cerebellar_norse.api.server.build_service` (engine, metrics,
    store, jobs), :func:`~cerebellar_norse.api.server.serve` (server, config path, state
    lock) and the lifecycle (durability, exit code).
    """

    cfg: Config
    engine: Engine
    metrics: ServiceMetrics
    device: str
    ready: bool = False
    not_ready_reason: str = "starting"
    started: float = field(default_factory=time.monotonic)
    store: ModelStore | None = None
    jobs: JobManager | None = None
    degraded: Degradation | None = None  # why the model served is degraded (/health), while it is served
    server: uvicorn.Server | None = None
    starting: StartingResponder | None = None  # answers 503 on the port until uvicorn serves it (serve() only)
    config_path: str | None = None  # the TOML file a SIGHUP reloads (None: the built-in default)
    server_overrides: dict[str, Any] = field(default_factory=dict)  # --host/--port: kept over the file on reload
    need_restart: list[str] = field(default_factory=list)  # keys the file, as last reloaded, changes for a restart only
    # the file's values of the keys CEREBELLAR_NORSE_<SECTION>__<KEY> variables override, as last read (start, reload)
    file_overridden: dict[str, Any] = field(default_factory=dict)
    # connections the open-file limit leaves room for (serve(): server.connection_budget; None: no lower bound than
    # server.max_connections); beyond it a connection is answered 503 as beyond max_connections
    connection_budget: int | None = None
    state_lock: StateDirLock | None = None
    state_prepared: bool = False
    durability: Durability | None = None
    exit_code: int = 0
    draining: bool = False  # a stop's drain (server.drain_s) runs: /health 503, every answer closes its connection
    timelines: TimelineBook = field(default_factory=TimelineBook)
    trackers: dict[str, Any] = field(default_factory=dict)  # debug sinks attached on first use (spike tracker, trace)
    wakeup: WakeupLatency = field(default_factory=WakeupLatency)  # performance.cpu_wakeup_latency_us, held by serve()

    def model_store(self) -> ModelStore:
        """The service's model store (EngineFatalError, 503, in an app built without one)."""
        if self.store is None:
            raise EngineFatalError("this service has no model store")
        return self.store

    def job_manager(self) -> JobManager:
        """The service's training jobs (EngineFatalError, 503, in an app built without them)."""
        if self.jobs is None:
            raise EngineFatalError("this service runs no training jobs")
        return self.jobs
    moves: MarketMoves = field(default_factory=MarketMoves)  # markets refused while their state moves (scale-out)


def check_ticks(svc: ServiceState, ticks: Sequence[Tick], batch: bool, market_header: str | None = None,
                routed_by: str = "X-Market-ID header") -> None:
    """The service's checks of client ticks before the engine (HTTP and stream alike).

    A tick more than ``server.max_clock_skew_ms`` ahead of the server clock is refused
    (FutureTickError, 409); a batch larger than the engine queue could never be
    admitted, so it is refused as invalid (422 naming ``ticks``) instead of 503. With
    an ``X-Market-ID`` header (``market_header``: the load balancer routed the request
    by it) every tick must be of that market (422 naming ``market_id``). A tick of a
    market whose state is moving between replicas gets 503 + Retry-After.
    """
    if batch and len(ticks) > svc.engine.queue_size:
        raise InputError(f"a batch of {len(ticks)} ticks can never fit the engine queue (performance.queue_size = "
                         f"{svc.engine.queue_size} ticks): send at most {svc.engine.queue_size} ticks per batch", "ticks")
    if market_header is not None:
        check_market_header(ticks, market_header, batch, routed_by)
    check_not_future(ticks, time.time_ns() // 1_000_000, svc.cfg.server.max_clock_skew_ms, batch)
    if svc.moves:
        svc.moves.check(ticks)


def check_market_header(ticks: Sequence[Tick], market_header: str, batch: bool,
                        routed_by: str = "X-Market-ID header") -> None:
    """Raise InputError unless every tick is of the market named by the ``X-Market-ID`` header.

    HAProxy routes a request by that header; a tick of another market would reach a
    replica that may not hold its state (split such batches per market). ``routed_by`` names where the
    market came from in the message (a stream opened without the header is routed by ``?market_id=``).
    """
    for j, t in enumerate(ticks):
        if t.market_id != market_header:
            where = f"ticks.{j}.market_id" if batch else "market_id"
            raise InputError(f"market {t.market_id!r} differs from the {routed_by} {market_header!r} the request "
                             f"was routed by (send one market per request, or split the batch per market)", where)


def service(request: Request) -> ServiceState:
    """The service state of the app serving ``request``."""
    svc: ServiceState = request.app.state.service
    return svc


def configured_token(cfg: Config) -> bytes | None:
    """The configured bearer token, or None when there is none (an empty or blank token is none)."""
    token = cfg.server.api_token
    if token is None:
        return None
    value = token.get_secret_value().strip()
    return value.encode() if value else None


def check_token(cfg: Config, authorization: str | None) -> None:
    """Raise AuthError unless ``Authorization: Bearer <token>`` matches (when a token is configured).

    The comparison takes constant time (``hmac.compare_digest``); an empty credential
    never matches.
    """
    expected = configured_token(cfg)
    if expected is None:
        return
    scheme, _, given = (authorization or "").strip().partition(" ")
    credential = given.strip().encode("latin-1", "replace")  # header values arrive latin-1 decoded: these are the raw bytes
    ok = hmac.compare_digest(credential, expected)  # always run, so timing does not tell which test failed
    if not (scheme.lower() == "bearer" and credential and ok):
        raise AuthError("missing or invalid bearer token (send Authorization: Bearer <token>)")


# Declares the bearer scheme in OpenAPI; the check itself is check_token (constant time, blank never matches).
bearer_scheme = HTTPBearer(auto_error=False, scheme_name="bearerAuth",
                           description="Authorization: Bearer <server.api_token> (when a token is configured).")


def require_token(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)]) -> None:
    """FastAPI dependency for routes that change state or expose internals."""
    check_token(service(request).cfg, request.headers.get("authorization"))


def content_type_problem(content_type: str, content_encoding: str = "", media_type: str = "application/json") -> str | None:
    """Why a request body of ``content_type`` sent with ``content_encoding`` (the Content-Encoding header's codings,
    repeated headers joined by commas; "" without one) is refused (415), or None when it is ``media_type`` sent as it
    is (no content coding, or only ``identity``)."""
    if content_type.split(";", 1)[0].strip().lower() != media_type:
        return f"content type must be {media_type}, got {content_type or 'none'!r}"
    if content_encoding and any(c.strip().lower() not in ("", "identity") for c in content_encoding.split(",")):
        return (f"content coding {content_encoding.strip()!r} is not supported: send the body as it is, without a "
                "Content-Encoding header")
    return None


def body_type_problem(request: Request, media_type: str = "application/json") -> str | None:
    """:func:`content_type_problem` of a request's Content-Type and Content-Encoding headers."""
    h = request.headers
    return content_type_problem(h.get("content-type", ""), ", ".join(h.getlist("content-encoding")), media_type)


def require_json(request: Request) -> None:
    """Raise 415 unless the request's body is ``application/json``, sent without a content coding."""
    problem = body_type_problem(request)
    if problem is not None:
        raise HTTPException(415, problem)


class Utf8JsonRequest(Request):
    """A request whose JSON body must be UTF-8 (Starlette's ``json()`` also takes UTF-16 and UTF-32)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_utf8(await self.body())
        return self._json


class JsonBodyRoute(APIRoute):
    """A route whose POST requests must be ``application/json``: checked before FastAPI reads and validates the body.

    (In the endpoint the check would come too late: a text/plain body fails validation
    first, with 422. A route wrapper costs less per request than a FastAPI dependency.)
    """

    guarded = False

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if "POST" not in (self.methods or ()) or self.body_field is None:
            return handler

        guarded = self.guarded

        async def json_only(request: Request) -> Response:
            if guarded:  # the token first: an unauthenticated caller learns nothing about the body
                check_token(service(request).cfg, request.headers.get("authorization"))
            require_json(request)
            return await handler(Utf8JsonRequest(request.scope, request.receive))

        return json_only


class GuardedJsonBodyRoute(JsonBodyRoute):
    """A token-guarded JsonBodyRoute: the token is checked before the content type and the body."""

    guarded = True


def journal_wait_reason(state: ServiceState) -> str | None:
    """Why /health answers 503 while the journal waits for a file descriptor or disk space for its next file, or
    None."""
    journal = state.engine.journal
    return journal.wait_reason() if journal is not None else None


def current_degradation(state: ServiceState) -> Degradation | None:
    """What makes the served model degraded (``state.degraded`` while its model is the one served), or None."""
    d = state.degraded
    return d if d is not None and d.model_version == state.engine.model_version else None


def current_reason(state: ServiceState) -> str | None:
    """The reason /health gives while the served model is degraded, or None; it names the models stored now
    (by any process: ``cerebellar-norse train`` into the same state dir too)."""
    d = current_degradation(state)
    if d is None:
        return None
    stored: list[str] = []
    if d.untrained_seed is not None and state.store is not None:
        with contextlib.suppress(OSError):  # unreadable: worded as when nothing is stored
            stored = state.store.versions_now()  # listed again only when the models directory changed
    return reason(d, stored)
