"""/debug/…: live introspection of the running service (bearer token required when one is configured).

Read-only: nothing here changes the service's state or runs code sent by a caller.
"""

from __future__ import annotations

import os
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as FPath
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ...errors import RequestNotFoundError
from ...observability.debugtools import (
    SpikeTracker,
    busiest_markets,
    market_state,
    redacted_config,
    thread_stacks,
    utc_iso,
)
from ...observability.pictures import RING_TICKS, MarketTrace, raster_png
from ...observability.timelines import RECENT
from ..deps import require_token, service
from ..openapi import error_responses
from .neural import MarketIdPath, MarketNotFoundError

router = APIRouter(prefix="/debug", tags=["debug"], dependencies=[Depends(require_token)])


@router.get("/markets", operation_id="busiest_markets", responses=error_responses(401, 422))
async def get_markets(request: Request, limit: Annotated[int, Query(ge=1, le=10_000, description="Most markets listed.")] = 10
                      ) -> dict[str, Any]:
    """Markets holding state, busiest first (token): most ticks seen since each market's state began."""
    eng = service(request).engine
    return {"markets": busiest_markets(eng, limit), "total": eng.pool.used}


@router.get("/markets/{market_id:path}/state", operation_id="market_state",
            responses=error_responses(401, 404, s404="The market holds no state: never seen, evicted, reset, or not a "
                                                     "valid market id."))
async def get_market_state(request: Request, market_id: MarketIdPath) -> dict[str, Any]:
    """One market's state (token): encoder statistics, last tick, membrane summaries per population, spike counts, warm-up.

    Read between two batches (one consistent state). Spike counts are kept from the
    first state request on (see docs/operations.md, Debugging).
    """
    svc = service(request)
    tracker = SpikeTracker.attach(svc.engine, svc.trackers)
    state = market_state(svc.engine, market_id, tracker)
    if state is None:
        raise MarketNotFoundError(f"market {market_id!r} holds no state", "market_id")
    return state


@router.get("/markets/{market_id:path}/raster.png", operation_id="market_raster", response_class=Response,
            responses={200: {"content": {"image/png": {"schema": {"type": "string", "format": "binary"}}}, "description": "A PNG of the market's recorded ticks."},
                       **error_responses(401, 404, 422, s404="The market holds no state: never seen, evicted, reset, "
                                                             "or not a valid market id.")})
async def get_market_raster(request: Request, market_id: MarketIdPath,
                            ticks: Annotated[int, Query(ge=1, le=RING_TICKS, description="Most recent ticks shown.")] = 200
                            ) -> Response:
    """Spike raster and membrane traces of one market's last ``ticks`` ticks as a PNG (token).

    Ticks are recorded from the market's first raster request on (see docs/operations.md,
    Debugging): the first picture of a market is empty.
    """
    svc = service(request)
    trace = MarketTrace.attach(svc.engine, svc.trackers)
    if svc.engine.pool.table.get(market_id) is None:
        raise MarketNotFoundError(f"market {market_id!r} holds no state", "market_id")
    trace.watch(market_id)
    series = trace.series(market_id, ticks)
    return Response(await run_in_threadpool(raster_png, series), media_type="image/png")



@router.get("/requests", operation_id="request_timelines", responses=error_responses(401, 422))
async def get_requests(request: Request,
                       slow: Annotated[bool, Query(description="Slowest first (of the last hour or two) instead of newest first.")] = False,
                       limit: Annotated[int, Query(ge=1, le=RECENT, description="Most timelines listed.")] = 10
                       ) -> dict[str, Any]:
    """Timelines of recent tick requests (token): when each stage happened (µs from arrival), newest or slowest first.

    Stages: received, validated, batch_started, stepped, completed, serialised, sent;
    with the engine batch (size and step number) the request's tick ran in.
    """
    book = service(request).timelines
    picked = book.slowest_first(limit) if slow else book.newest_first(limit)
    return {"order": "slowest" if slow else "newest", "requests": [tl.as_dict() for tl in picked]}


@router.get("/requests/{request_id}", operation_id="request_timeline",
            responses=error_responses(401, 404, s404="No timeline kept for that request id (too old, or never seen)."))
async def get_request(request: Request, request_id: Annotated[str, FPath(description="The request's X-Request-ID.")]
                      ) -> dict[str, Any]:
    """One request's timeline (token), found among the recent and the slowest kept."""
    tl = service(request).timelines.get(request_id)
    if tl is None:
        raise RequestNotFoundError(f"no timeline kept for request {request_id!r} (the last {RECENT} requests and the "
                                   "slowest of the last hour or two are kept)", "request_id")
    return tl.as_dict()


@router.get("/backtrace", operation_id="backtrace", responses=error_responses(401))
async def get_backtrace(request: Request) -> dict[str, Any]:
    """The current stack of every thread of the service process (token), innermost frame last.

    Each thread has its frames (file, line, function, source line) and the same as text
    in Python's traceback format. The event loop's own thread shows this handler.
    """
    stacks = thread_stacks()
    return {"pid": os.getpid(), "captured_at": utc_iso(time.time()), "threads": stacks}


@router.get("/config", operation_id="effective_config", responses=error_responses(401))
async def get_config(request: Request) -> dict[str, Any]:
    """The effective configuration (token): file, environment overrides and reloads applied, secrets as ``***``."""
    svc = service(request)
    path = svc.config_path
    return {"config_path": str(path) if path else None, "config": redacted_config(svc.cfg)}
