"""/training jobs and /models (bearer token required when one is configured)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, WithJsonSchema

from ...training.checkpoints import ModelSummary
from ...training.jobs import JobStateName, TrainingRequest
from ..deps import GuardedJsonBodyRoute, require_token, service
from ..modelswap import swap_in, verified_model
from ..openapi import RECORDED_503, error_responses
from ..schemas import TrainingStartedOut, refuse_repeated_keys

router = APIRouter(tags=["training"], dependencies=[Depends(require_token)], route_class=GuardedJsonBodyRoute)

JOB_NOT_FOUND = "No such training job (or none yet, for latest)."
# a UTC time to the second; the format on the string itself, so that a nullable one's is inside its anyOf's string
UtcTime = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time", "examples": ["2026-11-27T03:15:22Z"]})]


class TrainingStatusOut(BaseModel):
    """A training job (``GET /training/status/{job_id}``, ``DELETE /training/{job_id}``); times are UTC, to the second."""

    job_id: str
    state: JobStateName = Field(description="queued, running, then succeeded, failed or cancelled.")
    files: list[str] = Field(description="The request's CSV files, relative to paths.data_dir.")
    created: UtcTime
    started: UtcTime | None
    finished: UtcTime | None
    progress: float = Field(description="0..1.")
    epoch: int = Field(description="Epochs done.")
    epochs: int
    loss: float | None = Field(description="The last epoch's training loss (null before the first, or not finite).")
    loss_history: list[float | None] = Field(description="Each epoch's loss (null where it was not finite).")
    validation: dict[str, Any] | None = Field(description="Validation metrics of the best epoch (accuracy, log loss, ...).")
    validation_history: list[dict[str, Any]]
    active_model_validation: dict[str, Any] | None = Field(
        description="The active model's metrics on the same validation data, when there is one to compare.")
    edge: str | None = Field(description="How the model compares with the active one and the baselines, in words.")
    test: dict[str, Any] | None = Field(description="Metrics on the held-out test split, when the job made one.")
    ticks_per_second: float | None
    eta_s: float | None = Field(description="Seconds to the end, estimated.")
    model_version: str | None = Field(description="The stored model, once the job succeeded.")
    activated: bool = Field(description="Whether the new model was activated (TrainingRequest.activate).")
    warnings: list[str]
    error: str | None = Field(description="Why the job failed.")
    report: list[str] = Field(description="What was read of the data, line by line.")
    last_progress_at: UtcTime | None = Field(
        description="When the job's process last reported progress (after each training step; its start before the "
                    "first), UTC; null for a job that never ran. A long gap is normal during an epoch's validation "
                    "pass or while a large file is read: see stalled_s.")
    stalled_s: float | None = Field(
        description="Seconds the running job has reported no progress and its process used no CPU time (stopped, "
                    "frozen in a cgroup, hung in D state on a dead mount), once at least training.stall_warning_s; "
                    "null otherwise. End a stalled job with DELETE /training/{job_id}.")


class StoredModelOut(BaseModel):
    """One stored model of ``GET /models``."""

    version: str
    valid: bool = Field(description="False when its files do not verify: listed, never served.")
    validation: dict[str, Any] | None = Field(None, description="Its validation metrics (valid models).")
    edge: str | None = Field(None, description='What training found on validation (valid models): "none" (no edge: '
                             'the model answers its base rates, the same probabilities and prediction at every tick), '
                             '"flat" or "direction"; null for a model stored without it.')
    verdict: dict[str, Any] | None = Field(None, description='Its test split\'s verdict {"action", "reason"} (valid '
                                           'models), as train and evaluate say it; null for a model stored without it.')
    error: str | None = Field(None, description="Why it is not valid (invalid models).")


class ModelsOut(BaseModel):
    """Answer of ``GET /models``."""

    active: str = Field(description="The model answering ticks.")
    models: list[StoredModelOut]


class ActivatedOut(BaseModel):
    """Answer of ``POST /models/{version}/activate``."""

    active: str = Field(description="The model answering ticks now.")


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


@router.get("/training/status/{job_id}", operation_id="training_status", response_model=TrainingStatusOut, responses=error_responses(401, 404, s404=JOB_NOT_FOUND))
async def training_status(job_id: str, request: Request) -> dict[str, Any]:
    """State, progress, epoch, loss history, validation metrics, ETA and error of a job (``latest`` works)."""
    result: dict[str, Any] = service(request).job_manager().get(job_id).as_dict()
    return result


@router.delete("/training/{job_id}", operation_id="cancel_training", response_model=TrainingStatusOut, responses=error_responses(401, 404, s404=JOB_NOT_FOUND))
async def cancel_training(job_id: str, request: Request) -> dict[str, Any]:
    """Cancel a running job; no model is written."""
    job = await service(request).job_manager().cancel(job_id)
    result: dict[str, Any] = job.as_dict()
    return result


@router.get("/models", operation_id="list_models", response_model=ModelsOut, responses=error_responses(401))
async def list_models(request: Request) -> dict[str, Any]:
    """Stored model versions with their validation metrics, and the active one."""
    svc = service(request)
    summaries = await asyncio.to_thread(svc.model_store().summaries)  # read and hashed (once each): off the event loop
    return {"active": svc.engine.model_version, "models": [_listed(m) for m in summaries]}


def _listed(m: ModelSummary) -> dict[str, Any]:
    """A stored model as GET /models lists it: its validation metrics, edge and verdict, or why it is invalid."""
    if m.error is not None:
        return {"version": m.version, "valid": False, "error": m.error}
    test = m.metrics.get("test")
    return {"version": m.version, "valid": True, "validation": m.metrics.get("validation"), "edge": m.metrics.get("edge"),
            "verdict": test.get("verdict") if isinstance(test, dict) else None}


@router.post("/models/{version}/activate", operation_id="activate_model", response_model=ActivatedOut, responses=error_responses(
    401, 404, 422, s503=RECORDED_503, s404="No stored model of that version.",
    s422="The stored model is corrupt or does not fit the running network (validation)."))
async def activate(version: str, request: Request) -> dict[str, Any]:
    """Serve a stored model (verified first); swapped in between batches."""
    svc = service(request)
    store = svc.model_store()
    model = await asyncio.to_thread(verified_model, store, version, svc.cfg.neural)  # read and hashed off the loop
    swap_in(svc, store, model)  # on the loop: between two batches
    return {"active": svc.engine.model_version}
