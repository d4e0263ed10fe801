"""/health and /metrics (GET, and HEAD for probes that only look at the status)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from ... import __version__
from ..deps import current_reason, journal_wait_reason, service
from ..openapi import HEADERS, error_responses
from ..schemas import ErrorOut, HealthOut, StartingOut

router = APIRouter(tags=["operations"])

HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    **error_responses(),
    200: {"model": HealthOut, "description": "Ready."},
    503: {"model": HealthOut | StartingOut | ErrorOut, "description": (
        "Not ready (draining at a stop: server.drain_s, requests still answered; shutting down; engine unusable; "
        "the journal waiting for a file descriptor or disk space): the health body with status \"unavailable\" and "
        "its reason; "
        "while starting, before the model is loaded, the short body of StartingOut; or the error shape when "
        "server.max_connections is reached (capacity, with Retry-After)."), "headers": HEADERS[503]},
}
METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    **error_responses(),
    200: {"description": "Prometheus text exposition.", "content": {"text/plain": {"schema": {"type": "string"}}}},
}


def _health(request: Request) -> JSONResponse:
    svc = service(request)
    body: dict[str, Any] = {
        "status": "ok" if svc.ready else "unavailable",
        "version": __version__,
        "model_version": svc.engine.model_version,
        "device": svc.device,
        "uptime_s": round(time.monotonic() - svc.started, 3),
        **svc.engine.health(),
    }
    journal = svc.engine.journal
    if svc.ready and journal is not None and journal.stalled is not None:
        # The journal waits for a file descriptor or disk space: try its next file again here too (at most every
        # 0.25 s for space), not only with the next tick. Behind HAProxy the 503 below takes the replica out of the
        # ring, so no tick reaches it any more: its health checks are what notice that space has returned.
        journal.resume()
    waiting = journal_wait_reason(svc) if svc.ready else None  # ticks refused for now: not ready, not stopping
    if not svc.ready or waiting is not None:
        body["status"] = "unavailable"
        body["reason"] = waiting or svc.not_ready_reason
        return JSONResponse(body, status_code=503)
    reason = current_reason(svc)  # serving a fallback model, or the untrained network: 200, "degraded"
    if reason is not None:
        body["status"] = "degraded"
        body["reason"] = reason
    return JSONResponse(body)


@router.get("/health", operation_id="health", response_class=JSONResponse, responses=HEALTH_RESPONSES)
async def health(request: Request) -> JSONResponse:
    """200 with model, device, uptime, pool and queue when ready; 503 with the reason when not."""
    return _health(request)


@router.head("/health", operation_id="health_head", response_class=JSONResponse, responses=HEALTH_RESPONSES)
async def health_head(request: Request) -> JSONResponse:
    """The status of ``GET /health`` (200 ready, 503 not), with its headers and no body."""
    return _health(request)


def _metrics(request: Request) -> Response:
    return Response(service(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/metrics", operation_id="prometheus_metrics", response_class=PlainTextResponse, responses=METRICS_RESPONSES)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    return _metrics(request)


@router.head("/metrics", operation_id="prometheus_metrics_head", response_class=PlainTextResponse, responses=METRICS_RESPONSES)
async def metrics_head(request: Request) -> Response:
    """The headers of ``GET /metrics``, no body."""
    return _metrics(request)
