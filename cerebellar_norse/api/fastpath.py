"""The hot path: ``POST /neural/process`` served as plain ASGI, without FastAPI's routing layers.

FastAPI's route matching, dependency solving and response building cost several
times the network's own few microseconds per tick. This ASGI layer answers the one
hot route directly, with exactly the same contract as the FastAPI route it shadows
(which still documents it in OpenAPI at ``/docs``):

* the body is validated by the same pydantic model (:class:`TickIn`, strict);
* the response is serialised through the same response model (:class:`ResultOut`);
* errors have the same JSON shape, statuses and ``error.type`` values, and are counted
  in the same metrics;
* it sits inside :class:`RequestContextMiddleware`, so request ids, body-size limits
  and request metrics apply unchanged.
"""

from __future__ import annotations

import json
import logging

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import CerebellarNorseError
from ..observability.context import request_id_var
from .deps import SCOPE_ROUTE, ServiceState, check_ticks
from .errors import service_error, validation_response
from .schemas import ResultOut, TickIn, error_payload

log = logging.getLogger("cerebellar_norse.api")
PATH = "/neural/process"


class TickFastPath:
    """ASGI middleware answering ``POST /neural/process``; everything else goes to ``app``."""

    def __init__(self, app: ASGIApp, state: ServiceState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST":
            scope[SCOPE_ROUTE] = PATH  # request metrics label it like the FastAPI route
            await self._handle(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _reply(self, send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if extra:
            headers.extend(extra)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _error(self, send: Send, status: int, kind: str, message: str, field: str | None = None,
                     extra: list[tuple[bytes, bytes]] | None = None) -> None:
        self.state.metrics.errors.labels(kind).inc()
        await self._reply(send, status, json.dumps(error_payload(kind, message, request_id_var.get(), field)).encode(), extra)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctype = ""
        market: str | None = None  # X-Market-ID: the ticks' market when the load balancer routed by it
        for k, v in scope["headers"]:
            if k == b"content-type":
                ctype = v.decode("latin-1")
            elif k == b"x-market-id":
                market = v.decode("latin-1")
        if ctype.split(";", 1)[0].strip().lower() != "application/json":
            await self._error(send, 415, "unsupported_media_type", f"content type must be application/json, got {ctype or 'none'!r}")
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if not body.strip():
            await self._error(send, 422, "validation", "request body is missing")
            return
        try:
            tick = TickIn.model_validate_json(body)
        except ValidationError as exc:
            status, payload = validation_response([dict(e) for e in exc.errors(include_url=False)])
            self.state.metrics.errors.labels(payload["error"]["type"]).inc()
            await self._reply(send, status, json.dumps(payload).encode())
            return
        try:
            t = tick.to_tick()
            check_ticks(self.state, (t,), batch=False, market_header=market)
            result = await self.state.engine.submit(t)
        except CerebellarNorseError as exc:
            err = service_error(exc)
            extra = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
            await self._error(send, err.status, err.kind, err.message, err.field, extra)
            return
        result["request_id"] = request_id_var.get()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("tick processed", extra={"fields": {"market_id": tick.market_id, "processing_time_ns": result["processing_time_ns"]}})
        await self._reply(send, 200, ResultOut.model_validate(result).model_dump_json().encode())
