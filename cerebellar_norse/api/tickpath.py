"""The tick routes' one implementation: checked ticks in, JSON answers out.

``POST /neural/process`` is answered by the fast path (:mod:`.fastpath`, from the
protocol or as ASGI), which parses the body itself; the FastAPI route of the same path
documents it in OpenAPI and answers only where the fast path is not installed. Once the
body is a :class:`TickIn`, both call :func:`begin_tick` (checks, the engine's queue) and
:func:`tick_answer` (the debug log, the JSON of the answer), the route as
:func:`answer_tick`, so the two cannot drift.
``POST /neural/process/batch`` and the stream use the same functions.

A request's timeline (:mod:`~cerebellar_norse.observability.timelines`) is filled in on
the way: ``validated`` when the ticks are handed to the engine, the batch stages by
the engine, ``serialised`` when the answer's JSON is ready.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Iterable

from ..engine.engine import Settled
from ..engine.records import TickResult
from ..observability.context import request_id_var
from ..observability.timelines import SERIALISED, VALIDATED, Timeline
from .deps import ServiceState, check_ticks
from .schemas import BatchIn, ResultOut, TickIn

log = logging.getLogger("cerebellar_norse.api")

JSON_TYPE = "application/json"


def _json_str(s: str) -> str:
    """``s`` as a JSON string."""
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return f'"{s}"'
    return json.dumps(s, ensure_ascii=False)


def result_json(result: TickResult, request_id: str) -> bytes:
    """The JSON answer to one tick (``ResultOut``), written directly.

    Building and validating the pydantic model per answer cost more than the network's
    step; the fields here are already of their declared types. The same JSON values as
    ``ResultOut.model_validate(...).model_dump_json()`` (a test compares the two over
    many results); a non-finite number takes that path, which writes it as ``null``.
    """
    down, flat, up, conf = float(result.down), float(result.flat), float(result.up), float(result.confidence)
    pred = up - down
    if not (math.isfinite(pred) and math.isfinite(flat) and math.isfinite(conf)):
        return ResultOut.model_validate(result.as_json_object(request_id)).model_dump_json().encode()
    return (f'{{"market_id":{_json_str(result.market_id)},"prediction":{pred!r},'
            f'"probabilities":{{"down":{down!r},"flat":{flat!r},"up":{up!r}}},"confidence":{conf!r},'
            f'"spike_count":{int(result.spike_count)},"processing_time_ns":{int(result.processing_time_ns)},'
            f'"warming_up":{"true" if result.warming_up else "false"},"model_version":{_json_str(result.model_version)},'
            f'"request_id":{_json_str(request_id)}}}').encode()


def batch_json(results: Iterable[TickResult], request_id: str) -> bytes:
    """The JSON answer to a batch (``BatchOut``): each result as :func:`result_json` writes it."""
    rows = b",".join(result_json(r, request_id) for r in results)
    return b'{"results":[' + rows + b'],"request_id":' + _json_str(request_id).encode() + b"}"


def log_processed(results: Iterable[TickResult]) -> None:
    """One DEBUG ``tick processed`` line per result, with its market and network time (ns).

    Callers check ``log.isEnabledFor(logging.DEBUG)`` first, so nothing is paid at INFO.
    """
    for r in results:
        log.debug("tick processed", extra={"fields": {"market_id": r.market_id, "processing_time_ns": r.processing_time_ns}})


def begin_tick(svc: ServiceState, tick: TickIn, market_header: str | None = None, timeline: Timeline | None = None,
               routed_by: str = "X-Market-ID header", on_settled: Settled | None = None) -> asyncio.Future[TickResult]:
    """Check one tick and queue it for the engine; the future settles with its result (see :func:`tick_answer`).

    ``market_header`` is the request's ``X-Market-ID`` (the tick must be of that
    market; ``routed_by`` says where it came from, for the error). Raises a :class:`~cerebellar_norse.errors.CerebellarNorseError` (mapped to
    its HTTP answer by the caller) and changes no state when the tick is refused. ``on_settled``: see
    :meth:`~cerebellar_norse.engine.engine.Engine.submit_nowait`.
    """
    t = tick.to_tick()
    check_ticks(svc, (t,), batch=False, market_header=market_header, routed_by=routed_by)
    if timeline is not None:
        timeline.market_id, timeline.ticks = t.market_id, 1
        timeline.marks[VALIDATED] = time.perf_counter_ns()
    return svc.engine.submit_nowait(t, timeline, on_settled)


def tick_answer(result: TickResult, request_id: str, timeline: Timeline | None = None) -> bytes:
    """The JSON answer to a tick the engine stepped (debug log line included)."""
    if log.isEnabledFor(logging.DEBUG):
        log_processed((result,))
    body = result_json(result, request_id)
    if timeline is not None:
        timeline.marks[SERIALISED] = time.perf_counter_ns()
    return body


async def answer_tick(svc: ServiceState, tick: TickIn, market_header: str | None = None,
                      timeline: Timeline | None = None, routed_by: str = "X-Market-ID header") -> bytes:
    """Check one tick, step it through the engine and return the JSON answer (:func:`begin_tick`, then
    :func:`tick_answer`); raises as :func:`begin_tick` does, or with the error that refused the tick's batch."""
    result = await begin_tick(svc, tick, market_header, timeline, routed_by)
    return tick_answer(result, request_id_var.get(), timeline)


async def answer_batch(svc: ServiceState, batch: BatchIn, market_header: str | None = None,
                       timeline: Timeline | None = None) -> bytes:
    """Check a batch (all ticks or none), step it through the engine in order and return the JSON answer."""
    ticks = [t.to_tick() for t in batch.ticks]
    check_ticks(svc, ticks, batch=True, market_header=market_header)
    if timeline is not None:
        timeline.market_id = ticks[0].market_id if len({t.market_id for t in ticks}) == 1 else ""
        timeline.ticks = len(ticks)
        timeline.marks[VALIDATED] = time.perf_counter_ns()
    results = await svc.engine.submit_many(ticks, timeline)
    if log.isEnabledFor(logging.DEBUG):
        log_processed(results)
    body = batch_json(results, request_id_var.get())
    if timeline is not None:
        timeline.marks[SERIALISED] = time.perf_counter_ns()
    return body
