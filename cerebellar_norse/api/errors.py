"""Mapping of errors to JSON responses: 4xx naming the field for bad input, never a traceback."""

from __future__ import annotations

import errno
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..errors import (
    HOST_SHORTAGE_RETRY_S,
    CapacityError,
    CerebellarNorseError,
    EngineFatalError,
    InputError,
    MarketMovingError,
    StorageError,
    TickOrderError,
    host_shortage_reason,
    quoted,
)
from ..observability.context import request_id_var
from ..ticks import TS_MAX_MS, TS_MIN_MS, FutureTickError
from .deps import AuthError
from .routing import SCOPE_AS_SENT
from .schemas import NotUtf8Error, error_payload, loads_utf8

log = logging.getLogger("cerebellar_norse.api")


def _field_of(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts)


def input_error_kind(exc: InputError) -> str:
    """``error.type`` of an InputError: by its class and status, not by the status alone (409 is not always order)."""
    if isinstance(exc, TickOrderError):
        return "out_of_order"
    if isinstance(exc, FutureTickError):
        return "future_timestamp"
    return {404: "not_found", 409: "conflict"}.get(exc.status_code, "validation")


NOT_UTF8 = "the body is not UTF-8 text"
SHOWN_INPUT = 200  # characters of a refused value shown in a validation message
TOO_DEEP = "arrays or objects are nested too deeply"
OBJECT_EXPECTED = frozenset({"model_type", "model_attributes_type", "dict_type"})


def undecodable(exc: BaseException | None) -> str:
    """Why a body that is not JSON could not be decoded, when no JSON syntax error says it (see :func:`json_problem`)."""
    if isinstance(exc, RecursionError):
        return TOO_DEEP
    if isinstance(exc, ValueError) and not isinstance(exc, UnicodeDecodeError):  # int()'s limit on digits
        return f"a number has more than {sys.get_int_max_str_digits()} digits"
    return NOT_UTF8


def json_problem(body: str | bytes) -> str | None:
    """What is wrong with a body that is not JSON, with its place (``... at line L column C``); None if it parses.

    Both tick paths word a malformed body this way, whichever parser found it.
    """
    try:
        loads_utf8(body)
    except NotUtf8Error:
        return NOT_UTF8
    except json.JSONDecodeError as exc:
        return f"{exc.msg.removesuffix(' at')} at line {exc.lineno} column {exc.colno}"  # "…starting at" + " at line"
    except (ValueError, TypeError, RecursionError) as exc:
        return undecodable(exc)
    return None


def validation_response(errors: list[dict[str, Any]], body: str | bytes | None = None) -> tuple[int, dict[str, Any]]:
    """Status and body for pydantic errors: the first error, its field, all messages.

    ``body``: the request body, which words a JSON syntax error (see :func:`json_problem`).
    """
    rid = request_id_var.get()
    if not errors:
        return 422, error_payload("validation", "invalid request", rid)
    first = errors[0]
    field = _field_of(tuple(first.get("loc", ())))
    if first.get("type") == "json_invalid":
        why = json_problem(body) if body is not None else None
        return 400, error_payload("malformed_json", f"request body is not valid JSON: {why or first.get('ctx', {}).get('error', first.get('msg'))}", rid)
    if first.get("type") == "extra_forbidden":
        return 422, error_payload("validation", "unknown field", rid, field)
    if first.get("type") == "missing" and not field:
        return 422, error_payload("validation", "request body is missing", rid)
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")  # a validator's own words
    if first.get("type") in OBJECT_EXPECTED:  # worded differently by pydantic's JSON and Python modes
        msg = "must be a JSON object"
    if "input" in first and not isinstance(first["input"], (dict, list)):
        got = repr(first["input"])
        if len(got) > SHOWN_INPUT:  # a 1 MB field is not echoed back whole
            got = f"{got[:SHOWN_INPUT]}… ({len(got)} characters)"
        msg += f" (got {got})"
    if field.rsplit(".", 1)[-1] == "timestamp" and first.get("type") in ("greater_than_equal", "less_than"):
        msg += timestamp_hint(first.get("input"))
    return 422, error_payload("validation", msg, rid, field or None)


# what a tick timestamp out of range most likely was: a time in another unit, and how to make it ms (ms per unit as
# a fraction: an integer of hundreds of digits, which JSON allows, times a float overflowed)
_OTHER_UNITS = (("seconds", 1000, 1, "multiply it by 1000"), ("µs", 1, 1000, "divide it by 1000"),
                ("ns", 1, 1_000_000, "divide it by 1000000"))


def timestamp_hint(value: Any) -> str:
    """Words added to the refusal of a tick timestamp out of range (ms since the Unix epoch, 1971..2100): the unit
    ``value`` is most likely in and how to convert it, when it is a time of that range in seconds, µs or ns."""
    hint = "; a timestamp is ms since the Unix epoch (1971..2100)"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return hint
    for unit, num, den, fix in _OTHER_UNITS:
        if TS_MIN_MS * den <= value * num < TS_MAX_MS * den:
            return f"{hint}: this one looks like {unit}, {fix}"
    return hint


@dataclass(frozen=True)
class ServiceErrorResponse:
    """How one of the service's own errors is answered (HTTP, the hot path and the stream alike)."""

    status: int
    kind: str
    message: str
    field: str | None = None
    headers: dict[str, str] = dc_field(default_factory=dict)

    def payload(self, request_id: str) -> dict[str, Any]:
        """The JSON error body."""
        return error_payload(self.kind, self.message, request_id, self.field)


HOST_SHORTAGE_LOG_S = 60.0  # a shortage is said at WARNING at most this often (the others at DEBUG): no flood
_shortage_said = [-HOST_SHORTAGE_LOG_S]


def host_shortage(exc: BaseException) -> str | None:
    """The message answering a request that failed because the host could not give it a thread, a process, memory or
    a file descriptor for now (503 ``capacity``: ``RuntimeError("can't start new thread")``, ``MemoryError``, an
    OSError EAGAIN, ENOMEM, EMFILE or ENFILE that nothing handled, or EINTR: a system call a signal interrupted that
    Python does not make again); None for any other error. Said in one WARNING
    line, at most every :data:`HOST_SHORTAGE_LOG_S` (no traceback: nothing is wrong with the service's code)."""
    reason = host_shortage_reason(exc)
    if reason is None and isinstance(exc, OSError) and exc.errno == errno.EINTR:
        reason = StorageError.os_reason(exc)  # a call Python does not make again, e.g. listing a directory
    if reason is None:
        return None
    now = time.monotonic()
    level = logging.WARNING if now - _shortage_said[0] >= HOST_SHORTAGE_LOG_S else logging.DEBUG
    if level == logging.WARNING:
        _shortage_said[0] = now
    log.log(level, "request refused (503 capacity): the host is short of threads, processes, memory or file "
            "descriptors: %s; raise the service's task or open-file limit (TasksMax=, LimitNOFILE=) or free memory "
            "if this persists (said at most once a minute)", reason)
    return (f"the host cannot give this request a thread, a process, memory or a file descriptor now ({reason}): "
            "try again")


def unexpected_error_response(exc: BaseException, request_id: str, count_error: Callable[[str], Any]) -> JSONResponse:
    """The answer to an error nothing handled (call it where the error is being handled, for its traceback): 503
    ``capacity`` with ``Retry-After`` when the host was short of a thread, process, memory or descriptor for the
    request (:func:`host_shortage`: the service itself is fine), else 500 ``internal``, logged with its traceback.
    ``count_error(kind)`` counts it."""
    short = host_shortage(exc)
    if short is not None:
        count_error("capacity")
        return JSONResponse(error_payload("capacity", short, request_id), status_code=503,
                            headers={"Retry-After": str(round(HOST_SHORTAGE_RETRY_S))})
    count_error("internal")
    log.exception("unexpected error")
    return JSONResponse(error_payload("internal", "internal error (logged with this request id)", request_id),
                        status_code=500)


def service_error(exc: CerebellarNorseError) -> ServiceErrorResponse:
    """Status, ``error.type``, message, field and headers of an error from the errors tree."""
    if isinstance(exc, InputError):
        return ServiceErrorResponse(exc.status_code, input_error_kind(exc), exc.message, exc.field or None)
    if isinstance(exc, AuthError):
        return ServiceErrorResponse(401, "unauthorized", str(exc), headers={"WWW-Authenticate": "Bearer"})
    if isinstance(exc, MarketMovingError):
        return ServiceErrorResponse(503, "market_moving", str(exc), "market_id",
                                    headers={"Retry-After": str(max(1, round(exc.retry_after_s)))})
    if isinstance(exc, CapacityError):
        return ServiceErrorResponse(503, "capacity", str(exc), headers={"Retry-After": str(max(1, round(exc.retry_after_s)))})
    if isinstance(exc, EngineFatalError):
        if not (isinstance(exc, StorageError) and exc.reported):  # the journal's failure: logged once, when it failed
            log.error("engine error: %s", exc)
        return ServiceErrorResponse(503, "engine", str(exc))
    log.error("unhandled service error: %s", exc)
    return ServiceErrorResponse(500, "internal", str(exc))


# error.type of the HTTP-level errors raised by the framework (an unlisted status would be "http").
HTTP_ERROR_KINDS = {400: "malformed_json", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
                    413: "body_too_large", 415: "unsupported_media_type"}


_HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def allowed_methods(request: Request, starlette_allow: str = "") -> str:
    """Every method of the request's path for a 405's ``Allow`` header (``GET, HEAD``): Starlette names those of the
    first route of the path only. Read from the OpenAPI document's paths (which list every operation), with
    Starlette's own list kept: the operations of the path's template, as a client of the document sees the
    resource (``DELETE /neural/markets/A/export`` resets the market ``A/export``, another resource)."""
    table: list[tuple[re.Pattern[str], set[str]]] | None = getattr(request.app.state, "allow_table", None)
    if table is None:
        table = []
        for template, ops in request.app.openapi().get("paths", {}).items():
            regex = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
            table.append((re.compile(regex), {m.upper() for m in ops if m in _HTTP_METHODS}))
        request.app.state.allow_table = table
    methods = {m.strip() for m in starlette_allow.split(",") if m.strip()}
    for compiled, ops in table:
        if compiled.fullmatch(request.url.path):
            methods |= ops
    return ", ".join(sorted(methods))


def shown_path(request: Request) -> str:
    """The request's path as an error message shows it: quoted, control characters escaped, at most
    :data:`SHOWN_INPUT` characters of it."""
    return quoted(request.scope["path"], SHOWN_INPUT)  # (request.url.path drops tabs and newlines, as urllib does)


def install_error_handlers(app: FastAPI, count_error: Any, websocket_paths: frozenset[str] = frozenset()) -> None:
    """Register handlers turning every error into the JSON error shape (``websocket_paths``: the app's WebSocket
    routes, which a plain HTTP request finds no route at)."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        raw = exc.body if isinstance(exc.body, (str, bytes)) else None
        status, body = validation_response(list(exc.errors()), raw)
        count_error(body["error"]["type"])  # malformed_json (400) or validation (422), as on the hot path
        return JSONResponse(body, status_code=status)

    @app.exception_handler(CerebellarNorseError)
    async def _service(request: Request, exc: CerebellarNorseError) -> JSONResponse:
        err = service_error(exc)
        count_error(err.kind)
        return JSONResponse(err.payload(request_id_var.get()), status_code=err.status, headers=err.headers or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, ClientDisconnect):  # FastAPI's 400 for a body that never came: nobody to answer
            raise exc.__cause__
        kind = HTTP_ERROR_KINDS.get(exc.status_code, "http")
        message = str(exc.detail)
        if exc.status_code == 400:  # FastAPI's answer to a body it cannot decode (not UTF-8, too deep, too long a number)
            message = f"request body is not valid JSON: {undecodable(exc.__cause__)}"
        headers = getattr(exc, "headers", None)
        if exc.status_code == 404 and message == "Not Found":  # the router's: no route has this path
            message = f"no route has the path {shown_path(request)} (the API's routes: /openapi.json)"
            if request.scope.get(SCOPE_AS_SENT):  # a route's words percent-encoded (routing.keep_route_words_as_sent)
                message += "; a route's own words are matched as sent: percent-encode only the ids in a path"
            if request.scope["path"] in websocket_paths:
                message = f"{shown_path(request)} is a WebSocket: open it with a handshake (GET with Upgrade: websocket)"
        if exc.status_code == 405:  # Starlette names the methods of the first route of the path only (GET, not HEAD)
            allow = allowed_methods(request, (headers or {}).get("Allow", ""))
            headers = {**(headers or {}), "Allow": allow}
            message = f"method {request.method} is not allowed on {shown_path(request)}: use {allow}"
        count_error(kind)
        return JSONResponse(error_payload(kind, message, request_id_var.get()), status_code=exc.status_code,
                            headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return unexpected_error_response(exc, request_id_var.get(), count_error)
