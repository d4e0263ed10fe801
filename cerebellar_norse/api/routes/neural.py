"""/neural/process, /neural/process/batch, /neural/stream, /neural/metrics."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.exceptions import HTTPException
from fastapi.routing import APIRoute
from pydantic import ValidationError

from ...errors import CerebellarNorseError
from ...observability.context import new_request_id, request_id_var
from ..deps import service
from ..errors import service_error, validation_response
from ..schemas import BatchIn, BatchOut, ErrorOut, ResultOut, TickIn

log = logging.getLogger("cerebellar_norse.api")

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "Malformed JSON."},
    409: {"model": ErrorOut, "description": "Tick older than the market's last tick (state unchanged)."},
    413: {"model": ErrorOut, "description": "Body too large."},
    415: {"model": ErrorOut, "description": "Content type is not application/json."},
    422: {"model": ErrorOut, "description": "Invalid field (named in error.field)."},
    503: {"model": ErrorOut, "description": "Queue full or engine unavailable (Retry-After)."},
}


def require_json(request: Request) -> None:
    """Raise 415 unless the request's body is ``application/json``."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";", 1)[0].strip().lower() != "application/json":
        raise HTTPException(415, f"content type must be application/json, got {ctype or 'none'!r}")


class JsonBodyRoute(APIRoute):
    """A route whose POST requests must be ``application/json``: checked before FastAPI reads and validates the body.

    (In the endpoint the check would come too late: a text/plain body fails validation
    first, with 422. A route wrapper costs less per request than a FastAPI dependency.)
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if "POST" not in (self.methods or ()):
            return handler

        async def json_only(request: Request) -> Response:
            require_json(request)
            return await handler(request)

        return json_only


router = APIRouter(prefix="/neural", tags=["neural"], route_class=JsonBodyRoute)


@router.post("/process", response_model=ResultOut, responses=ERRORS)
async def process(tick: TickIn, request: Request) -> dict[str, Any]:
    """Process one tick of a market and return the network's signal."""
    svc = service(request)
    result = await svc.engine.submit(tick.to_tick())
    result["request_id"] = request_id_var.get()
    if log.isEnabledFor(logging.DEBUG):
        log.debug("tick processed", extra={"fields": {"market_id": tick.market_id, "processing_time_ns": result["processing_time_ns"]}})
    return result


@router.post("/process/batch", response_model=BatchOut, responses=ERRORS)
async def process_batch(batch: BatchIn, request: Request) -> dict[str, Any]:
    """Process many ticks in order; one bad tick fails the whole batch before any state changes."""
    svc = service(request)
    rid = request_id_var.get()
    results = await svc.engine.submit_many([t.to_tick() for t in batch.ticks])
    for r in results:
        r["request_id"] = rid
    return {"results": results, "request_id": rid}


@router.get("/metrics")
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


@router.websocket("/stream")
async def stream(ws: WebSocket) -> None:
    """One JSON tick in, one JSON result out; a bad message gets an error object, the socket stays open.

    Ticks may come as text or binary (UTF-8 JSON) frames; answers are text frames.
    """
    svc = ws.app.state.service
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
                tick = TickIn.model_validate_json(text)
                result = await svc.engine.submit(tick.to_tick())
                result["request_id"] = rid
                await ws.send_text(ResultOut.model_validate(result).model_dump_json())
            except ValidationError as exc:
                _, body = validation_response([dict(e) for e in exc.errors(include_url=False)])
                svc.metrics.errors.labels("validation").inc()
                await ws.send_text(json.dumps(body))
            except CerebellarNorseError as exc:
                err = service_error(exc)
                svc.metrics.errors.labels(err.kind).inc()
                await ws.send_text(json.dumps(err.payload(rid)))
    except WebSocketDisconnect:
        pass
    finally:
        svc.metrics.stream_connections.dec()
