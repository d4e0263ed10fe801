"""/debug/…: live introspection of the running service (bearer token required when one is configured).

Read-only: nothing here changes the service's state or runs code sent by a caller.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from ...observability.debugtools import SpikeTracker, market_state
from ..deps import require_token, service
from ..openapi import error_responses
from .neural import MarketIdPath, MarketNotFoundError

router = APIRouter(prefix="/debug", tags=["debug"], dependencies=[Depends(require_token)])


@router.get("/markets/{market_id:path}/state", operation_id="market_state",
            responses=error_responses(401, 404, s404="The market holds no state: never seen, evicted, reset, or not a "
                                                     "valid market id."))
async def get_market_state(request: Request, market_id: MarketIdPath) -> dict[str, Any]:
    """One market's state (token): encoder statistics, last tick, membrane summaries per population, spike counts, warm-up.

    Read between two batches (one consistent state). Spike counts are kept from the
    first state request on (see docs/operations.md, Debugging).
    """
    svc = service(request)
    tracker = SpikeTracker.attach(svc.engine, svc.extra)
    state = market_state(svc.engine, market_id, tracker)
    if state is None:
        raise MarketNotFoundError(f"market {market_id!r} holds no state", "market_id")
    return state
