"""Request and response models of the HTTP API (units in field descriptions)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from ..errors import InputError
from ..ticks import MARKET_ID_MAX, TS_MAX_MS, TS_MIN_MS, Tick, check_market_id


class TickIn(BaseModel):
    """One market tick, exactly as trading systems send it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True,
                              json_schema_extra={"examples": [{"price": 100.0, "volume": 1000.0, "timestamp": 1640995200000, "market_id": "TEST"}]})

    price: float = Field(gt=0, allow_inf_nan=False, description="Price (quote currency), finite and > 0.")
    volume: float = Field(ge=0, allow_inf_nan=False, description="Traded volume (units), finite and >= 0.")
    timestamp: int = Field(ge=TS_MIN_MS, lt=TS_MAX_MS, description="Tick time, ms since the Unix epoch (2000..2100).")
    market_id: str = Field(min_length=1, max_length=MARKET_ID_MAX, description="Market identifier, 1-64 printable ASCII characters.")

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


class BatchIn(BaseModel):
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
