"""Request ids: one per request, carried in a context variable for logs."""

from __future__ import annotations

import re
import uuid
from contextvars import ContextVar

request_id_var: ContextVar[str] = ContextVar("request_id", default="")
_VALID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def new_request_id() -> str:
    """A fresh random request id (32 hex characters)."""
    return uuid.uuid4().hex


def accept_request_id(header: str | None) -> str:
    """The caller's ``X-Request-ID`` when it is 1–128 safe characters, else a fresh id."""
    if header and _VALID.match(header):
        return header
    return new_request_id()
