"""Request ids: one per request, carried in a context variable for logs."""

from __future__ import annotations

import itertools
import os
import re
from contextvars import ContextVar

request_id_var: ContextVar[str] = ContextVar("request_id", default="")
_VALID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


_PREFIX = os.urandom(8).hex()  # random per process: ids of two processes (or restarts) never meet
_COUNTER = itertools.count(int.from_bytes(os.urandom(4)))


def new_request_id() -> str:
    """A fresh request id: 32 hex characters, a random per-process half and a counter.

    Unique without a system call per request (``uuid4`` reads the kernel's random source
    every time, a few µs on the hot path); request ids identify, they are not secrets.
    """
    return f"{_PREFIX}{next(_COUNTER) & 0xFFFFFFFFFFFFFFFF:016x}"


def accept_request_id(header: str | None) -> str:
    """The caller's ``X-Request-ID`` when it is 1–128 safe characters, else a fresh id."""
    if header and _VALID.match(header):
        return header
    return new_request_id()
