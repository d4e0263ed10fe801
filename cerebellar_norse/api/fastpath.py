"""The hot path: ``POST /neural/process`` served as plain ASGI, without FastAPI's layers.

FastAPI's middleware stack, route matching, dependency solving and response building
cost several times the network's own few microseconds per tick (measured: an empty
FastAPI endpoint needs about four times the CPU per request of a bare ASGI answer on
the same server). :class:`~cerebellar_norse.api.app.ServiceApp` therefore hands this
one route to :class:`TickFastPath` before FastAPI sees the request, so it shadows the
FastAPI route of the same path, which stays for OpenAPI (``/docs``) and for apps
built without the fast path. Everything after parsing is the one implementation both
share (:func:`.tickpath.answer_tick`): the same checks, engine call, debug log and
JSON. Here only what FastAPI would do before it: the content-type check (same
message), reading the body, and validating it with the same strict pydantic model,
errors answered in the same JSON shape and counted in the same metrics. A test sends
the same requests to both and compares the answers. It runs inside
:class:`~cerebellar_norse.api.app.RequestContextMiddleware`, so request ids,
body-size limits, request metrics and the request's timeline apply unchanged.
"""

from __future__ import annotations

import json

from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from ..errors import CerebellarNorseError
from ..observability.context import request_id_var
from .deps import SCOPE_ROUTE, SCOPE_TIMELINE, ServiceState, content_type_problem
from .errors import service_error, validation_response
from .schemas import error_payload, parse_tick, tick_errors
from .tickpath import answer_tick

PATH = "/neural/process"
RAW_PATH = PATH.encode()


def is_hot(scope: Scope) -> bool:
    """True for the request :class:`TickFastPath` answers: ``POST /neural/process``, spelled so (its path as sent:
    ``/neural/%70rocess`` is no route, see :func:`.routing.keep_route_words_as_sent`)."""
    return scope["type"] == "http" and scope.get("raw_path") == RAW_PATH and scope["method"] == "POST"


class TickFastPath:
    """ASGI app answering ``POST /neural/process`` (the requests :func:`is_hot` selects) and nothing else."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[SCOPE_ROUTE] = PATH  # request metrics label it like the FastAPI route
        await self._handle(scope, receive, send)

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
        ctype = coding = ""
        market: str | None = None  # X-Market-ID: the ticks' market when the load balancer routed by it
        seen_ctype = False
        for k, v in scope["headers"]:  # the first of a repeated header, as every other route reads it
            if k == b"content-type" and not seen_ctype:
                ctype, seen_ctype = v.decode("latin-1"), True
            elif k == b"x-market-id" and market is None:
                market = v.decode("latin-1")
            elif k == b"content-encoding":  # every copy: codings are a list, repeated headers join it
                coding = f"{coding}, {v.decode('latin-1')}" if coding else v.decode("latin-1")
        problem = content_type_problem(ctype, coding)
        if problem is not None:
            await self._error(send, 415, "unsupported_media_type", problem)
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
        if not body:  # as FastAPI: no body is missing; a body of whitespace is malformed JSON (400)
            await self._error(send, 422, "validation", "request body is missing")
            return
        try:
            answer = await answer_tick(self.state, parse_tick(body), market, scope.get(SCOPE_TIMELINE))
        except ValidationError as exc:
            status, payload = validation_response(tick_errors(exc, body), body)
            self.state.metrics.errors.labels(payload["error"]["type"]).inc()
            await self._reply(send, status, json.dumps(payload).encode())
            return
        except CerebellarNorseError as exc:  # a repeated key (parse_tick), or the tick refused
            err = service_error(exc)
            extra = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
            await self._error(send, err.status, err.kind, err.message, err.field, extra)
            return
        await self._reply(send, 200, answer)
