"""``POST /neural/process`` answered from the HTTP protocol's own callbacks, without an ASGI request cycle.

uvicorn runs every request as a task calling the ASGI app, whose body is read and whose
answer is written through awaited messages; on this route that cycle cost more CPU than
parsing, checking and stepping the tick together (docs/http.md, "Answering from the
protocol"). The protocol (:func:`.protocol.guarded_protocol`) therefore offers each
request to :meth:`DirectTickRoute.eligible` when it would start its task; a plain tick
request (the route, a ``Content-Length`` body of at most :data:`MAX_INLINE_BODY` bytes,
JSON without a content coding, no ``Expect: 100-continue``, within
``server.max_connections``) is then answered by :meth:`DirectTickRoute.answer` once its
body is complete, from the same steps the ASGI route runs (:class:`.fastpath.TickFastPath`:
parsing, checks, the engine's future, the answer's JSON, the refusals) and with the request
context the ASGI route gets from :class:`.app.RequestContextMiddleware` (request id,
``X-Request-ID``, request metrics, the request's timeline, the JSON 500). Anything else,
and a plain request whose body does not come (request timeout, closed connection), goes
the ASGI way. A test sends the same requests both ways and compares the answers.

A whole plain tick request that arrives in one read, on a connection with nothing else under way, does not even go
through the HTTP parser: the protocol reads it in one pass (:mod:`.plainhead`) and offers it to :meth:`eligible` and
:meth:`answer` the same way (docs/http.md, "Reading a plain tick request in one pass").
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

from starlette.types import Scope

from ..observability.context import accept_request_id, request_id_var
from ..observability.timelines import SENT, Timeline
from .deps import SCOPE_REQUEST_ID, SCOPE_ROUTE, ServiceState, content_type_problem
from .errors import unexpected_error_response
from .fastpath import PATH, RAW_PATH, Answer, TickFastPath, TickHeaders, answer_headers, is_hot, tick_headers
from .protocol import CUT_OFF, Reply, error_answer

MAX_INLINE_BODY = 65_536  # bytes: uvicorn stops reading a body beyond this until an app reads it (none runs here)
SCOPE_DIRECT = "cerebellar_norse.direct"  # the request's headers and start, from eligible() to answer()


class DirectTickRoute:
    """The hot route as the protocol calls it (see the module's docstring).

    ``fast``: the route's steps; ``over_limit()``: True over ``server.max_connections`` (the request context's
    check; such a request goes the ASGI way, which refuses it); ``max_body``: ``server.max_body_size`` (bytes).
    """

    target = RAW_PATH

    def __init__(self, fast: TickFastPath, over_limit: Callable[[], bool], max_body: int) -> None:
        self.fast = fast
        self.state: ServiceState = fast.state
        self.over_limit = over_limit
        self.max_inline = min(max_body, MAX_INLINE_BODY)

    def eligible(self, scope: Scope) -> bool:
        """Whether :meth:`answer` takes this request, read at its start (its headers complete): the hot route with a
        plain JSON body of a known length; the protocol also requires that it expects no ``100 Continue``."""
        if not is_hot(scope):
            return False
        h = tick_headers(scope["headers"])
        n = h.length
        if (n is None or not n.isdigit() or not 0 < int(n) <= self.max_inline
                or content_type_problem(h.content_type, h.coding) is not None or self.over_limit()):
            return False
        rid = accept_request_id(h.request_id)
        scope[SCOPE_REQUEST_ID] = rid  # (an answer written below the app, a 408, names it)
        scope[SCOPE_ROUTE] = PATH
        scope[SCOPE_DIRECT] = (h, time.perf_counter_ns())
        return True

    def answer(self, scope: Scope, body: bytes, reply: Reply) -> None:
        """Answer the request :meth:`eligible` took, whose whole ``body`` has come: through ``reply(status, headers,
        body)`` now when it is refused, else once the engine has stepped its tick."""
        h: TickHeaders
        h, t0 = scope[SCOPE_DIRECT]
        rid: str = scope[SCOPE_REQUEST_ID]
        timeline = Timeline(rid, PATH, t0)
        token = request_id_var.set(rid)
        try:  # (a tick queued is answered by _settled, which the engine calls in the round its batch runs)
            begun = self.fast.begin(body, h.market, timeline, functools.partial(self._settled, rid, t0, timeline, reply))
        except Exception as exc:
            self._unexpected(exc, rid, t0, timeline, reply)
            return
        finally:
            request_id_var.reset(token)
        if not isinstance(begun, asyncio.Future):
            self._send(begun, rid, t0, timeline, reply)

    def _settled(self, rid: str, t0: int, timeline: Timeline, reply: Reply, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():  # (the engine settles every future it queued; nothing else holds this one)
            headers, body = error_answer("internal", CUT_OFF, rid)
            self._count(500, t0, timeline)
            reply(500, headers, body)
            return
        token = request_id_var.set(rid)
        try:
            answer = self.fast.settle(fut, timeline)
        except Exception as exc:
            self._unexpected(exc, rid, t0, timeline, reply)
            return
        finally:
            request_id_var.reset(token)
        self._send(answer, rid, t0, timeline, reply)

    def _send(self, answer: Answer, rid: str, t0: int, timeline: Timeline, reply: Reply) -> None:
        status, body, extra = answer
        reply(status, answer_headers(body, [*extra, (b"x-request-id", rid.encode())]), body)
        self._count(status, t0, timeline)

    def _unexpected(self, exc: Exception, rid: str, t0: int, timeline: Timeline, reply: Reply) -> None:
        """An error nothing handled: answered as the request context answers it (logged; 500, or 503 for want of a
        host resource)."""
        response = unexpected_error_response(exc, rid, lambda kind: self.state.metrics.errors.labels(kind).inc())
        reply(response.status_code, [*response.raw_headers, (b"x-request-id", rid.encode())], bytes(response.body))
        self._count(response.status_code, t0, timeline)

    def _count(self, status: int, t0: int, timeline: Timeline) -> None:
        """The request's metrics and timeline, as the request context keeps them."""
        now = time.perf_counter_ns()
        timeline.marks[SENT] = now
        self.state.metrics.count_request(PATH, "POST", status, (now - t0) / 1e9)
        timeline.status = status
        self.state.timelines.finish(timeline)
