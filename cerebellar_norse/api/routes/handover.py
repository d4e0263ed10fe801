"""Scale-out handover of one market's state between replicas (bearer token required when one is configured).

``POST /neural/markets/{id}/export`` (source: freeze, step the admitted ticks, export),
``PUT /neural/markets/{id}/state`` (target: verify and import), ``POST …/release``
(source, after the load balancer switched: forget the state, keep refusing the
market), ``POST …/thaw`` (source: abort a move, or serve a released market here
again) and ``GET /neural/moves`` (the markets refused here). See docs/scale-out.md.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import HTTPException
from fastapi.responses import Response
from pydantic import BaseModel, Field

from ...engine.handover import MEDIA_TYPE, export_market, import_market
from ...errors import InputError, NotMovingError
from ...observability.context import request_id_var
from ...ticks import check_market_id
from ..deps import body_type_problem, require_token, service
from ..openapi import RECORDED_503, error_responses
from .neural import MarketIdPath, MarketNotFoundError

router = APIRouter(prefix="/neural", tags=["scale-out"], dependencies=[Depends(require_token)])
log = logging.getLogger("cerebellar_norse.api.handover")

NO_STATE = "The market holds no state here: never seen, evicted, reset, moved away, or not a valid market id."


class ImportOut(BaseModel):
    """Answer of an import: the market now served here from the imported state."""

    market_id: str
    ticks: int = Field(description="Ticks the market had seen when it was exported.")
    last_timestamp: int = Field(description="Time of its last tick, ms since the epoch.")
    model_version: str
    replaced: bool = Field(description="True when the market held a (now replaced) state here before.")
    request_id: str


class MoveOut(BaseModel):
    """Where a market stands on this replica after a release or thaw."""

    market_id: str
    state: str | None = Field(description='"moved" (refused here: its state lives on another replica), or null '
                                          "(served here).")
    previous: str | None = Field(description='What it was before: "moving", "moved" or null (served here).')
    request_id: str


class MovingMarket(BaseModel):
    """One market refused here."""

    market_id: str
    state: str = Field(description='"moving" (frozen for export, state still here) or "moved" (state elsewhere).')
    since: float | None = Field(description="When it entered that state (seconds since the epoch).")


class MovesOut(BaseModel):
    """The markets this replica refuses ticks of, because they move or moved away."""

    markets: list[MovingMarket]
    request_id: str


@router.post("/markets/{market_id:path}/export", operation_id="export_market", response_class=Response,
             responses={200: {"content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
                              "description": "The market's state: a checksummed .npz (SHA-256 header)."},
                        **error_responses(401, 404, s404=NO_STATE)})
async def export_state(request: Request, market_id: MarketIdPath) -> Response:
    """Freeze one market and export its state (token): from now on its ticks get 503 + Retry-After here.

    Every tick of the market admitted before the freeze is applied first, so the state
    includes each acknowledged tick and no tick is applied after it. Exporting a
    frozen market again returns the same state. ``POST …/thaw`` aborts the move.
    """
    svc = service(request)
    eng = svc.engine
    if eng.pool.table.get(market_id) is None:
        raise MarketNotFoundError(f"market {market_id!r} holds no state here", "market_id")
    svc.moves.freeze(market_id)
    eng.flush_now()  # the admitted ticks of the market are applied before the state is read
    data = export_market(eng, market_id)
    if data is None:  # its last batch evicted it meanwhile (pool full): nothing to move
        svc.moves.thaw(market_id)
        raise MarketNotFoundError(f"market {market_id!r} holds no state here", "market_id")
    # a market refusing its ticks (503 market_moving) is found in the log by its id, with the request that froze it
    log.info("market frozen and exported: its ticks are refused here (503 market_moving) until it is imported back, "
             "thawed (POST /neural/markets/{id}/thaw) or released", extra={"fields": {"market_id": market_id}})
    return Response(data, media_type=MEDIA_TYPE)


@router.put("/markets/{market_id:path}/state", operation_id="import_market", response_model=ImportOut,
            openapi_extra={"requestBody": {"required": True, "content": {
                MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
                "description": "Bytes of POST /neural/markets/{market_id}/export from another replica."}},
            responses=error_responses(401, 409, 415, 422, s503=RECORDED_503,
                                      s409="The state was exported by another network or under another model version, "
                                           "or its last tick is older than the market's last tick here "
                                           "(conflict), or more than server.max_clock_skew_ms ahead of the server "
                                           "clock (future_timestamp); nothing changed.",
                                      s415="Body not sent as application/octet-stream, or sent with a Content-Encoding "
                                           "(unsupported_media_type).",
                                      s422="Corrupt or truncated state (checksum), another market's, or of the wrong "
                                           "shape (validation); nothing changed."))
async def import_state(request: Request, market_id: MarketIdPath) -> dict[str, Any]:
    """Import a market's exported state (token), replacing any it holds here, and serve the market here again.

    Checksum, network fingerprint, model version, market id and shapes are verified
    before anything changes, and a state older (last tick earlier) than the one the market
    holds here is refused (409); the imported state is checkpointed at once.
    """
    problem = body_type_problem(request, MEDIA_TYPE)
    if problem is not None:
        raise HTTPException(415, problem)
    svc = service(request)
    body = await request.body()
    svc.engine.flush_now()  # the market's admitted ticks are in the state the import is compared with (and replaces)
    summary = import_market(svc.engine, market_id, body, svc.cfg.server.max_clock_skew_ms)
    svc.moves.thaw(market_id)
    return {**summary, "request_id": request_id_var.get()}


@router.post("/markets/{market_id:path}/release", operation_id="release_market", response_model=MoveOut,
             responses=error_responses(401, 409, s503=RECORDED_503, s409="The market is not frozen for a move here (export it first); "
                                                      "nothing changed."))
async def release(request: Request, market_id: MarketIdPath) -> dict[str, Any]:
    """Forget an exported market's state here (token), once another replica imported it and is routed to.

    The market stays refused here (503 + Retry-After, state ``moved``) until it is
    imported back, thawed, or the service restarts.
    """
    svc = service(request)
    previous = svc.moves.state(market_id)
    if previous is None:
        raise NotMovingError(f"market {market_id!r} is not being moved here (export it first)", "market_id")
    svc.engine.reset_market(market_id)
    svc.moves.hold(market_id)
    log.info("market released: its state is forgotten here and its ticks stay refused (503 market_moving) until it is "
             "imported back or thawed", extra={"fields": {"market_id": market_id, "previous": previous}})
    return {"market_id": market_id, "state": "moved", "previous": previous, "request_id": request_id_var.get()}


@router.post("/markets/{market_id:path}/thaw", operation_id="thaw_market", response_model=MoveOut,
             responses=error_responses(401, 404, s404="Not a valid market id."))
async def thaw(request: Request, market_id: MarketIdPath) -> dict[str, Any]:
    """Serve a market here again (token): aborts a move (its state was kept), or lifts the refusal of a released one."""
    try:
        check_market_id(market_id)
    except InputError:
        raise MarketNotFoundError(f"{market_id!r} is not a valid market id", "market_id") from None
    previous = service(request).moves.thaw(market_id)
    if previous is not None:
        log.info("market thawed: its ticks are served here again", extra={"fields": {"market_id": market_id,
                                                                                     "previous": previous}})
    return {"market_id": market_id, "state": None, "previous": previous, "request_id": request_id_var.get()}


@router.get("/moves", operation_id="moving_markets", response_model=MovesOut, responses=error_responses(401))
async def moves(request: Request) -> dict[str, Any]:
    """The markets refused here because their state is moving or moved to another replica (token)."""
    return {"markets": service(request).moves.listing(), "request_id": request_id_var.get()}
