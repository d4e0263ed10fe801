"""Body limits of the bulk uploads of scale-out, which carry more than a tick request.

``server.max_body_size`` bounds every request body. Two token-guarded uploads carry
more by nature: a market's exported state (``PUT /neural/markets/{id}/state``, about
``state_per_market`` bytes: 32 MB per market in production) and a model archive
(``PUT /models/{version}``, about the weights' size). With a ``Content-Length`` they
may exceed ``server.max_body_size`` up to what they can legitimately hold; the token
is still checked by the route before the body is read.
"""

from __future__ import annotations

from starlette.types import Scope

from ..config import Config, estimate_memory

SLACK_BYTES = 1 << 20  # headers of the .npz archive, JSON metadata (bytes)


def bulk_body_limit(scope: Scope, cfg: Config) -> int:
    """The largest body accepted for this request when it is a bulk upload, else 0 (bytes)."""
    if scope.get("method") != "PUT":
        return 0
    path: str = scope.get("path", "")
    if path.startswith("/neural/markets/") and path.endswith("/state"):
        return estimate_memory(cfg).state_per_market + SLACK_BYTES
    if path.startswith("/models/") and path.count("/") == 2:
        return 2 * estimate_memory(cfg).weights + SLACK_BYTES
    return 0
