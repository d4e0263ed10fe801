"""/neural/process, /neural/process/batch, /neural/stream, /neural/metrics."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, Field, ValidationError

from ...errors import CerebellarNorseError, InputError
from ...observability.context import new_request_id, request_id_var
from ...observability.timelines import SENT, Timeline
from ...ticks import MARKET_ID_MAX, MARKET_ID_PATTERN
from ..deps import SCOPE_REQUEST_ID, SCOPE_TIMELINE, JsonBodyRoute, require_token, service
from ..errors import service_error, validation_response
from ..openapi import RECORDED_503, TICK_503, error_responses
from ..schemas import (
    TICK_STRINGS,
    BatchIn,
    BatchOut,
    MarketResetOut,
    ResultOut,
    TickIn,
    parse_tick,
    refuse_repeated_keys,
    tick_errors,
)
from ..tickpath import JSON_TYPE, answer_batch, answer_tick

STREAM_PATH = "/neural/stream"

TICK_ERRORS = error_responses(
    400, 409, 415, 422,
    s409="The tick conflicts with the service's state, which is left unchanged: older than its market's last tick "
         "(out_of_order), or more than server.max_clock_skew_ms ahead of the server clock (future_timestamp).",
    s422="Invalid field, named in error.field (validation); for a batch also more ticks than performance.queue_size.",
    s503=TICK_503,
)


# The path parameter's schema states the market id rule; an id breaking it names no market (404).
MarketIdPath = Annotated[str, Path(description="The market, as in its ticks (URL-encoded, e.g. BTC%2FUSD).",
                                   json_schema_extra={"minLength": 1, "maxLength": MARKET_ID_MAX,
                                                      "pattern": MARKET_ID_PATTERN})]


class MarketNotFoundError(InputError):
    """The market holds no state (never seen, evicted or reset) (HTTP 404)."""

    status_code = 404


router = APIRouter(prefix="/neural", tags=["neural"], route_class=JsonBodyRoute)
markets_router = APIRouter(prefix="/neural", tags=["neural"], dependencies=[Depends(require_token)])


@router.post("/process", operation_id="process_tick", response_model=ResultOut, responses={
    **TICK_ERRORS, 200: {"description": "The network's answer.", "links": {"ResetMarket": {
        "operationId": "reset_market", "parameters": {"market_id": "$response.body#/market_id"},
        "description": "Forget the state of the tick's market."}}}})
async def process(tick: TickIn, request: Request) -> Response:
    """Process one tick of a market and return the network's signal.

    (Served by the ASGI fast path, which shares this route's implementation:
    :func:`~cerebellar_norse.api.tickpath.answer_tick`.)
    """
    refuse_repeated_keys(await request.body(), TICK_STRINGS)
    body = await answer_tick(service(request), tick, request.headers.get("x-market-id"), request.scope.get(SCOPE_TIMELINE))
    return Response(body, media_type=JSON_TYPE)


@router.post("/process/batch", operation_id="process_batch", response_model=BatchOut, responses=TICK_ERRORS)
async def process_batch(batch: BatchIn, request: Request) -> Response:
    """Process many ticks in order; one bad tick fails the whole batch before any state changes."""
    refuse_repeated_keys(await request.body(), 1 + TICK_STRINGS * len(batch.ticks))  # "ticks", then each tick's
    body = await answer_batch(service(request), batch, request.headers.get("x-market-id"), request.scope.get(SCOPE_TIMELINE))
    return Response(body, media_type=JSON_TYPE)


class PerPopulation(BaseModel):
    """A figure of each spiking population."""

    granule: int
    purkinje: int
    dcn: int


class PerPopulationRate(BaseModel):
    """A rate of each spiking population."""

    granule: float
    purkinje: float
    dcn: float


class NeuralFiguresOut(BaseModel):
    """The figures of ``GET /neural/metrics``, since the start."""

    spike_counts: PerPopulation = Field(description="Spikes of each population.")
    spikes_per_tick: PerPopulationRate = Field(description="Spikes of each population per tick.")
    sparsity: float | None = Field(description="Fraction of granule cells spiking per step (null before the first tick).")
    target_sparsity: float = Field(description="neural.target_sparsity.")
    markets: int = Field(description="Markets holding state.")
    ticks: int
    batches: int
    mean_batch_size: float | None = Field(description="Ticks per engine batch (null before the first).")
    model_version: str = Field(description="The model answering ticks.")
    live_evaluation: dict[str, Any] | None = Field(
        description="The served model's live scores on the ticks it answered (null when disabled).")


class NeuralMetricsOut(BaseModel):
    """Answer of ``GET /neural/metrics``."""

    neural_metrics: NeuralFiguresOut


@router.get("/metrics", operation_id="neural_metrics", response_model=NeuralMetricsOut, responses=error_responses())
async def neural_metrics(request: Request) -> dict[str, Any]:
    """Spike counts per population, granule sparsity, live markets and the live evaluation (None when disabled)."""
    svc = service(request)
    eng = svc.engine
    st = eng.stats
    s = eng.params.shape
    steps = eng.params.steps_per_tick
    denom = max(st.ticks, 1) * steps
    return {"neural_metrics": {
        "spike_counts": {"granule": int(st.spikes[0]), "purkinje": int(st.spikes[1]), "dcn": int(st.spikes[2])},
        "spikes_per_tick": {"granule": st.spikes[0] / max(st.ticks, 1), "purkinje": st.spikes[1] / max(st.ticks, 1),
                            "dcn": st.spikes[2] / max(st.ticks, 1)},
        "sparsity": float(st.spikes[0] / (denom * s.granule)) if st.ticks else None,
        "target_sparsity": svc.cfg.neural.target_sparsity,
        "markets": eng.pool.used,
        "ticks": st.ticks,
        "batches": st.batches,
        "mean_batch_size": st.ticks / st.batches if st.batches else None,
        "model_version": eng.model_version,
        "live_evaluation": eng.scorer.snapshot() if eng.scorer is not None else None,
    }}


@markets_router.delete("/markets/{market_id:path}", response_model=MarketResetOut, operation_id="reset_market",
                       responses=error_responses(401, 404, s503=RECORDED_503, s404="The market holds no state: never seen, evicted, "
                                                                 "reset already, or not a valid market id."))
async def reset_market(request: Request, market_id: MarketIdPath) -> dict[str, Any]:
    """Forget one market's state: its next tick starts from rest, with any timestamp (token).

    The way out for a market whose clock a wrong tick moved ahead. Ticks of the market
    already queued are applied after the reset.
    """
    if not service(request).engine.reset_market(market_id):
        raise MarketNotFoundError(f"market {market_id!r} holds no state", "market_id")
    return {"market_id": market_id, "reset": True, "request_id": request_id_var.get()}


@router.websocket("/stream")
async def stream(ws: WebSocket) -> None:
    """One JSON tick in, one JSON result out; a bad message gets an error object, the socket stays open.

    Ticks may come as text or binary (UTF-8 JSON) frames; answers are text frames.
    """
    svc = ws.app.state.service
    header = ws.headers.get("x-market-id")  # how the load balancer routed it; an empty one names the market "", as on
    # HTTP (every tick then refused). A ?market_id= given twice counts by its first, as HAProxy's url_param reads it
    # (the query's last, as Starlette reads it, admitted the ticks of a market HAProxy had routed by the first).
    queried = ws.query_params.getlist("market_id")
    market = header if header is not None else (queried[0] if queried else None)
    routed_by = "X-Market-ID header" if header is not None else "?market_id= of the stream"
    await ws.accept(headers=[(b"x-request-id", ws.scope[SCOPE_REQUEST_ID].encode("latin-1"))])  # (the middleware's)
    svc.metrics.stream_connections.inc()
    try:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            text = message.get("text")
            if text is None:
                text = message.get("bytes") or b""
            rid = new_request_id()
            request_id_var.set(rid)
            timeline = Timeline(rid, STREAM_PATH, time.perf_counter_ns())
            try:
                answer = await answer_tick(svc, parse_tick(text), market, timeline, routed_by)
                await ws.send_text(answer.decode())
                timeline.marks[SENT] = time.perf_counter_ns()
                timeline.status = 200
                svc.timelines.finish(timeline)
            except ValidationError as exc:
                _, body = validation_response(tick_errors(exc, text), text)
                svc.metrics.errors.labels(body["error"]["type"]).inc()
                await ws.send_text(json.dumps(body))
            except CerebellarNorseError as exc:
                err = service_error(exc)
                svc.metrics.errors.labels(err.kind).inc()
                await ws.send_text(json.dumps(err.payload(rid)))
    except WebSocketDisconnect:
        pass
    finally:
        svc.metrics.stream_connections.dec()
