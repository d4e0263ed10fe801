"""The OpenAPI document, exact: every status each operation can return, media types, security, limits.

Statuses every HTTP request can get, whatever its route, come from the layers below the
routes: 400 (a request the HTTP parser cannot read, :mod:`.protocol`), 408
(``server.request_timeout``), 413 (``server.max_body_size``), 431 (headers over 64 KiB,
:mod:`.protocol`), 503 (``server.max_connections``) and 500 (an unexpected error).
Operations list them with their own.

Parts of the document follow the running configuration, so :func:`install_openapi`
rebuilds them per request (cheaply, from one cached base document): the bearer security
requirement appears only while a token is configured (without one, the guarded routes
are open), and the most ticks of a batch is ``performance.queue_size`` (it can change on
reload).
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from .deps import ServiceState
from .exposure import has_token
from .schemas import ErrorOut

BATCH_MAX_TICKS = 65_536

DESCRIPTIONS: dict[int, str] = {
    400: "Malformed JSON, or a body that is not UTF-8 (error.type malformed_json); or an HTTP request the server "
         "cannot parse (bad_request; the connection is closed).",
    401: "Missing or wrong bearer token (unauthorized; the answer has WWW-Authenticate: Bearer).",
    404: "No such resource (not_found).",
    408: "The request did not arrive completely within server.request_timeout (request_timeout); the connection is "
         "closed.",
    409: "Conflict with the service's state (error.type says which).",
    413: "Body over server.max_body_size (body_too_large).",
    415: "Body not sent as application/json, or sent with a Content-Encoding (unsupported_media_type).",
    422: "Invalid input; error.field names it (validation).",
    431: "The request line and headers, or the trailers of a chunked body, exceed 64 KiB (headers_too_large); the "
         "connection is closed.",
    500: "Unexpected error (internal); the details are in the log under the request id.",
    503: "Try again later (capacity: server.max_connections reached, queue full, shutting down, or a change of state "
         "while the journal waits for a file descriptor or disk space for its next file, with Retry-After; engine: "
         "the engine failed, or a state write failed and the service stops).",
}
# 503 of the operations that change a state the journal records (ticks, a market's reset, an import, a release, a model
# activation): the journal waiting for a file descriptor or disk space refuses them too.
RECORDED_503 = ("Try again later: capacity, with Retry-After (the journal waits for a file descriptor or disk space for "
                "its next file, a model activation's models/ACTIVE finds no room or a read-only disk, "
                "server.max_connections is reached, or the service is shutting down; nothing changed); or engine (the engine failed, or a state write).")
TICK_503 = ("Try again later: capacity, with Retry-After (the engine's queue is full, the journal waits for a file "
            "descriptor or disk space for its next file, server.max_connections is reached, or the service is shutting "
            "down; nothing changed); market_moving, with Retry-After (the tick's market is moving to another replica: "
            "error.field market_id; nothing changed); or engine (the engine failed: a batch may have been applied in "
            "part, so read the market's last tick before sending it again).")
UPLOAD_503 = ("Try again later: capacity, with Retry-After (no room in the state dir, or a read-only one: nothing "
              "stored; server.max_connections is reached, or the service is shutting down).")
HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "required": True, "schema": {"type": "string", "const": "Bearer"}}},
    503: {"Retry-After": {"description": "Seconds to wait before retrying (capacity errors).",
                          "schema": {"type": "integer", "minimum": 1}}},
}
COMMON = (400, 408, 413, 431, 500, 503)  # every HTTP request can get these (see the module docstring)
# What a common status means on an operation that does not list it itself (400 without a body to read: only bad_request).
COMMON_DESCRIPTIONS: dict[int, str] = {
    400: "An HTTP request the server cannot parse or RFC 9112 refuses (bad_request: a bad request line or version, "
         "Content-Length with Transfer-Encoding, a malformed chunked body, no Host in HTTP/1.1 or two, a transfer "
         "coding other than chunked); the connection is closed.",
}


def error_responses(*codes: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` for error statuses (plus the common ones), each with the JSON error shape.

    ``descriptions`` overrides the text of a status, keyed ``s404`` etc.
    """
    out: dict[int | str, dict[str, Any]] = {}
    for code in sorted({*codes, *COMMON}):
        default = DESCRIPTIONS[code] if code in codes else COMMON_DESCRIPTIONS.get(code, DESCRIPTIONS[code])
        entry: dict[str, Any] = {"model": ErrorOut, "description": descriptions.get(f"s{code}", default)}
        if code in HEADERS:
            entry["headers"] = HEADERS[code]
        out[code] = entry
    return out


def _drop_framework_422(doc: dict[str, Any]) -> None:
    """Remove FastAPI's generic 422 (``HTTPValidationError``) where an operation cannot answer 422 in that shape."""
    for item in doc.get("paths", {}).values():
        for op in item.values():
            r422 = op.get("responses", {}).get("422")
            if r422 and "HTTPValidationError" in str(r422):
                del op["responses"]["422"]
    schemas = doc.get("components", {}).get("schemas", {})
    if "#/components/schemas/HTTPValidationError" not in str(doc.get("paths", {})):
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)


def _errors_as_json(doc: dict[str, Any]) -> None:
    """Error answers are JSON on every route: FastAPI files a ``model`` response under the route's own media type
    (``text/plain`` for ``/metrics``), so move each error-shape response there to ``application/json``."""
    ref = "#/components/schemas/ErrorOut"
    for item in doc.get("paths", {}).values():
        for op in item.values():
            for status, response in op.get("responses", {}).items():
                content = response.get("content", {})
                if not str(status).startswith(("4", "5")) or "application/json" in content:
                    continue
                for media_type in [m for m, v in content.items() if v.get("schema", {}).get("$ref") == ref]:
                    content["application/json"] = content.pop(media_type)


REQUEST_ID_HEADER: dict[str, Any] = {
    "description": "The request's id: the caller's X-Request-ID when it is 1-128 characters of A-Z a-z 0-9 . _ : -, "
                   "else a fresh one (32 hex digits); the request_id of the JSON body and of the log lines.",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
}


def _request_id_everywhere(doc: dict[str, Any]) -> None:
    """Every answer of every operation carries ``X-Request-ID`` (the request context adds it, and so do the answers
    written below the app: 400, 408, 431, the starting 503): declare it on each response."""
    for item in doc.get("paths", {}).values():
        for op in item.values():
            for response in op.get("responses", {}).values():
                response["headers"] = {**response.get("headers", {}), "X-Request-ID": dict(REQUEST_ID_HEADER)}


REQUEST_ID_PARAMETER: dict[str, Any] = {
    "name": "X-Request-ID", "in": "header", "required": False,
    "description": "The caller's id for the request, kept when it is 1-128 characters of A-Z a-z 0-9 . _ : - (else "
                   "replaced by a fresh one): the X-Request-ID of the answer, the request_id of its body and of the log "
                   "lines.",
    "schema": {"type": "string", "examples": ["ord-7f3a"]},
}
def _request_headers(doc: dict[str, Any]) -> None:
    """``X-Request-ID`` as an optional header parameter of every operation: a generated client could not send it
    (openapi-python-client, openapi-typescript: a function's parameters are the document's).

    ``X-Market-ID`` (the tick routes, behind HAProxy) is left out on purpose: a schema-driven client generates it apart
    from the body, so it names another market than the ticks and every such valid-looking tick is refused 422; callers
    that route by it set it as a plain header (docs/http.md, docs/scale-out.md)."""
    for item in doc.get("paths", {}).values():
        for op in item.values():
            op.setdefault("parameters", []).append(dict(REQUEST_ID_PARAMETER))


def _head_without_content(doc: dict[str, Any]) -> None:
    """An answer to HEAD has no content (RFC 9110, section 9.3.2: its status and headers are those of GET), whatever its
    status: FastAPI files the GET route's media types under HEAD too, and a client generated from them reads a JSON
    body that never comes (a JSONDecodeError on every HEAD /health)."""
    for item in doc.get("paths", {}).values():
        for response in item.get("head", {}).get("responses", {}).values():
            response.pop("content", None)


# The document's top level: a tag declared (with what it groups) for each operation's, the server it is served by (the
# service itself, wherever it is reached: through HAProxy too) and the licence of the API.
TAGS: list[dict[str, Any]] = [
    {"name": "neural", "description": "Ticks in, the network's signal out; a market's state forgotten."},
    {"name": "scale-out", "description": "Moving a market's state between replicas (token); docs/scale-out.md."},
    {"name": "training", "description": "Training jobs, stored models, staging and activating a model (token)."},
    {"name": "operations", "description": "Readiness (GET /health) and Prometheus metrics (GET /metrics)."},
    {"name": "debug", "description": "Markets, request timelines, thread stacks and the configuration (token)."},
]
SERVERS: list[dict[str, str]] = [{"url": "/", "description": "The service that serves this document."}]
LICENSE: dict[str, str] = {"name": "Proprietary", "identifier": "LicenseRef-Proprietary"}


INT32 = (-(2**31), 2**31 - 1)


def _integer_formats(node: Any) -> None:
    """Give every integer of the document its size (``format``: ``int32`` when its range fits 32 bits, else
    ``int64``): generators of typed clients read an integer without one as 32 bits (openapi-generator: Java's
    ``Integer``, Go's ``int32``), where a tick's timestamp (ms since the epoch, 1.6e12) or a byte count overflows."""
    if isinstance(node, dict):
        if node.get("type") == "integer" and "format" not in node:
            low, high = node.get("minimum", node.get("exclusiveMinimum")), node.get("maximum", node.get("exclusiveMaximum"))
            fits = low is not None and high is not None and INT32[0] <= low and high <= INT32[1]
            node["format"] = "int32" if fits else "int64"
        for value in node.values():
            _integer_formats(value)
    elif isinstance(node, list):
        for value in node:
            _integer_formats(value)


def live_document(base: dict[str, Any], token: bool, queue_size: int) -> dict[str, Any]:
    """The document for the running configuration: security only with a token, batch size up to the queue.

    An operation that asks for no token says so (``security: []``): linters (redocly's
    ``security-defined``) and readers cannot otherwise tell an open operation from one whose
    security was forgotten.
    """
    doc = copy.deepcopy(base)
    for item in doc.get("paths", {}).values():
        for op in item.values():
            if not token:
                op.pop("security", None)
                op.get("responses", {}).pop("401", None)
            op.setdefault("security", [])
    if not token:
        doc.get("components", {}).pop("securitySchemes", None)
    ticks = doc.get("components", {}).get("schemas", {}).get("BatchIn", {}).get("properties", {}).get("ticks")
    if ticks is not None:
        ticks["maxItems"] = min(BATCH_MAX_TICKS, queue_size)
        ticks["description"] = (f"Ticks in arrival order: at most performance.queue_size ({queue_size}) and "
                                f"{BATCH_MAX_TICKS}, within server.max_body_size.")
    return doc


def install_openapi(app: FastAPI, state: ServiceState) -> None:
    """Serve the exact, configuration-dependent document at ``/openapi.json``."""
    base: dict[str, Any] = {}
    cache: dict[tuple[bool, int], dict[str, Any]] = {}

    def openapi() -> dict[str, Any]:
        if not base:
            # a copy: the passes below edit it, and FastAPI's document holds the routes' own dicts (HEADERS)
            base.update(copy.deepcopy(get_openapi(title=app.title, version=app.version, openapi_version=app.openapi_version,
                                                  description=app.description, routes=app.routes, tags=TAGS,
                                                  servers=SERVERS, license_info=LICENSE)))
            _drop_framework_422(base)
            _errors_as_json(base)
            _head_without_content(base)
            _request_id_everywhere(base)
            _request_headers(base)
            _integer_formats(base)
        key = (has_token(state.cfg), state.engine.queue_size)
        doc = cache.get(key)
        if doc is None:
            doc = cache[key] = live_document(base, *key)
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
