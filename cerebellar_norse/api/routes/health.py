"""/health and /metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from ... import __version__
from ..deps import service

router = APIRouter(tags=["operations"])


@router.get("/health")
async def health(request: Request) -> Any:
    """200 with model, device, uptime, pool and queue when ready; 503 with the reason when not."""
    svc = service(request)
    body: dict[str, Any] = {
        "status": "ok" if svc.ready else "unavailable",
        "version": __version__,
        "model_version": svc.engine.model_version,
        "device": svc.device,
        "uptime_s": round(time.monotonic() - svc.started, 3),
        **svc.engine.health(),
    }
    if not svc.ready:
        body["reason"] = svc.not_ready_reason
        return JSONResponse(body, status_code=503)
    return body


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    return Response(service(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
