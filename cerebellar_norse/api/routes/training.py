"""/training jobs and /models (bearer token required when one is configured)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from ...training.checkpoints import ModelStore
from ...training.jobs import TrainingRequest
from ..deps import GuardedJsonBodyRoute, require_token, service
from ..modelswap import swap_in, verified_model
from ..openapi import RECORDED_503, error_responses
from ..schemas import TrainingStartedOut, refuse_repeated_keys

router = APIRouter(tags=["training"], dependencies=[Depends(require_token)], route_class=GuardedJsonBodyRoute)

JOB_NOT_FOUND = "No such training job (or none yet, for latest)."


JOB_LINK = {"job_id": "$response.body#/job_id"}


@router.post("/training", operation_id="start_training", status_code=202, responses={**error_responses(
    400, 401, 404, 409, 415, 422, s404="A file of the request is not in the data dir.",
    s409="A job is already running (conflict)."), 202: {"description": "The job started.", "model": TrainingStartedOut, "links": {
        "JobStatus": {"operationId": "training_status", "parameters": JOB_LINK},
        "CancelJob": {"operationId": "cancel_training", "parameters": JOB_LINK}}}})
async def start_training(req: TrainingRequest, request: Request) -> JSONResponse:
    """Start a training job on CSV files of the data dir; 202 with its job_id."""
    refuse_repeated_keys(await request.body())
    job = service(request).job_manager().start(req)
    return JSONResponse({"job_id": job.job_id, "state": job.state, "status_url": f"/training/status/{job.job_id}"},
                        status_code=202)


@router.get("/training/status/{job_id}", operation_id="training_status", responses=error_responses(401, 404, s404=JOB_NOT_FOUND))
async def training_status(job_id: str, request: Request) -> dict[str, Any]:
    """State, progress, epoch, loss history, validation metrics, ETA and error of a job (``latest`` works)."""
    result: dict[str, Any] = service(request).job_manager().get(job_id).as_dict()
    return result


@router.delete("/training/{job_id}", operation_id="cancel_training", responses=error_responses(401, 404, s404=JOB_NOT_FOUND))
async def cancel_training(job_id: str, request: Request) -> dict[str, Any]:
    """Cancel a running job; no model is written."""
    job = await service(request).job_manager().cancel(job_id)
    result: dict[str, Any] = job.as_dict()
    return result


@router.get("/models", operation_id="list_models", responses=error_responses(401))
async def list_models(request: Request) -> dict[str, Any]:
    """Stored model versions with their validation metrics, and the active one."""
    svc = service(request)
    models = await asyncio.to_thread(_listing, svc.model_store())  # each read and hashed: off the event loop
    return {"active": svc.engine.model_version, "models": models}


def _listing(store: ModelStore) -> list[dict[str, Any]]:
    """Every stored model, verified: its validation metrics, or why it is invalid."""
    models = []
    for v in store.versions():
        try:
            m = store.load(v)
            models.append({"version": v, "valid": True, "validation": m.metrics.get("validation")})
        except Exception as exc:  # listed as invalid, never served
            models.append({"version": v, "valid": False, "error": str(exc)})
    return models


@router.post("/models/{version}/activate", operation_id="activate_model", responses=error_responses(
    401, 404, 422, s503=RECORDED_503, s404="No stored model of that version.",
    s422="The stored model is corrupt or does not fit the running network (validation)."))
async def activate(version: str, request: Request) -> dict[str, Any]:
    """Serve a stored model (verified first); swapped in between batches."""
    svc = service(request)
    store = svc.model_store()
    model = await asyncio.to_thread(verified_model, store, version, svc.cfg.neural)  # read and hashed off the loop
    swap_in(svc, store, model)  # on the loop: between two batches
    return {"active": svc.engine.model_version}
