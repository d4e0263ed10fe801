"""The FastAPI application: routes, error handlers, request ids and request metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..observability.context import accept_request_id, request_id_var
from .deps import ServiceState
from .errors import install_error_handlers
from .routes import health, neural


class RequestContextMiddleware:
    """Pure ASGI middleware: request id in and out (``X-Request-ID``), request count and latency by route."""

    def __init__(self, app: ASGIApp, state: ServiceState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                rid = v.decode("latin-1")
                break
        rid = accept_request_id(rid)
        token = request_id_var.set(rid)
        status = 500
        t0 = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "other"
            m = self.state.metrics
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
        max_body_size=int(state.cfg.server.max_body_size),
    )
    app.state.service = state
    app.include_router(health.router)
    app.include_router(neural.router)
    for r in extra_routers or []:
        app.include_router(r)
    install_error_handlers(app, lambda kind: state.metrics.errors.labels(kind).inc())
    app.add_middleware(RequestContextMiddleware, state=state)
    return app
