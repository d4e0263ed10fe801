"""``PUT /models/{version}``: stage a model archive sent by ``cerebellar-norse rollout`` (token).

The model is stored, verified, and not activated: ``POST /models/{version}/activate``
does that, on every replica once every replica has staged it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi import Path as FPath
from fastapi.exceptions import HTTPException
from pydantic import BaseModel, Field

from ...observability.context import request_id_var
from ...training.archive import MEDIA_TYPE, stage_archive
from ...training.checkpoints import ModelStore
from ..deps import body_type_problem, require_token, service
from ..openapi import UPLOAD_503, error_responses

router = APIRouter(tags=["training"], dependencies=[Depends(require_token)])

# check_version's rule, stated in the document; a version with a "/" (sent as %2F) names no route: 404.
VersionPath = Annotated[str, FPath(description="The model version (letters, digits, '-', '_', '.'; at most 128; not "
                                               "starting with '.'; not ACTIVE).",
                                   json_schema_extra={"minLength": 1, "maxLength": 128,
                                                      "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"})]


class StagedOut(BaseModel):
    """A staged model: stored and verified, not active."""

    version: str
    stored: bool = Field(description="False when the same model was stored already (nothing written).")
    active: str = Field(description="The model answering ticks (unchanged by staging).")
    request_id: str


@router.put("/models/{version}", operation_id="stage_model", response_model=StagedOut,
            openapi_extra={"requestBody": {"required": True, "content": {
                MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
                "description": "A model archive (cerebellar-norse rollout)."}},
            responses=error_responses(401, 404, 409, 415, 422, s503=UPLOAD_503,
                                      s404="No such route: the version holds a '/' (sent as %2F), which no model "
                                           "version can (not_found).",
                                      s409="Another model is stored under this version (conflict); nothing changed.",
                                      s415="Body not sent as application/octet-stream, or sent with a Content-Encoding "
                                           "(unsupported_media_type).",
                                      s422="Corrupt archive, invalid version, or a model that does not fit this "
                                           "service's network (validation); nothing changed."))
async def stage_model(version: VersionPath, request: Request) -> dict[str, Any]:
    """Store a model archive as ``version`` after verifying it (token); it is not activated."""
    problem = body_type_problem(request, MEDIA_TYPE)
    if problem is not None:
        raise HTTPException(415, problem)
    svc = service(request)
    store = svc.store or ModelStore(Path(svc.cfg.paths.state_dir))
    stored = await asyncio.to_thread(stage_archive, store, version, await request.body(), svc.cfg)  # server.worker_threads
    return {"version": version, "stored": stored, "active": svc.engine.model_version, "request_id": request_id_var.get()}
