"""The FastAPI application: routes, error handlers, request ids and request metrics."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..observability.context import accept_request_id, request_id_var
from .deps import ServiceState
from .errors import install_error_handlers
from .fastpath import PATH, TickFastPath
from .routes import health, neural
from .schemas import error_payload

log = logging.getLogger("cerebellar_norse.api")


class RequestContextMiddleware:
    """Pure ASGI middleware: request id in and out (``X-Request-ID``), request count and latency by route.

    It also enforces ``server.max_body_size`` (413 with the JSON error shape: at once when
    ``Content-Length`` is too large, while reading for bodies without one) and turns an
    unexpected exception into the JSON 500 with the request id, so that every response,
    errors included, carries ``X-Request-ID`` and a body whose ``request_id`` matches it.
    """

    def __init__(self, app: ASGIApp, state: ServiceState) -> None:
        self.app = app
        self.state = state
        self.max_body = int(state.cfg.server.max_body_size)

    def _too_large(self) -> str:
        return f"request body exceeds server.max_body_size ({self.max_body} bytes)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        length = None
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                rid = v.decode("latin-1")
            elif k == b"content-length":
                length = v
        rid = accept_request_id(rid)
        token = request_id_var.set(rid)
        status = 500
        started = False
        t0 = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status = message["status"]
                started = True
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        app_receive = receive
        if length is None:  # chunked: count the bytes as they arrive
            received = 0

            async def limited_receive() -> Message:
                nonlocal received
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    if received > self.max_body:
                        raise StarletteHTTPException(413, self._too_large())
                return message

            app_receive = limited_receive

        m = self.state.metrics
        try:
            if length is not None and (not length.isdigit() or int(length) > self.max_body):
                m.errors.labels("body_too_large").inc()
                await JSONResponse(error_payload("body_too_large", self._too_large(), rid), status_code=413)(scope, receive, send_wrapper)
                return
            await self.app(scope, app_receive, send_wrapper)
        except Exception:
            if started:
                raise
            m.errors.labels("internal").inc()
            log.exception("unexpected error")
            await JSONResponse(error_payload("internal", "internal error (logged with this request id)", rid),
                               status_code=500)(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "other"
            m.requests.labels(label, scope["method"], str(status)).inc()
            m.request_seconds.labels(label).observe(time.perf_counter() - t0)
            request_id_var.reset(token)


def create_app(state: ServiceState, extra_routers: list[Any] | None = None, lifespan: Any = None) -> FastAPI:
    """Build the app around a service state (engine, metrics, config)."""
    app = FastAPI(
        lifespan=lifespan,
        title="cerebellar-norse",
        version=__version__,
        description="Low-latency cerebellar spiking network: POST market ticks, get a short-horizon signal.",
    )  # server.max_body_size is enforced by RequestContextMiddleware (JSON 413, X-Request-ID)
    app.state.service = state
    app.include_router(health.router)
    app.include_router(neural.router)
    for r in extra_routers or []:
        app.include_router(r)
    install_error_handlers(app, lambda kind: state.metrics.errors.labels(kind).inc())
    hot_route = next((r for r in app.routes if getattr(r, "path", None) == PATH), None)
    app.add_middleware(TickFastPath, state=state, route=hot_route)  # inner: runs inside the request context
    app.add_middleware(RequestContextMiddleware, state=state)
    return app
