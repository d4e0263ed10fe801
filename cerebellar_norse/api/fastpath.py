"""The hot path: ``POST /neural/process`` served as plain ASGI, without FastAPI's layers.

FastAPI's middleware stack, route matching, dependency solving and response building
cost several times the network's own few microseconds per tick (measured: an empty
FastAPI endpoint needs about four times the CPU per request of a bare ASGI answer on
the same server). :class:`~cerebellar_norse.api.app.ServiceApp` therefore hands this
one route to :class:`TickFastPath` before FastAPI sees the request, so it shadows the
FastAPI route of the same path, which stays for OpenAPI (``/docs``) and for apps
built without the fast path. Everything after parsing is the one implementation both
share (:func:`.tickpath.begin_tick` and :func:`.tickpath.tick_answer`, which the
FastAPI route calls as :func:`.tickpath.answer_tick`): the same checks, engine call,
debug log and JSON. Here only what FastAPI would do before it: the content-type check
(same message), reading the body, and validating it with the same strict pydantic
model, errors answered in the same JSON shape and counted in the same metrics. A test
sends the same requests to both and compares the answers. It runs inside
:class:`~cerebellar_norse.api.app.RequestContextMiddleware`, so request ids,
body-size limits, request metrics and the request's timeline apply unchanged.

A plain request (a ``Content-Length`` JSON body) is answered by the same steps from the
HTTP protocol's callbacks instead (:mod:`.direct`), without an ASGI request cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from ..engine.engine import Settled
from ..engine.records import TickResult
from ..errors import CerebellarNorseError
from ..observability.context import request_id_var
from ..observability.timelines import Timeline
from .deps import SCOPE_ROUTE, SCOPE_TIMELINE, ServiceState, content_type_problem
from .errors import service_error, validation_response
from .schemas import error_payload, parse_tick, tick_errors
from .tickpath import begin_tick, tick_answer

PATH = "/neural/process"
RAW_PATH = PATH.encode()

Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]  # status, JSON body, headers beyond content-type and -length


def answer_headers(body: bytes, extra: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The headers of an :data:`Answer` of ``body``: its JSON content type and length, then ``extra``."""
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]


def is_hot(scope: Scope) -> bool:
    """True for the request :class:`TickFastPath` answers: ``POST /neural/process``, spelled so (its path as sent:
    ``/neural/%70rocess`` is no route, see :func:`.routing.keep_route_words_as_sent`)."""
    return scope["type"] == "http" and scope.get("raw_path") == RAW_PATH and scope["method"] == "POST"


@dataclass(slots=True)
class TickHeaders:
    """What the hot route reads of a request's headers: the first of a repeated header, as every other route reads
    it, except ``Content-Encoding``, whose copies join one list of codings."""

    content_type: str = ""
    coding: str = ""
    market: str | None = None  # X-Market-ID: the ticks' market when the load balancer routed by it
    request_id: str | None = None  # X-Request-ID as sent
    length: bytes | None = None  # Content-Length as sent, without the whitespace around it


def tick_headers(headers: Iterable[tuple[bytes, bytes]]) -> TickHeaders:
    """The hot route's headers of ``headers`` (names in lower case, as the server gives them)."""
    h = TickHeaders()
    seen_ctype = False
    for k, v in headers:
        if k == b"content-type" and not seen_ctype:
            h.content_type, seen_ctype = v.decode("latin-1"), True
        elif k == b"content-length" and h.length is None:
            h.length = v.strip(b" \t")
        elif k == b"x-market-id" and h.market is None:
            h.market = v.decode("latin-1")
        elif k == b"x-request-id" and h.request_id is None:
            h.request_id = v.decode("latin-1")
        elif k == b"content-encoding":  # every copy: codings are a list, repeated headers join it
            h.coding = f"{h.coding}, {v.decode('latin-1')}" if h.coding else v.decode("latin-1")
    return h


class TickFastPath:
    """ASGI app answering ``POST /neural/process`` (the requests :func:`is_hot` selects) and nothing else.

    Its steps are also callable one by one, without ASGI, as :class:`.direct.DirectTickRoute` calls them from the
    protocol: :meth:`media_problem`, :meth:`begin` (the body: parsed, checked, queued) and :meth:`settle` (the engine's
    outcome). Each answer is an :data:`Answer`; every refusal is counted in ``errors_total`` here.
    """

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[SCOPE_ROUTE] = PATH  # request metrics label it like the FastAPI route
        await self._handle(scope, receive, send)

    def refusal(self, status: int, kind: str, message: str, field: str | None = None,
                extra: list[tuple[bytes, bytes]] | None = None) -> Answer:
        """A refusal in the JSON error shape (the current request id), counted by its ``kind``."""
        self.state.metrics.errors.labels(kind).inc()
        return status, json.dumps(error_payload(kind, message, request_id_var.get(), field)).encode(), extra or []

    def service_refusal(self, exc: CerebellarNorseError) -> Answer:
        """The answer to an error of the errors tree (a repeated key, the tick refused, its batch refused)."""
        err = service_error(exc)
        return self.refusal(err.status, err.kind, err.message, err.field,
                            [(k.lower().encode(), v.encode()) for k, v in err.headers.items()])

    def media_problem(self, h: TickHeaders) -> Answer | None:
        """The 415 for a body that is not plain JSON (as FastAPI checks it, before the body is read), else None."""
        problem = content_type_problem(h.content_type, h.coding)
        return None if problem is None else self.refusal(415, "unsupported_media_type", problem)

    def begin(self, body: bytes, market: str | None, timeline: Timeline | None,
              on_settled: Settled | None = None) -> Answer | asyncio.Future[TickResult]:
        """The request's body parsed, checked and queued for the engine (the future :meth:`settle` answers), or the
        answer that refuses it, with nothing changed; ``on_settled(future)`` is called when the engine has settled the
        future (see :meth:`~cerebellar_norse.engine.engine.Engine.submit_nowait`)."""
        if not body:  # as FastAPI: no body is missing; a body of whitespace is malformed JSON (400)
            return self.refusal(422, "validation", "request body is missing")
        try:
            return begin_tick(self.state, parse_tick(body), market, timeline, on_settled=on_settled)
        except ValidationError as exc:
            status, payload = validation_response(tick_errors(exc, body), body)
            self.state.metrics.errors.labels(payload["error"]["type"]).inc()
            return status, json.dumps(payload).encode(), []
        except CerebellarNorseError as exc:  # a repeated key (parse_tick), or the tick refused
            return self.service_refusal(exc)

    def settle(self, fut: asyncio.Future[TickResult], timeline: Timeline | None) -> Answer:
        """The answer to a tick :meth:`begin` queued, once its future is done: its result, or the refusal of its batch
        (an error outside the errors tree is raised)."""
        exc = fut.exception()
        if isinstance(exc, CerebellarNorseError):
            return self.service_refusal(exc)
        return 200, tick_answer(fut.result(), request_id_var.get(), timeline), []

    async def _reply(self, send: Send, answer: Answer) -> None:
        status, body, extra = answer
        await send({"type": "http.response.start", "status": status, "headers": answer_headers(body, extra)})
        await send({"type": "http.response.body", "body": body})

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        h = tick_headers(scope["headers"])
        refused = self.media_problem(h)
        if refused is not None:
            await self._reply(send, refused)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        timeline = scope.get(SCOPE_TIMELINE)
        begun = self.begin(b"".join(chunks), h.market, timeline)
        if isinstance(begun, asyncio.Future):
            with contextlib.suppress(CerebellarNorseError):  # (settle answers it)
                await begun
            begun = self.settle(begun, timeline)
        await self._reply(send, begun)
