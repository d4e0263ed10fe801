"""A small HTTP client of the service, for one replica or HAProxy in front of many.

Every request carries ``X-Market-ID``, by which HAProxy routes it to the replica that
holds the market's state. A batch of several markets is split into one request per
market (in the order of each market's first tick; each market's ticks keep their
order), since behind HAProxy a request reaches the replica of one market only; the
results come back in the order of the input ticks. Each part is atomic for its market;
when a later part fails, the earlier parts stay applied and the error says which
markets were (:attr:`BatchPartError.applied`) and carries their results
(:attr:`BatchPartError.results`).

Ticks may hold numpy or ``Decimal`` numbers (``np.float32``, ``np.int64`` from a DataFrame):
they are sent as JSON numbers. A tick that cannot be sent at all (a market id that is not
1-64 printable ASCII characters, which no header can carry; a non-finite price, volume or
timestamp, which JSON cannot) raises :class:`~cerebellar_norse.errors.InputError` naming the field
before anything is sent.

Errors are the service's own exception tree (:mod:`cerebellar_norse.errors`):
:class:`~cerebellar_norse.errors.InputError` for a refused tick or request (4xx; a
:class:`~cerebellar_norse.errors.TickOrderError` for ``out_of_order``),
:class:`~cerebellar_norse.errors.MarketMovingError` (503 ``market_moving``: the market's
state is moving between replicas) and :class:`~cerebellar_norse.errors.CapacityError`
(other 503s, a proxy's 503 that delivered nothing, and a proxy's ``429`` rate limit) with the
server's ``Retry-After``, and :class:`~cerebellar_norse.errors.EngineFatalError` for an
unreachable service (nothing was sent); its subclass :class:`OutcomeUnknownError` when a
request was sent but its outcome is unknown: no answer came (a read timeout, a dropped
connection) or the answer was a 5xx other than the 503s above (``500 internal``, ``503
engine``, a proxy's ``502``/``504`` after it forwarded the request): its ticks may have been
applied, and ticks of equal timestamps are applied again, so do not resend them blindly.
Field names of a split batch's errors (``ticks.3.price``) count the ticks as the caller
passed them.

Example::

    from cerebellar_norse.client import Client

    with Client("http://127.0.0.1:8080") as c:
        r = c.process({"price": 100.0, "volume": 1000.0, "timestamp": 1640995200000, "market_id": "TEST"})
        print(r["prediction"])
"""

from __future__ import annotations

import copy
import json
import math
import numbers
import os
import time
import weakref
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, NotRequired, TypedDict, cast

import httpx

from .errors import (
    BatchPartError,
    CapacityError,
    CerebellarNorseError,
    EngineFatalError,
    InputError,
    MarketMovingError,
    OutcomeUnknownError,
    TickOrderError,
)
from .httpcalls import bearer
from .ticks import check_market_id

__all__ = [
    "BatchPartError", "CapacityError", "CerebellarNorseError", "Client", "EngineFatalError", "Health", "InputError",
    "MarketMovingError", "OutcomeUnknownError", "PoolHealth", "Probabilities", "Tick", "TickAnswer", "TickOrderError",
]

Tick = Mapping[str, Any]


class Probabilities(TypedDict):
    """Class probabilities of the return over the prediction horizon; they sum to 1."""

    down: float
    flat: float
    up: float


class TickAnswer(TypedDict):
    """One tick's result, as docs/http.md documents it (``POST /neural/process``): a plain ``dict`` at run time."""

    market_id: str
    prediction: float  # P(up) - P(down), in [-1, 1]
    probabilities: Probabilities
    confidence: float  # 1 - entropy / ln 3, in [0, 1]
    spike_count: int  # spikes of all populations during the tick
    processing_time_ns: int  # network time of the tick, nanoseconds
    warming_up: bool  # the market has seen fewer than neural.warmup_ticks ticks
    model_version: str
    request_id: str


class PoolHealth(TypedDict):
    """The market state pool of ``GET /health``."""

    markets: int  # markets holding a state slot
    capacity: int  # state slots
    usage: float  # markets / capacity
    evictions: int  # markets evicted since start
    bytes: int  # memory of the pool, bytes


class Health(TypedDict):
    """``GET /health``, as docs/http.md documents it: a plain ``dict`` at run time (the service may add fields).

    While the service starts (before the model is loaded) only ``status``, ``reason``, ``version`` and ``uptime_s``
    are present; ``reason`` is present when ``status`` is not ``"ok"``.
    """

    status: str  # "ok", "degraded" (200, with reason) or "unavailable" (503, with reason)
    version: str  # of cerebellar-norse
    uptime_s: float  # since the service started, seconds
    reason: NotRequired[str]
    model_version: NotRequired[str]
    device: NotRequired[str]  # "cpu" or "cuda"
    pool: NotRequired[PoolHealth]
    queue_depth: NotRequired[int]  # ticks waiting for a batch
    queue_capacity: NotRequired[int]  # performance.queue_size
    accepting: NotRequired[bool]  # False once shutdown has begun


def _json_number(o: Any) -> Any:
    """A number json cannot write itself (numpy scalars, ``Decimal``) as a Python int or float."""
    if isinstance(o, numbers.Integral):
        return int(o)
    if isinstance(o, (numbers.Real, Decimal)):
        return float(o)
    raise TypeError(f"a {type(o).__name__} cannot be sent as JSON")


def checked_market(tick: Tick, where: str = "") -> str:
    """The market id of ``tick``, after checking that the tick can be sent (InputError naming the field if not).

    ``where`` prefixes the field names (``ticks.3.``).
    """
    if not isinstance(tick, Mapping):
        raise InputError(f"a tick must be a mapping (dict), got {type(tick).__name__}", where.rstrip(".") or "tick")
    market = check_market_id(tick.get("market_id"), f"{where}market_id")
    for key in ("price", "volume", "timestamp"):
        value = tick.get(key)
        if type(value) is float and math.isfinite(value):
            continue  # the common case, without the numbers ABCs' slower isinstance checks
        if key == "timestamp" and isinstance(value, numbers.Integral):
            continue  # an integer is finite; its range is the service's check
        if isinstance(value, (numbers.Real, Decimal)) and not isinstance(value, bool):
            try:
                finite = math.isfinite(float(value))
            except (ValueError, OverflowError):  # Decimal("sNaN"); an int beyond a float's range
                finite = False
            if not finite:
                shown = repr(value)
                raise InputError(f"must be finite, got {shown if len(shown) <= 60 else shown[:57] + '...'}", f"{where}{key}")
    return market


def _in_input_order(exc: CerebellarNorseError, idx: list[int]) -> CerebellarNorseError:
    """``exc`` of one market's part of a split batch, its ``ticks.K.`` field renamed to the tick's place in the caller's list."""
    if not isinstance(exc, InputError):
        return exc
    head, _, rest = exc.field.partition(".")
    pos, _, tail = rest.partition(".")
    if head != "ticks" or not pos.isdigit() or int(pos) >= len(idx):
        return exc
    renamed = copy.copy(exc)  # same class and attributes (status, retry hints), only the field and text change
    renamed.field = f"ticks.{idx[int(pos)]}" + (f".{tail}" if tail else "")
    renamed.args = (f"{renamed.field}: {exc.message}",)
    return with_request_id(renamed, exc.request_id)


_ENCODER = json.JSONEncoder(default=_json_number, allow_nan=False, separators=(",", ":"))
"""One encoder for every body (``json.dumps`` with options builds a new one at each call)."""


def encode(body: Any) -> bytes:
    """The JSON request body (numpy and ``Decimal`` numbers as numbers); InputError when it cannot be written."""
    try:
        return _ENCODER.encode(body).encode()
    except (TypeError, ValueError) as exc:
        raise InputError(f"the request cannot be sent as JSON: {exc}") from None


def encode_ticks(body: Any, ticks: Sequence[Tick], wheres: Sequence[str]) -> bytes:
    """:func:`encode` of a body holding ``ticks``; the InputError of a value that cannot be sent names its field
    (``wheres[k]`` prefixes the fields of ``ticks[k]``: ``""`` or ``ticks.3.``)."""
    try:
        return encode(body)
    except InputError:
        for tick, where in zip(ticks, wheres, strict=True):
            for key, value in tick.items():
                try:
                    json.dumps(value, default=_json_number, allow_nan=False)
                except (TypeError, ValueError) as exc:
                    raise InputError(f"cannot be sent as JSON: {exc}", f"{where}{key}") from None
        raise


def request_id_of(r: httpx.Response) -> str:
    """The id the service answered ``r`` under (its ``X-Request-ID``), else the one the request was sent with."""
    return r.headers.get("x-request-id") or r.request.headers.get("x-request-id", "")


def with_request_id(exc: CerebellarNorseError, request_id: str) -> CerebellarNorseError:
    """``exc`` carrying ``request_id`` (attribute, and at the end of its message) when there is one."""
    if request_id:
        exc.request_id = request_id
        exc.args = (f"{exc.args[0] if exc.args else exc} (request_id {request_id})", *exc.args[1:])
    return exc


def error_from_response(r: httpx.Response) -> CerebellarNorseError:
    """The service's error of an unsuccessful response, as an exception of :mod:`cerebellar_norse.errors`
    carrying the request's id (:attr:`~cerebellar_norse.errors.CerebellarNorseError.request_id`), the service's
    ``error.type`` (:attr:`~cerebellar_norse.errors.CerebellarNorseError.error_type`, ``""`` for an answer that
    is not the service's error) and the HTTP status
    (:attr:`~cerebellar_norse.errors.CerebellarNorseError.http_status`)."""
    try:
        body = r.json()
    except ValueError:
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):  # not the service's error shape (a proxy's JSON or HTML): its status decides
        err = {}
    exc = _error_of(r, err)
    kind = err.get("type")
    exc.error_type = kind if isinstance(kind, str) else ""
    exc.http_status = r.status_code
    return with_request_id(exc, request_id_of(r))


def _error_of(r: httpx.Response, err: dict[str, Any]) -> CerebellarNorseError:
    kind = str(err.get("type") or "http")
    said = err.get("message") or (f"{r.request.method} {r.request.url} answered {r.text[:200]!r}, not the service's "
                                  f"error (another server or a proxy: check the URL)" if r.text.strip() else
                                  f"{r.request.method} {r.request.url} answered with an empty body, not the service's "
                                  f"error (another server or a proxy: check the URL)")
    message = f"HTTP {r.status_code} {kind}: {said}"
    field = str(err.get("field") or "")
    market = r.request.headers.get("x-market-id", "")
    if r.status_code in (429, 503):
        try:
            retry = float(r.headers.get("Retry-After", "1"))
        except ValueError:
            retry = 1.0
        if not math.isfinite(retry) or retry < 0:
            retry = 1.0
        if kind == "market_moving":
            return MarketMovingError(market, message, retry)
        if kind in ("capacity", "http") or r.status_code == 429:
            # "http": a proxy's own 503 (HAProxy: no replica up) or 429 (rate limit); nothing was delivered
            return CapacityError(message, retry)
    if kind == "out_of_order":
        return TickOrderError(message, field)
    if 400 <= r.status_code < 500:
        exc = InputError(message, field)
        exc.status_code = r.status_code
        return exc
    if r.status_code >= 500 and r.request.method == "POST":
        # The request reached the service (or a proxy forwarded it): a 500, an engine failure after part of a
        # batch was stepped, a proxy's 502 or 504 (its replica died or stalled while processing) say nothing
        # about whether the ticks were applied.
        return OutcomeUnknownError(market, f"{message} (the request was delivered, so its tick(s) may have been "
                                           f"applied: check the market before resending)")
    return EngineFatalError(message)


def _answer(r: httpx.Response, market: str, n_results: int | None) -> Any:
    """The JSON of a 200 to a tick route: one result (an object), or ``{"results": [n_results objects]}``.

    Anything else (not JSON, another shape: a proxy or another service answering) is an
    :class:`OutcomeUnknownError`, since the request was delivered somewhere.
    """
    try:
        body = r.json()
    except ValueError:
        body = None
    if n_results is None:
        ok = isinstance(body, dict) and "market_id" in body
    else:
        results = body.get("results") if isinstance(body, dict) else None
        ok = isinstance(results, list) and len(results) == n_results and all(isinstance(x, dict) for x in results)
    if not ok:
        want = "a tick's result" if n_results is None else f"the results of {n_results} tick(s)"
        raise with_request_id(OutcomeUnknownError(
            market, f"POST {r.request.url} of market {market!r}: HTTP 200 that "
                    f"is not {want} ({r.text[:200]!r}); its tick(s) may have been applied: check the market before "
                    f"resending"), request_id_of(r))
    return body


_OPEN_CLIENTS: weakref.WeakSet[Client] = weakref.WeakSet()
"""Every :class:`Client` of this process, for :func:`_forked`."""


def _forked() -> None:
    """In the child of ``os.fork()`` (``multiprocessing``'s ``fork`` start method too): every client opens new
    connections at its next request instead of sharing its parent's sockets."""
    for client in list(_OPEN_CLIENTS):
        client._inherited = True


os.register_at_fork(after_in_child=_forked)

CONNECT_RETRY_FIRST_S = 0.1
"""Wait before the first retry of a connection that could not be made, seconds; doubled at each retry."""


def _real(value: object, name: str) -> float:
    """``value`` as a float when it is a finite real number (not a bool), else an InputError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise InputError(f"must be a finite number of seconds, got {value!r}", name)
    return float(value)


def _check_arguments(base_url: object, token: object, timeout_s: object, retries: object, max_wait_s: object,
                     keepalive_s: object) -> None:
    """InputError naming the argument of :class:`Client` that no request could be sent with, at construction: a
    URL without ``http://`` or a token with a line break cannot fail at the first tick as if it had been sent."""
    if not isinstance(base_url, str):
        raise InputError(f"must be a URL string such as 'http://127.0.0.1:8080', got {type(base_url).__name__}",
                         "base_url")
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise InputError(f"is not a URL ({exc}): {base_url!r}", "base_url") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise InputError(f"must start with http:// or https:// and name a host, e.g. 'http://127.0.0.1:8080', got "
                         f"{base_url!r}", "base_url")
    if token is not None and not (isinstance(token, str) and token.isascii() and token.isprintable()):
        raise InputError("must be a string of printable ASCII characters (an HTTP header carries it) or None",
                         "token")
    if _real(timeout_s, "timeout_s") <= 0:
        raise InputError(f"must be > 0 seconds, got {timeout_s!r}", "timeout_s")
    if isinstance(retries, bool) or not isinstance(retries, numbers.Integral) or retries < 0:
        raise InputError(f"must be a whole number >= 0, got {retries!r}", "retries")
    if _real(max_wait_s, "max_wait_s") < 0:
        raise InputError(f"must be >= 0 seconds, got {max_wait_s!r}", "max_wait_s")
    if _real(keepalive_s, "keepalive_s") < 0:
        raise InputError(f"must be >= 0 seconds, got {keepalive_s!r}", "keepalive_s")


class Client:
    """A synchronous client of ``base_url`` (a replica, or HAProxy in front of the replicas).

    Args:
        base_url: e.g. ``http://127.0.0.1:8080``.
        token: bearer token for the guarded routes (not needed for ticks).
        timeout_s: seconds, > 0: the longest wait of each phase of a request (connecting, sending, each wait for
            bytes of the answer), not of the whole call.
        retries: how often a request that was not delivered is tried again: a 503 with ``Retry-After``
            (queue full, market moving, starting) or a proxy's 429 after waiting what the server asked
            (capped at ``max_wait_s``); a refused connection, a connect or pool timeout (nothing was
            sent: a replica restarting) after 0.1 s, 0.2 s, 0.4 s, ... (capped at ``max_wait_s``).
            Nothing else is retried (a read timeout, a dropped connection, any other 5xx: the tick may
            have been applied).
        max_wait_s: longest wait before one retry, seconds.
        keepalive_s: seconds an idle connection is kept for the next request; an older one is closed and a new one
            opened. Keep it below the idle timeout of what the client talks to (``server.keep_alive_timeout``, 75 s;
            HAProxy's ``timeout http-keep-alive``, else its ``timeout http-request``, 10 s as shipped): a request sent
            on a connection the server closes at that moment is never read, and raises
            :class:`OutcomeUnknownError` (nothing tells it from a service that died after reading it).
        transport: an httpx transport (tests).
    """

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 10.0, retries: int = 0,
                 max_wait_s: float = 5.0, transport: httpx.BaseTransport | None = None, keepalive_s: float = 5.0) -> None:
        _check_arguments(base_url, token, timeout_s, retries, max_wait_s, keepalive_s)
        self._opts: dict[str, Any] = {"base_url": base_url, "timeout": timeout_s, "headers": bearer(token),
                                      "limits": httpx.Limits(max_connections=100, max_keepalive_connections=20,
                                                            keepalive_expiry=keepalive_s),
                                      "transport": transport}
        self.http = httpx.Client(**self._opts)
        self._inherited = False  # set in a child process forked from the one that opened self.http's connections
        self.retries = retries
        self.max_wait_s = max_wait_s
        _OPEN_CLIENTS.add(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections (in a forked child that has not sent a request yet: none of its own to close; the
        parent's stay open for the parent)."""
        if not self._inherited:
            self.http.close()

    def _connections(self) -> httpx.Client:
        """``self.http``; in a process forked after it opened connections, a new pool of its own first.

        The parent's kept-alive sockets are shared with the child after ``os.fork()``: two processes writing
        requests to one socket and reading each other's answers (a tick's result handed to the wrong process,
        a garbled answer). The child leaves the inherited pool alone (not closed: its lock may be held by a
        thread of the parent that the child does not have) and opens connections of its own.
        """
        if self._inherited:
            self._inherited = False
            self.http = httpx.Client(**self._opts)
        return self.http

    def _post(self, path: str, data: bytes, market: str, n_results: int | None) -> Any:
        """POST ``data`` to ``path``; the answer's JSON, checked to be one result (``n_results`` None) or a batch of
        ``n_results`` results."""
        http = self._connections()
        attempt = 0
        while True:
            rid = os.urandom(16).hex()  # each try its own id: the service's log and /debug/requests tell them apart
            try:
                r = http.post(path, content=data, headers={"X-Market-ID": market, "Content-Type": "application/json",
                                                           "X-Request-ID": rid})
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:  # nothing was sent
                if attempt < self.retries:
                    time.sleep(min(CONNECT_RETRY_FIRST_S * 2 ** attempt, self.max_wait_s))
                    attempt += 1
                    continue
                tries = f" ({attempt + 1} tries)" if attempt else ""
                raise EngineFatalError(
                    f"cannot reach {self.http.base_url}{tries}: {type(exc).__name__}: {exc}") from None
            except httpx.HTTPError as exc:
                raise with_request_id(OutcomeUnknownError(
                    market, f"POST {path} of market {market!r} to {self.http.base_url}: no answer ({type(exc).__name__}: "
                            f"{exc or 'no detail'}); the request was sent, so its tick(s) may have been applied: check the "
                            f"market before resending"), rid) from None
            if r.status_code == 200:
                return _answer(r, market, n_results)
            err = error_from_response(r)
            if isinstance(err, CapacityError) and attempt < self.retries:
                attempt += 1
                time.sleep(min(err.retry_after_s, self.max_wait_s))
                continue
            raise err

    def process(self, tick: Tick) -> TickAnswer:
        """One tick (``price``, ``volume``, ``timestamp`` in ms, ``market_id``); its result."""
        market = checked_market(tick)
        result: TickAnswer = self._post("/neural/process", encode_ticks(dict(tick), [tick], [""]), market, None)
        return result

    def process_batch(self, ticks: Sequence[Tick]) -> list[TickAnswer]:
        """Many ticks, split into one request per market; results in the order of ``ticks`` (none for none: an
        empty list sends nothing)."""
        parts: dict[str, list[int]] = {}
        for j, t in enumerate(ticks):
            parts.setdefault(checked_market(t, f"ticks.{j}."), []).append(j)
        # every part is written before any is sent: a tick that cannot be sent must not leave earlier parts applied
        bodies = {market: encode_ticks({"ticks": [dict(ticks[j]) for j in idx]}, [ticks[j] for j in idx],
                                       [f"ticks.{j}." for j in idx]) for market, idx in parts.items()}
        out: list[TickAnswer | None] = [None] * len(ticks)
        applied: list[str] = []
        for market, idx in parts.items():
            try:
                results = self._post("/neural/process/batch", bodies[market], market, len(idx))["results"]
            except CerebellarNorseError as exc:
                err = _in_input_order(exc, idx)  # the server counts the part's ticks, the caller its own list
                if not applied:
                    raise err from None
                raise BatchPartError(err, applied, market, out) from exc
            for j, res in zip(idx, results, strict=True):
                out[j] = res
            applied.append(market)
        return [r for r in out if r is not None]

    def health(self) -> Health:
        """``GET /health`` (200 or 503) as JSON: ``status``, and ``reason`` when not ready.

        An answer that is not the service's health (a proxy's error page, the service's
        refusal at ``server.max_connections``) raises the error it is.
        """
        try:
            r = self._connections().get("/health")
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise EngineFatalError(f"cannot reach {self.http.base_url}: {type(exc).__name__}: {exc}") from None
        except httpx.HTTPError as exc:  # connected, and the service (stopped, stalled) did not answer in time
            raise EngineFatalError(f"GET /health of {self.http.base_url}: no answer ({type(exc).__name__}: "
                                   f"{exc or 'no detail'}); the service took the connection but did not answer") from None
        try:
            body = r.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "status" not in body:
            raise error_from_response(r) if r.status_code >= 400 else EngineFatalError(
                f"GET /health: HTTP {r.status_code} that is not the service's health: {r.text[:200]!r}")
        return cast(Health, body)  # the service's JSON, as documented

