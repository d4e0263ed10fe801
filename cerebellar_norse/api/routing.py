"""Route paths match the whole request path, whatever characters it holds.

Starlette compiles each route's path into a regular expression ending in ``$``, which
also matches just before a final newline, and its ``path`` parameters (``.*``) stop at a
newline. Left so, ``DELETE /neural/markets/ABC%0A`` would reset the market ``ABC`` (the
newline dropped from the id), ``POST /training%0A`` would start a job, and a market id
with a newline inside it would match no route (a bare "Not Found" instead of the
route's own answer naming the market).

FastAPI compiles the paths of included routers when the first request is matched, with
the ``compile_path`` of its own module, and offers no hook for it. So
:func:`install_exact_paths` replaces that function, in FastAPI's module and in
Starlette's, by one whose expressions end only at the end of the path (``\\Z``) and whose
parameters match any character; the routes' own checks then answer for ids that are not
valid market ids. It must run before the app's routes are compiled.

A route's own words are matched as sent (:func:`keep_route_words_as_sent`): only the ids in a path may be
percent-encoded. Starlette matches the decoded path, so ``/neural/%70rocess`` and ``/neural%2Fprocess`` were
served as ``/neural/process``; a proxy that selects requests by their path as sent (HAProxy's ``path`` ACLs
route ticks and batches by market) did not see a tick there, balanced it to any replica, and that replica applied
it to a market whose state lives on another one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import fastapi.routing
import starlette.routing
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

Compiled = tuple[re.Pattern[str], str, dict[str, Any]]
SCOPE_AS_SENT = "cerebellar_norse.path_as_sent"  # True where keep_route_words_as_sent kept the path as sent


def exact_pattern(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """``pattern`` (from Starlette's ``compile_path``: ``^…$``) anchored at the very end, ``.`` matching newlines."""
    source = pattern.pattern
    if source.endswith(r"\Z"):
        return pattern
    if not source.endswith("$"):
        raise ValueError(f"not a compiled route path (no final $): {source!r}")
    return re.compile(source[:-1] + r"\Z", pattern.flags | re.DOTALL)


def exact_compiler(compile_path: Callable[[str], Compiled]) -> Callable[[str], Compiled]:
    """``compile_path`` with :func:`exact_pattern` applied to the expression it returns."""
    def compile_exact(path: str) -> Compiled:
        regex, path_format, convertors = compile_path(path)
        return exact_pattern(regex), path_format, convertors

    compile_exact.exact = True  # type: ignore[attr-defined]
    return compile_exact


def install_exact_paths() -> None:
    """Make every route compiled from now on in this process match only whole paths (idempotent)."""
    for module in (starlette.routing, fastapi.routing):
        current = module.compile_path
        if not getattr(current, "exact", False):
            module.compile_path = exact_compiler(current)  # type: ignore[attr-defined]


def keep_route_words_as_sent(scope: Scope, routes: Iterable[BaseRoute]) -> None:
    """Match ``scope`` to the route its path names as sent: where the route its decoded path reaches (the first of
    ``routes`` to match it, as the router picks: a full match first, else one of another method) does not match the
    path as sent, with its percent-encodings kept, ``scope["path"]`` becomes that path, which no route has (``404``,
    or ``405`` where it names an id of a route of other methods). A percent-encoding inside an id
    (``/neural/markets/BTC%2FUSD``) keeps its route, and the route reads the id decoded."""
    raw = scope.get("raw_path")
    if not raw or b"%" not in raw:
        return
    sent = raw.decode("latin-1")
    if sent == scope["path"]:
        return
    chosen = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            chosen = route
            break
        if match is Match.PARTIAL and chosen is None:
            chosen = route
    if chosen is not None and chosen.matches({**scope, "path": sent})[0] is Match.NONE:
        scope["path"] = sent
        scope[SCOPE_AS_SENT] = True
