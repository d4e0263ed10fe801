"""The FastAPI application: routes, error handlers, request ids and request metrics."""

from __future__ import annotations

import functools
import json
import re
import time
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute, APIRouter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Match, Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..observability.context import accept_request_id, request_id_var
from ..observability.timelines import SENT, Timeline
from .bulk import bulk_body_limit
from .deps import SCOPE_REQUEST_ID, SCOPE_ROUTE, SCOPE_TIMED_OUT, SCOPE_TIMELINE, ServiceState
from .direct import DirectTickRoute
from .errors import install_error_handlers, unexpected_error_response
from .fastpath import PATH as HOT_PATH
from .fastpath import TickFastPath, is_hot
from .openapi import install_openapi
from .protocol import DirectRoute
from .routes import debug, handover, health, model_upload, neural
from .routing import install_exact_paths, keep_route_words_as_sent
from .schemas import error_payload

TIMED_ROUTES = frozenset({"/neural/process", "/neural/process/batch"})  # POST requests whose timelines are kept


_CONVERTER = re.compile(r"\{(\w+):\w+\}")  # a path parameter's converter, as in {market_id:path}


@functools.lru_cache(maxsize=256)
def route_label(path: str) -> str:
    """The ``route`` label of a request metric: the route's template as the API documents it, without Starlette's
    converters (``/neural/markets/{market_id:path}`` is ``/neural/markets/{market_id}``)."""
    return _CONVERTER.sub(r"{\1}", path)


def route_of(scope: Scope) -> str:
    """The ``route`` label of a request: the route that served it, or, for one answered before routing (over the
    connection limit, a body declared too large), the route its path and method would have reached; ``other`` for a
    path no route has."""
    route = scope.get("route")
    if route is None and is_hot(scope):  # the hot path's own middleware refused it (no router in its scope)
        return HOT_PATH
    if route is None:
        partial = None
        for candidate in getattr(scope.get("app"), "route_table", ()):
            match, _ = candidate.matches(scope)
            if match is Match.FULL:
                route = candidate
                break
            if match is Match.PARTIAL and partial is None:
                partial = candidate  # the path is a route's, the method is not (405)
        route = route or partial
    path = getattr(route, "path", None)
    return route_label(path) if isinstance(path, str) else "other"


class BodyTooLarge(StarletteHTTPException):
    """A chunked request body passed ``server.max_body_size`` while it was read (HTTP 413)."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


# Answered over server.max_connections: refused, the scrape made Prometheus see the service down (CerebellarNorseDown,
# "cannot scrape") and took away the connection gauges that say why (CerebellarNorseConnectionsNearLimit went
# without data) just when clients that hold connections open had used the limit up.
OVER_LIMIT_ANSWERED = frozenset({("GET", "/metrics"), ("HEAD", "/metrics")})


class RequestContextMiddleware:
    """Pure ASGI middleware: request id in and out (``X-Request-ID``), request count and latency by route.

    It also enforces ``server.max_body_size`` (413 with the JSON error shape: at once when
    ``Content-Length`` is too large, while reading for bodies without one) and
    ``server.max_connections`` (503 with ``Retry-After``; ``GET``/``HEAD /metrics`` excepted, see
    :data:`OVER_LIMIT_ANSWERED`), and turns an unexpected
    exception into the JSON 500 with the request id, so that every response, errors
    included, carries ``X-Request-ID`` and a body whose ``request_id`` matches it.
    """

    def __init__(self, app: ASGIApp, state: ServiceState) -> None:
        self.app = app
        self.state = state
        self.max_body = int(state.cfg.server.max_body_size)
        self.max_connections = state.cfg.server.max_connections

    def _too_large(self, scope: Scope | None = None) -> str:
        """The 413's message; for a chunked upload that may be larger with a ``Content-Length`` (``scope``), how."""
        msg = f"request body exceeds server.max_body_size ({self.max_body} bytes)"
        bulk = bulk_body_limit(scope, self.state.cfg) if scope is not None else 0
        if bulk > self.max_body:
            msg += f"; this upload may be up to {bulk} bytes when sent with a Content-Length instead of chunked"
        return msg

    def over_connection_limit(self) -> bool:
        """More open connections (or running requests) than ``server.max_connections``, this one included."""
        server = self.state.server
        server_state = getattr(server, "server_state", None)
        if server_state is None:
            return False
        limit = self.max_connections
        return len(server_state.connections) > limit or len(server_state.tasks) > limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":  # the handshake's id: its answer (101 or the refusal) carries it
                scope[SCOPE_REQUEST_ID] = accept_request_id(
                    next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), None))
            if scope["type"] == "websocket" and scope["path"] != neural.STREAM_PATH:
                await self._refuse_websocket(scope, send, 404, "not_found", f"no WebSocket at {scope['path']!r}: the"
                                             f" stream is {neural.STREAM_PATH}", close_code=1008)
                return
            if scope["type"] == "websocket" and self.over_connection_limit():
                msg = f"too many open connections (server.max_connections = {self.max_connections}); retry later"
                await self._refuse_websocket(scope, send, 503, "capacity", msg)
                return
            await self.app(scope, receive, send)
            return
        rid = None
        length = None
        for k, v in scope["headers"]:
            if k == b"x-request-id" and rid is None:  # the first of a repeated header, as every header is read
                rid = v.decode("latin-1")
            elif k == b"content-length":
                length = v.strip(b" \t")  # optional whitespace around a field value (RFC 9110)
        t0 = time.perf_counter_ns()
        rid = scope.get(SCOPE_REQUEST_ID) or accept_request_id(rid)  # (set already by the protocol's direct route)
        token = request_id_var.set(rid)
        scope[SCOPE_REQUEST_ID] = rid
        status = 500
        started = False
        timeline = None
        if scope["path"] in TIMED_ROUTES and scope["method"] == "POST":
            timeline = scope[SCOPE_TIMELINE] = Timeline(rid, scope["path"], t0)

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started
            if scope.get(SCOPE_TIMED_OUT):
                return  # the protocol answered 408 already (server.request_timeout)
            if message["type"] == "http.response.start":
                status = message["status"]
                started = True
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode("latin-1"))]
            await send(message)
            if timeline is not None and message["type"] == "http.response.body" and not message.get("more_body"):
                timeline.marks[SENT] = time.perf_counter_ns()

        app_receive = receive
        if length is None:  # chunked: count the bytes as they arrive
            received = 0

            async def limited_receive() -> Message:
                nonlocal received
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    if received > self.max_body:
                        raise BodyTooLarge(self._too_large(scope))
                return message

            app_receive = limited_receive

        m = self.state.metrics
        try:
            if self.over_connection_limit() and (scope["method"], scope["path"]) not in OVER_LIMIT_ANSWERED:
                m.errors.labels("capacity").inc()
                msg = f"too many open connections (server.max_connections = {self.max_connections}); retry later"
                await JSONResponse(error_payload("capacity", msg, rid), status_code=503,
                                   headers={"Retry-After": "1", "Connection": "close"})(scope, receive, send_wrapper)
                return
            if length is not None and (not length.isdigit() or (int(length) > self.max_body
                                                                 and int(length) > bulk_body_limit(scope, self.state.cfg))):
                m.errors.labels("body_too_large").inc()
                await JSONResponse(error_payload("body_too_large", self._too_large(), rid), status_code=413)(scope, receive, send_wrapper)
                return
            await self.app(scope, app_receive, send_wrapper)
        except BodyTooLarge:
            if started:
                raise
            m.errors.labels("body_too_large").inc()
            await JSONResponse(error_payload("body_too_large", self._too_large(scope), rid), status_code=413,
                               headers={"Connection": "close"})(scope, receive, send_wrapper)
        except ClientDisconnect:
            pass  # the client went away (or was cut off by the request timeout): nothing to answer
        except Exception as exc:
            if started:
                raise
            await unexpected_error_response(exc, rid, lambda kind: m.errors.labels(kind).inc())(scope, receive,
                                                                                              send_wrapper)
        finally:
            if scope.get(SCOPE_TIMED_OUT):
                status = 408
            elif not started and status == 500:
                status = 499  # closed by the client before an answer (nginx's convention)
            label = scope.get(SCOPE_ROUTE) or route_of(scope)
            m.count_request(label, scope["method"], status, (time.perf_counter_ns() - t0) / 1e9)
            if timeline is not None:
                timeline.status = status
                self.state.timelines.finish(timeline)
            request_id_var.reset(token)

    async def _refuse_websocket(self, scope: Scope, send: Send, status: int, kind: str, msg: str,
                                close_code: int = 1013) -> None:
        """Refuse a WebSocket handshake with the JSON error shape where the server can send an HTTP answer (503 over
        the connection limit, with Retry-After; 404 for a path with no WebSocket), else by closing it."""
        self.state.metrics.errors.labels(kind).inc()
        rid = scope[SCOPE_REQUEST_ID]
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": close_code, "reason": msg[:120]})
            return
        body = json.dumps(error_payload(kind, msg, rid)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"x-request-id", rid.encode())]
        if status == 503:
            headers.append((b"retry-after", b"1"))
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})


SERVER_WIDE = "*"  # the asterisk-form request target (RFC 9112, section 3.2.4): the server as a whole, for OPTIONS only


class ServerWide:
    """ASGI app answering the requests whose target is ``*``: ``OPTIONS *`` (RFC 9110, section 9.3.7: what the
    server as a whole supports) with ``200``, ``Allow`` listing every method some route answers and no content, as a
    ping from a proxy or a monitor expects; any other method with ``*`` is ``400 bad_request`` (the asterisk form is
    OPTIONS's alone). Wrapped in :class:`RequestContextMiddleware` as the hot path is: request id, metrics, limits."""

    def __init__(self, state: ServiceState, methods: frozenset[str]) -> None:
        self.state = state
        self.allow = ", ".join(sorted(methods | {"OPTIONS"})).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[SCOPE_ROUTE] = SERVER_WIDE
        if scope["method"] == "OPTIONS":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"allow", self.allow), (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        self.state.metrics.errors.labels("bad_request").inc()
        msg = (f"malformed HTTP request: the request target '*' is for OPTIONS only (RFC 9112, section 3.2.4), not "
               f"{scope['method']}; name a path such as /health")
        await JSONResponse(error_payload("bad_request", msg, request_id_var.get()), status_code=400)(scope, receive, send)


class ServiceApp(FastAPI):
    """The FastAPI app, with ``POST /neural/process`` answered before FastAPI's own layers.

    ``hot`` (when set) receives the hot route's requests directly: the request context
    (:class:`RequestContextMiddleware`) around :class:`~.fastpath.TickFastPath`. Every
    other request goes through FastAPI as usual, its middleware stack included.
    FastAPI's error, body-limit and telemetry middlewares cost more per request than
    the whole engine step; what they would do for the hot route,
    :class:`RequestContextMiddleware` does itself (JSON 500 and 413, request ids).
    """

    hot: ASGIApp | None = None
    direct: DirectRoute | None = None  # the hot route as the protocol answers it (:mod:`.direct`)
    server_wide: ASGIApp | None = None  # requests for the target ``*`` (:class:`ServerWide`)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the included routers' routes, in order: what a request answered before routing would have reached
        self.route_table: list[BaseRoute] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hot is not None and is_hot(scope):
            await self.hot(scope, receive, send)
            return
        if b"%" in (scope.get("raw_path") or b""):  # a route's words percent-encoded are no route (routing.py)
            keep_route_words_as_sent(scope, (*self.route_table, *(r for r in self.router.routes
                                                                   if isinstance(r, (Route, WebSocketRoute)))))
        if self.server_wide is not None and scope["type"] == "http" and scope["path"] == SERVER_WIDE:
            await self.server_wide(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def add_head_routes(router: APIRouter) -> APIRouter:
    """``router`` with a ``HEAD`` route beside each of its ``GET`` routes that has none (RFC 9110, section 9.3.2: the
    status and headers of ``GET``, ``Content-Length`` included, without the body): FastAPI's ``GET`` routes answered
    ``HEAD`` with ``405``. Each is documented as its own operation (``operationId`` with ``_head``), without content
    (:mod:`.openapi`). Idempotent (the routers are the route modules' own, and an app may be built more than once)."""
    heads = {route.path for route in router.routes if isinstance(route, APIRoute) and "HEAD" in (route.methods or ())}
    shared = len(router.dependencies)  # the router's own, which add_api_route puts before the route's again
    for route in list(router.routes):
        if not isinstance(route, APIRoute) or "GET" not in (route.methods or ()) or route.path in heads:
            continue
        router.add_api_route(
            route.path.removeprefix(router.prefix), route.endpoint, methods=["HEAD"], response_model=route.response_model,
            status_code=route.status_code, tags=[t for t in route.tags if t not in router.tags],
            dependencies=list(route.dependencies[shared:]),
            summary=f"{route.summary or route.name.replace('_', ' ').title()} (headers only)",
            description=f"The status and headers of `GET {route.path_format}`, without its body.",
            responses=dict(route.responses), response_class=route.response_class, name=route.name,
            operation_id=f"{route.operation_id}_head" if route.operation_id else None,
            openapi_extra=route.openapi_extra, include_in_schema=route.include_in_schema,
            route_class_override=type(route))
        heads.add(route.path)
    return router


def create_app(state: ServiceState, extra_routers: list[Any] | None = None, lifespan: Any = None,
               fast_path: bool = True) -> ServiceApp:
    """Build the app around a service state (engine, metrics, config).

    ``fast_path=False`` leaves ``POST /neural/process`` to its FastAPI route (same
    answers, slower: for comparing the two).
    """
    install_exact_paths()  # before any route of the app is compiled
    app = ServiceApp(
        lifespan=lifespan,
        title="cerebellar-norse",
        version=__version__,
        description="Low-latency cerebellar spiking network: POST market ticks, get a short-horizon signal.",
        redirect_slashes=False,  # /health/ is no route (404), not a 307 to a Location built from the Host header
    )  # server.max_body_size is enforced by RequestContextMiddleware (JSON 413, X-Request-ID)
    app.state.service = state
    methods: set[str] = set()  # what some route answers: the Allow of OPTIONS *
    for r in (health.router, neural.router, handover.router, neural.markets_router, model_upload.router, debug.router,
              *(extra_routers or [])):  # (handover before markets_router, whose {market_id:path} also matches …/export)
        app.include_router(add_head_routes(r))
        app.route_table.extend(r.routes)  # included without a prefix: the same paths, in the same order
        methods.update(m for route in r.routes if isinstance(route, APIRoute) for m in (route.methods or ()))
    install_error_handlers(app, lambda kind: state.metrics.errors.labels(kind).inc(), frozenset({neural.STREAM_PATH}))
    install_openapi(app, state)
    if fast_path:
        fast = TickFastPath(state)
        hot = RequestContextMiddleware(fast, state)
        app.hot = hot
        app.direct = DirectTickRoute(fast, hot.over_connection_limit, hot.max_body)
    app.server_wide = RequestContextMiddleware(ServerWide(state, frozenset(methods)), state)
    app.add_middleware(RequestContextMiddleware, state=state)
    return app
