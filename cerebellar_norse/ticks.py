"""Market ticks: validation shared by the Python API, the engine and HTTP.

A tick is ``{"price": float, "volume": float, "timestamp": int, "market_id": str}``
with price in quote currency (finite, > 0), volume in traded units (finite, >= 0),
timestamp in milliseconds since the Unix epoch (an integer between 1971-01-01 and
2100-01-01, so seconds or microseconds by mistake are caught: a time of 1971..2100 in
seconds, read as ms, falls in the first weeks of 1970), market_id 1–64
printable ASCII characters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

import numpy as np

from .errors import InputError, TickOrderError

TS_MIN_MS = 31_536_000_000  # 1971-01-01T00:00:00Z: any time up to 2100 in seconds, read as ms, is earlier
TS_MAX_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z
MARKET_ID_MAX = 64
# check_market_id as a regular expression (for schemas): printable ASCII, no space at either end.
MARKET_ID_PATTERN = r"^[!-~]([ -~]{0,62}[!-~])?$"
TICK_FIELDS = ("price", "volume", "timestamp", "market_id")


class Tick(NamedTuple):
    """One validated market tick (units in the module docstring).

    Immutable; a named tuple rather than a frozen dataclass because the hot path builds
    one per request and a frozen dataclass costs four times as much to build.
    """

    price: float
    volume: float
    timestamp: int
    market_id: str


def integral_number(v: Any) -> Any:
    """An integral JSON number written with a fraction (``5.0``) as the int it is; anything else unchanged.

    JSON Schema counts ``5.0`` as an integer, so strict integer fields of the HTTP API
    accept it (as a pydantic ``mode="before"`` validator); ``5.5``, ``"5"`` and ``true``
    stay refused.
    """
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def check_market_id(value: Any, field: str = "market_id") -> str:
    """A market id of 1–64 printable ASCII characters (no spaces at the ends)."""
    if not isinstance(value, str):
        raise InputError(f"must be a string, got {type(value).__name__}", field)
    if not 1 <= len(value) <= MARKET_ID_MAX:
        raise InputError(f"must be 1 to {MARKET_ID_MAX} characters, got {len(value)}", field)
    # ASCII and printable: exactly " " .. "~" (ASCII's control characters and DEL are not printable)
    if not (value.isascii() and value.isprintable()) or value[0] == " " or value[-1] == " ":
        raise InputError("must be printable ASCII without leading or trailing spaces", field)
    return value


def check_price(value: Any, field: str = "price") -> float:
    """A finite price > 0."""
    x = _number(value, field)
    if not x > 0:
        raise InputError(f"must be > 0, got {x!r}", field)
    return x


def check_volume(value: Any, field: str = "volume") -> float:
    """A finite volume >= 0."""
    x = _number(value, field)
    if not x >= 0:
        raise InputError(f"must be >= 0, got {x!r}", field)
    return x


def check_timestamp(value: Any, field: str = "timestamp") -> int:
    """An integer time in ms since the epoch within [1971-01-01, 2100-01-01)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        else:
            raise InputError(f"must be an integer (ms since epoch), got {value!r}", field)
    v = int(value)
    if not TS_MIN_MS <= v < TS_MAX_MS:
        raise InputError(f"{v} is not a plausible time in ms since epoch (1971-01-01 .. 2100-01-01)", field)
    return v


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating, Decimal)):
        raise InputError(f"must be a number, got {type(value).__name__}", field)
    x = float(value)
    if not math.isfinite(x):
        raise InputError(f"must be finite, got {x!r}", field)
    return x


def validate_tick(data: Mapping[str, Any], prefix: str = "") -> Tick:
    """Validate one tick mapping; errors name the field (``prefix`` + field)."""
    if not isinstance(data, Mapping):
        raise InputError(f"a tick must be an object, got {type(data).__name__}", prefix.rstrip("."))
    for key in data:
        if key not in TICK_FIELDS:
            raise InputError("unknown field", f"{prefix}{key}")
    for key in TICK_FIELDS:
        if key not in data:
            raise InputError("missing", f"{prefix}{key}")
    return Tick(
        price=check_price(data["price"], f"{prefix}price"),
        volume=check_volume(data["volume"], f"{prefix}volume"),
        timestamp=check_timestamp(data["timestamp"], f"{prefix}timestamp"),
        market_id=check_market_id(data["market_id"], f"{prefix}market_id"),
    )


def validate_ticks(ticks: Iterable[Mapping[str, Any]] | Mapping[str, Any]) -> list[Tick]:
    """Validate a batch: a list of tick mappings, or a mapping of equal-length columns.

    Errors name the index, e.g. ``ticks.3.price``. Nothing is returned unless every
    tick is valid.
    """
    if isinstance(ticks, Mapping):
        cols: dict[str, list[Any]] = {}
        for k, v in ticks.items():
            col = v if isinstance(v, (list, str, bytes)) else np.asarray(v).tolist()
            if not isinstance(col, list):
                raise InputError(f"a column must be a list or a 1-d array, got {type(v).__name__} (one tick goes to "
                                 "process(), several as a list of ticks or as columns)", f"ticks.{k}")
            cols[k] = col
        lengths = {len(v) for v in cols.values()}
        if len(lengths) > 1:
            raise InputError(f"columns have different lengths {sorted(lengths)}", "ticks")
        n = lengths.pop() if lengths else 0
        rows: Sequence[Mapping[str, Any]] = [{k: cols[k][i] for k in cols} for i in range(n)]
    elif isinstance(ticks, Iterable) and not isinstance(ticks, (str, bytes)):
        rows = ticks if isinstance(ticks, Sequence) else list(ticks)
    else:
        raise InputError(f"ticks must be a list of ticks or a mapping of columns, got {type(ticks).__name__}", "ticks")
    return [validate_tick(row, f"ticks.{i}.") for i, row in enumerate(rows)]


def check_order(ticks: Sequence[Tick], last_timestamp: Callable[[str], int | None], batch: bool) -> None:
    """Raise TickOrderError for the first tick older than its market's previous tick.

    ``last_timestamp(market)`` is the time of the market's last accepted tick (None for
    a new market); ticks earlier in ``ticks`` count too. The field is
    ``ticks.N.timestamp`` for a batch, ``timestamp`` for a single tick.
    """
    seen: dict[str, int] = {}
    for j, t in enumerate(ticks):
        prev = seen.get(t.market_id)
        if prev is None:
            prev = last_timestamp(t.market_id)
        if prev is not None and t.timestamp < prev:
            field = f"ticks.{j}.timestamp" if batch else "timestamp"
            raise TickOrderError(f"tick at {t.timestamp} is older than the market's last tick at {prev}", field)
        seen[t.market_id] = t.timestamp


class FutureTickError(InputError):
    """A tick's timestamp is further ahead of the server clock than the allowed clock skew.

    Such a tick is well formed, and would be accepted a little later: it conflicts with
    the server's clock, as an out-of-order tick conflicts with its market's last tick
    (HTTP 409). Accepting it would move the market's clock far ahead, and every real
    tick after it would then be refused as out of order.
    """

    status_code = 409


def check_not_future(ticks: Sequence[Tick], now_ms: int, max_skew_ms: int, batch: bool) -> None:
    """Raise FutureTickError for the first tick more than ``max_skew_ms`` ahead of ``now_ms``.

    The field is ``ticks.N.timestamp`` for a batch, ``timestamp`` for a single tick.
    """
    bound = now_ms + max_skew_ms
    for j, t in enumerate(ticks):
        if t.timestamp > bound:
            raise future_error("tick", t.timestamp, now_ms, max_skew_ms, f"ticks.{j}.timestamp" if batch else "timestamp")


def future_error(what: str, timestamp: int, now_ms: int, max_skew_ms: int, field: str,
                 consequence: str = "") -> FutureTickError:
    """The refusal of ``what`` (a tick, an imported state's last tick) at ``timestamp`` (ms), more than ``max_skew_ms``
    ahead of the server clock ``now_ms``; ``consequence`` ends the message."""
    return FutureTickError(f"{what} at {timestamp} is {timestamp - now_ms} ms ahead of the server clock ({now_ms}); "
                           f"at most server.max_clock_skew_ms = {max_skew_ms} ms is allowed{consequence}", field)
