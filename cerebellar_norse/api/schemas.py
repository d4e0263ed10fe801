"""Request and response models of the HTTP API (units in field descriptions)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from ..errors import InputError, RepeatedKeyError
from ..firsterrors import ERRORS_LISTED, FirstErrorsModel, cut_to_first_error
from ..ticks import MARKET_ID_MAX, MARKET_ID_PATTERN, TS_MAX_MS, TS_MIN_MS, Tick, check_market_id, integral_number


class TickIn(BaseModel):
    """One market tick, exactly as trading systems send it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True,
                              json_schema_extra={"examples": [{"price": 100.0, "volume": 1000.0, "timestamp": 1640995200000, "market_id": "TEST"}]})

    price: float = Field(gt=0, allow_inf_nan=False, description="Price (quote currency), finite and > 0.")
    volume: float = Field(ge=0, allow_inf_nan=False, description="Traded volume (units), finite and >= 0.")
    timestamp: int = Field(ge=TS_MIN_MS, lt=TS_MAX_MS, description=(
        "Tick time, ms since the Unix epoch (1971..2100); an integral number (1640995200000 or 1640995200000.0). "
        "A tick more than server.max_clock_skew_ms ahead of the server clock is refused with 409 future_timestamp."))
    market_id: str = Field(min_length=1, max_length=MARKET_ID_MAX, json_schema_extra={"pattern": MARKET_ID_PATTERN},
                           description="Market identifier, 1-64 printable ASCII characters, no space at either end.")

    @field_validator("timestamp", mode="before")
    @classmethod
    def _integral(cls, v: Any) -> Any:
        return integral_number(v)

    @field_validator("market_id")
    @classmethod
    def _printable(cls, v: str) -> str:
        try:
            return check_market_id(v)
        except InputError as exc:  # raised as a pydantic error so that it names the full location (ticks.2.market_id)
            raise PydanticCustomError("market_id", "{reason}", {"reason": exc.message}) from None

    def to_tick(self) -> Tick:
        """The engine's tick type."""
        return Tick(float(self.price), float(self.volume), int(self.timestamp), self.market_id)


TICK_STRINGS = 5  # the JSON strings of a valid tick that names each key once: its four keys and the market id


def parse_tick(body: str | bytes) -> TickIn:
    """A tick from its JSON text; raises pydantic's ValidationError, or RepeatedKeyError for a valid tick whose object
    names a key twice (see :func:`refuse_repeated_keys`).

    pydantic's JSON parser refuses some JSON that Python's reads (a number with thousands
    of digits, read as infinity or a big integer): such a body is validated as the
    FastAPI route validates every body, from Python's parse, so that both answer alike
    (``Input should be a finite number``, not "invalid JSON").
    """
    try:
        tick = TickIn.model_validate_json(body)
    except ValidationError as exc:
        if exc.error_count() != 1 or exc.errors(include_url=False)[0]["type"] != "json_invalid":
            raise
        try:
            value = loads_utf8(body)
        except (ValueError, TypeError, RecursionError):
            raise exc from None
        tick = TickIn.model_validate(value)
    quotes = body.count(b'"') if isinstance(body, bytes) else body.count('"')
    if quotes != 2 * TICK_STRINGS:  # see refuse_repeated_keys
        refuse_repeated_keys(body)
    return tick


class _Repeats(dict[str, Any]):
    """A decoded JSON object that named ``key`` twice (only while :func:`repeated_key` looks for one)."""

    key = ""


def repeated_key(body: str | bytes) -> str | None:
    """Where the JSON ``body`` has an object that names a key twice, as a dotted path (``price``, ``ticks.2.price``;
    of several, the outermost, then the first in the body), or None (also when ``body`` is not JSON: its parse
    reports that)."""
    found = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        obj = dict(items)
        if len(obj) == len(items):
            return obj
        found = True
        repeats, seen = _Repeats(obj), set()
        repeats.key = next(k for k, _ in items if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        return repeats

    try:
        text = body.decode("utf-8") if isinstance(body, bytes) else body
        value = json.loads(text, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    if not found:
        return None
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:  # depth first, in the body's order
        node, where = stack.pop()
        if isinstance(node, _Repeats):
            return ".".join((*where, node.key))
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend(reversed([(v, (*where, str(k))) for k, v in children]))
    return None


def refuse_repeated_keys(body: str | bytes, strings: int | None = None) -> None:
    """Raise RepeatedKeyError when an object of the JSON ``body`` names a key twice (JSON parsers, pydantic's and
    Python's, keep the last value: a second ``price`` would hide the first).

    ``strings``: the fewest JSON strings (keys and string values) the validated ``body`` can
    hold, where the caller knows it (a tick: 5, its four keys and the market id). Every string
    has two ``"`` (an escaped one inside it adds more), and a repeated key is one string more:
    so a body of exactly ``2 * strings`` ``"`` repeats nothing and needs no parse. The hot
    path's check is that count of one byte (:func:`parse_tick`).
    """
    if strings is not None and (body.count(b'"') if isinstance(body, bytes) else body.count('"')) == 2 * strings:
        return
    where = repeated_key(body)
    if where is not None:
        raise RepeatedKeyError(where)


def tick_errors(exc: ValidationError, body: str | bytes) -> list[dict[str, Any]]:
    """pydantic's errors of a tick ``body`` that :func:`parse_tick` refused, as dicts; the first one is exact.

    Past :data:`~cerebellar_norse.firsterrors.ERRORS_LISTED` errors (a body of many unknown
    keys), the first few only: see :mod:`cerebellar_norse.firsterrors`.
    """
    if exc.error_count() > ERRORS_LISTED:
        try:
            value = loads_utf8(body)
        except (ValueError, RecursionError):  # a number Python's parser refuses: the list, however long
            value = None
        if isinstance(value, dict):
            try:
                TickIn.model_validate_json(json.dumps(cut_to_first_error(TickIn, value)))
            except ValidationError as few:
                return [dict(e) for e in few.errors(include_url=False)]
    return [dict(e) for e in exc.errors(include_url=False)]


def loads_utf8(body: str | bytes) -> Any:
    """JSON of a request body, which must be UTF-8 without a byte-order mark; ``json.JSONDecodeError`` otherwise.

    (``json.loads`` of bytes would also take UTF-16 and UTF-32, guessing the encoding.)
    """
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotUtf8Error(exc.object, exc.start) from None
    return json.loads(body)


class NotUtf8Error(json.JSONDecodeError):
    """A body that is not UTF-8 text; ``doc`` is the body's bytes, ``pos`` the first byte that is not."""

    def __init__(self, body: bytes, pos: int) -> None:
        ValueError.__init__(self, f"not UTF-8 text (byte 0x{body[pos]:02x} at {pos})")
        self.msg = f"not UTF-8 text (byte 0x{body[pos]:02x})"
        self.doc = body  # type: ignore[assignment]  # bytes: the text it is not
        self.pos, self.lineno, self.colno = pos, 1, pos + 1


class BatchIn(FirstErrorsModel):
    """Many ticks, processed in order."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ticks: list[TickIn] = Field(min_length=1, max_length=65_536, description="Ticks in arrival order.")


class Probabilities(BaseModel):
    """Class probabilities over the prediction horizon."""

    down: float
    flat: float
    up: float


class ResultOut(BaseModel):
    """The network's answer to one tick."""

    market_id: str
    prediction: float = Field(description="P(up) - P(down), in [-1, 1].")
    probabilities: Probabilities
    confidence: float = Field(description="1 - entropy/ln 3, in [0, 1].")
    spike_count: int = Field(description="Spikes of all populations during the tick.")
    processing_time_ns: int = Field(description="Network time of the tick (ns), batch time amortised.")
    warming_up: bool = Field(description="True until the market has seen neural.warmup_ticks ticks: the state still "
                                         "depends on where the market started, so the signal is not yet reliable.")
    model_version: str
    request_id: str


class BatchOut(BaseModel):
    """Results in the order of the request's ticks."""

    results: list[ResultOut]
    request_id: str


class ErrorBody(BaseModel):
    """What went wrong."""

    type: str
    message: str
    field: str | None = None
    request_id: str


class ErrorOut(BaseModel):
    """Every error response has this shape."""

    error: ErrorBody


def error_payload(kind: str, message: str, request_id: str, field: str | None = None) -> dict[str, Any]:
    """The JSON body of an error response."""
    return {"error": {"type": kind, "message": message, "field": field or None, "request_id": request_id}}


class PoolOut(BaseModel):
    """The market state pool."""

    markets: int = Field(description="Markets holding a state slot.")
    capacity: int = Field(description="State slots.")
    usage: float = Field(description="markets / capacity.")
    evictions: int = Field(description="Markets evicted since start (least recently used or idle).")
    bytes: int = Field(description="Memory of the pool (bytes).")


class HealthOut(BaseModel):
    """Readiness of the service (``GET /health``); more fields may be added."""

    status: str = Field(description='"ok" when ready; "degraded" (200, with reason) when serving a fallback because the active model is unusable, or the untrained network because no trained model is stored; "unavailable" (with reason) when not ready.')
    version: str = Field(description="Version of cerebellar-norse.")
    model_version: str = Field(description="The model answering ticks.")
    device: str = Field(description='"cpu" or "cuda".')
    uptime_s: float = Field(description="Seconds since the service started.")
    pool: PoolOut
    queue_depth: int = Field(description="Ticks waiting for a batch.")
    queue_capacity: int = Field(description="performance.queue_size.")
    accepting: bool = Field(description="False once shutdown has begun.")
    reason: str | None = Field(None, description="Why the service is not ready (503), or why it is degraded (200).")


class StartingOut(BaseModel):
    """``GET /health`` while the service starts (its port is bound before the model is loaded): 503."""

    status: str = Field(description='"unavailable".')
    reason: str = Field(description='The stage: "starting: loading the model (or training one on first run)" and the like.')
    version: str = Field(description="Version of cerebellar-norse.")
    uptime_s: float = Field(description="Seconds since the service started.")


class MarketResetOut(BaseModel):
    """Answer of ``DELETE /neural/markets/{market_id}``."""

    market_id: str
    reset: bool = Field(description="Always true: the market's state is forgotten; its next tick starts from rest.")
    request_id: str


class TrainingStartedOut(BaseModel):
    """Answer (202) of ``POST /training``."""

    job_id: str = Field(description="The job's id: GET /training/status/{job_id}, DELETE /training/{job_id}.")
    state: str = Field(description="The job's state when it was answered (see GET /training/status/{job_id}).")
    status_url: str = Field(description="Where the job's status is read.")
