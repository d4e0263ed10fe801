"""/neural/process, /neural/process/batch, /neural/stream, /neural/metrics."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from ...errors import CerebellarNorseError, InputError
from ...observability.context import new_request_id, request_id_var
from ...ticks import MARKET_ID_MAX, MARKET_ID_PATTERN
from ..deps import JsonBodyRoute, check_ticks, require_token, service
from ..errors import service_error, validation_response
from ..openapi import error_responses
from ..schemas import BatchIn, BatchOut, MarketResetOut, ResultOut, TickIn

log = logging.getLogger("cerebellar_norse.api")

TICK_ERRORS = error_responses(
    400, 409, 415, 422,
    s409="The tick conflicts with the service's state, which is left unchanged: older than its market's last tick "
         "(out_of_order), or more than server.max_clock_skew_ms ahead of the server clock (future_timestamp).",
    s422="Invalid field, named in error.field (validation); for a batch also more ticks than performance.queue_size.",
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


@router.post("/process", response_model=ResultOut, responses={
    **TICK_ERRORS, 200: {"description": "The network's answer.", "links": {"ResetMarket": {
        "operationId": "reset_market", "parameters": {"market_id": "$response.body#/market_id"},
        "description": "Forget the state of the tick's market."}}}})
async def process(tick: TickIn, request: Request) -> dict[str, Any]:
    """Process one tick of a market and return the network's signal."""
    svc = service(request)
    t = tick.to_tick()
    check_ticks(svc, (t,), batch=False, market_header=request.headers.get("x-market-id"))
    result = await svc.engine.submit(t)
    result["request_id"] = request_id_var.get()
    if log.isEnabledFor(logging.DEBUG):
        log.debug("tick processed", extra={"fields": {"market_id": tick.market_id, "processing_time_ns": result["processing_time_ns"]}})
    return result


@router.post("/process/batch", response_model=BatchOut, responses=TICK_ERRORS)
async def process_batch(batch: BatchIn, request: Request) -> dict[str, Any]:
    """Process many ticks in order; one bad tick fails the whole batch before any state changes."""
    svc = service(request)
    rid = request_id_var.get()
    ticks = [t.to_tick() for t in batch.ticks]
    check_ticks(svc, ticks, batch=True, market_header=request.headers.get("x-market-id"))
    results = await svc.engine.submit_many(ticks)
    for r in results:
        r["request_id"] = rid
    return {"results": results, "request_id": rid}


@router.get("/metrics", responses=error_responses())
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
                       responses=error_responses(401, 404, s404="The market holds no state: never seen, evicted, "
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
    market = ws.headers.get("x-market-id") or ws.query_params.get("market_id")  # how the load balancer routed it
    await ws.accept()
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
            try:
                t = TickIn.model_validate_json(text).to_tick()
                check_ticks(svc, (t,), batch=False, market_header=market)
                result = await svc.engine.submit(t)
                result["request_id"] = rid
                await ws.send_text(ResultOut.model_validate(result).model_dump_json())
            except ValidationError as exc:
                _, body = validation_response([dict(e) for e in exc.errors(include_url=False)])
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
