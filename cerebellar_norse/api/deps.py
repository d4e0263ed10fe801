"""Shared pieces of the routes: the service state and the bearer-token check."""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from ..config import Config
from ..engine.engine import Engine
from ..errors import CerebellarNorseError
from ..observability.metrics import ServiceMetrics


class AuthError(CerebellarNorseError):
    """Missing or wrong bearer token (HTTP 401)."""


@dataclass
class ServiceState:
    """Everything the routes need, attached to ``app.state.service``."""

    cfg: Config
    engine: Engine
    metrics: ServiceMetrics
    device: str
    ready: bool = False
    not_ready_reason: str = "starting"
    started: float = field(default_factory=time.monotonic)
    extra: dict[str, Any] = field(default_factory=dict)


def service(request: Request) -> ServiceState:
    """The service state of the app serving ``request``."""
    svc: ServiceState = request.app.state.service
    return svc


def check_token(cfg: Config, authorization: str | None) -> None:
    """Raise AuthError unless ``Authorization: Bearer <token>`` matches (when a token is configured)."""
    token = cfg.server.api_token
    if token is None:
        return
    expected = token.get_secret_value().encode()
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
        raise AuthError("missing or invalid bearer token (send Authorization: Bearer <token>)")


def require_token(request: Request) -> None:
    """FastAPI dependency for routes that change state or expose internals."""
    check_token(service(request).cfg, request.headers.get("authorization"))
