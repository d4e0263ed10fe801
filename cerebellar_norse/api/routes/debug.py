"""/debug/…: live introspection of the running service (bearer token required when one is configured).

Read-only: nothing here changes the service's state or runs code sent by a caller.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as FPath
from fastapi.responses import Response
from pydantic import BaseModel, Field

from ...errors import RequestNotFoundError
from ...observability.debugtools import (
    SpikeTracker,
    busiest_markets,
    market_state,
    redacted_config,
    thread_stacks,
    utc_iso,
)
from ...observability.pictures import RING_TICKS, MarketTrace, raster_png, series_key
from ...observability.timelines import RECENT
from ..deps import require_token, service
from ..openapi import error_responses
from .neural import MarketIdPath, MarketNotFoundError

router = APIRouter(prefix="/debug", tags=["debug"], dependencies=[Depends(require_token)])
DATE_TIME: dict[str, Any] = {"format": "date-time"}  # RFC 3339 in UTC (``Z``): generated clients read a datetime


class BusyMarketOut(BaseModel):
    """One market of ``GET /debug/markets``."""

    market_id: str
    ticks_seen: int = Field(description="Ticks since the market's state began.")
    last_timestamp: int = Field(description="Its last tick's timestamp (ms since the epoch).")


class BusiestMarketsOut(BaseModel):
    """Answer of ``GET /debug/markets``."""

    markets: list[BusyMarketOut] = Field(description="Busiest first.")
    total: int = Field(description="Markets holding state.")


class WarmupOut(BaseModel):
    """A market's warm-up."""

    warming_up: bool
    ticks_seen: int
    warmup_ticks: int = Field(description="neural.warmup_ticks.")
    ticks_until_warm: int


class LastTickOut(BaseModel):
    """A market's last tick."""

    timestamp: int = Field(description="ms since the epoch.")
    time: str = Field(description="The timestamp in UTC, to the millisecond.", json_schema_extra=DATE_TIME)
    price: float


class FeatureOut(BaseModel):
    """The running statistics of one encoder feature."""

    mean: float
    var: float
    count: int


class EncoderOut(BaseModel):
    """A market's encoder state."""

    ticks_seen: int
    features: dict[str, FeatureOut] = Field(description="log_return, log_volume and log_gap.")


class SummaryOut(BaseModel):
    """Mean, standard deviation, minimum and maximum of a population's values."""

    mean: float
    std: float
    min: float
    max: float


class PopulationOut(BaseModel):
    """One population's membrane potentials (v) and input currents (i)."""

    size: int
    v: SummaryOut
    i: SummaryOut


class GolgiOut(BaseModel):
    """The Golgi inhibition of a market."""

    inhibition: float


class PopulationsOut(BaseModel):
    """A market's populations."""

    granule: PopulationOut
    purkinje: PopulationOut
    dcn: PopulationOut
    readout: PopulationOut
    golgi: GolgiOut


class SpikeCountsOut(BaseModel):
    """A market's spikes, kept from the first state request on."""

    tracking_since: str = Field(description="UTC, to the millisecond.", json_schema_extra=DATE_TIME)
    ticks: int = Field(description="Ticks counted.")
    total: dict[str, int] | None = Field(description="Spikes of each population over the ticks counted (null before one).")
    last_tick: dict[str, int] | None = Field(description="Spikes of each population at the last tick (null before one).")


class MarketStateOut(BaseModel):
    """Answer of ``GET /debug/markets/{market_id}/state``."""

    market_id: str
    captured_at: str = Field(description="UTC, to the millisecond.", json_schema_extra=DATE_TIME)
    model_version: str
    precision: str
    warmup: WarmupOut
    last_tick: LastTickOut | None = Field(description="Null before the market's first tick.")
    encoder: EncoderOut
    populations: PopulationsOut
    spike_counts: SpikeCountsOut | None


class StageOut(BaseModel):
    """One stage of a request's timeline (µs from ``received``; null where it was not reached)."""

    stage: str
    at_us: float | None
    took_us: float | None


class TimelineOut(BaseModel):
    """One tick request's timeline (``GET /debug/requests/{request_id}``)."""

    request_id: str
    route: str
    market_id: str | None
    ticks: int
    status: int
    batch_size: int | None = Field(description="Ticks in the engine batch of the request's last tick.")
    batch_seq: int | None = Field(description="That batch's engine step number.")
    received_at: str = Field(description="UTC, to the microsecond.", json_schema_extra=DATE_TIME)
    total_us: float
    stages: list[StageOut] = Field(description="received, validated, batch_started, stepped, completed, serialised, sent.")


class TimelinesOut(BaseModel):
    """Answer of ``GET /debug/requests``."""

    order: Literal["newest", "slowest"]
    requests: list[TimelineOut]


class FrameOut(BaseModel):
    """One frame of a thread's stack."""

    file: str
    line: int | None
    function: str
    code: str


class ThreadOut(BaseModel):
    """One thread's stack, innermost frame last."""

    thread_id: int
    name: str
    daemon: bool | None = Field(description="Null for a thread the threading module does not know.")
    frames: list[FrameOut]
    text: str = Field(description="The frames in Python's traceback format.")


class BacktraceOut(BaseModel):
    """Answer of ``GET /debug/backtrace``."""

    pid: int
    captured_at: str = Field(description="UTC, to the millisecond.", json_schema_extra=DATE_TIME)
    threads: list[ThreadOut]


class ConfigOut(BaseModel):
    """Answer of ``GET /debug/config``."""

    config_path: str | None = Field(description="The TOML file read (null: the built-in default).")
    config: dict[str, Any] = Field(description="Every section and key in force, secrets as ***.")
    need_restart: list[str] = Field(description="Keys the config file, as last reloaded (SIGHUP), sets to other values "
                                                "than those in force: they take effect at the next restart.")


@router.get("/markets", operation_id="busiest_markets", response_model=BusiestMarketsOut, responses=error_responses(401, 422))
async def get_markets(request: Request, limit: Annotated[int, Query(ge=1, le=10_000, description="Most markets listed.")] = 10
                      ) -> dict[str, Any]:
    """Markets holding state, busiest first (token): most ticks seen since each market's state began."""
    eng = service(request).engine
    return {"markets": busiest_markets(eng, limit), "total": eng.pool.used}


@router.get("/markets/{market_id:path}/state", operation_id="market_state", response_model=MarketStateOut,
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
    key = series_key(series)
    png = trace.picture(key)  # the same ticks drawn already (a HEAD before its GET): about half a second saved
    if png is None:
        png = await asyncio.to_thread(raster_png, series)  # the pool of server.worker_threads
        trace.keep_picture(key, png)
    return Response(png, media_type="image/png")



@router.get("/requests", operation_id="request_timelines", response_model=TimelinesOut, responses=error_responses(401, 422))
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


@router.get("/requests/{request_id}", operation_id="request_timeline", response_model=TimelineOut,
            responses=error_responses(401, 404, s404="No timeline kept for that request id (too old, or never seen)."))
async def get_request(request: Request, request_id: Annotated[str, FPath(description="The request's X-Request-ID.")]
                      ) -> dict[str, Any]:
    """One request's timeline (token), found among the recent and the slowest kept."""
    tl = service(request).timelines.get(request_id)
    if tl is None:
        raise RequestNotFoundError(f"no timeline kept for request {request_id!r} (the last {RECENT} requests and the "
                                   "slowest of the last hour or two are kept)", "request_id")
    return tl.as_dict()


@router.get("/backtrace", operation_id="backtrace", response_model=BacktraceOut, responses=error_responses(401))
async def get_backtrace(request: Request) -> dict[str, Any]:
    """The current stack of every thread of the service process (token), innermost frame last.

    Each thread has its frames (file, line, function, source line) and the same as text
    in Python's traceback format. The event loop's own thread shows this handler.
    """
    stacks = thread_stacks()
    return {"pid": os.getpid(), "captured_at": utc_iso(time.time()), "threads": stacks}


@router.get("/config", operation_id="effective_config", response_model=ConfigOut, responses=error_responses(401))
async def get_config(request: Request) -> dict[str, Any]:
    """The effective configuration (token): file, environment overrides and reloads applied, secrets as ``***``."""
    svc = service(request)
    path = svc.config_path
    return {"config_path": str(path) if path else None, "config": redacted_config(svc.cfg),
            "need_restart": list(svc.need_restart)}
