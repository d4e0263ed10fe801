"""A refused body names its first error, exact, without an error built for each of its unknown keys or bad items."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from cerebellar_norse.api.schemas import BatchIn, TickIn, parse_tick, tick_errors
from cerebellar_norse.firsterrors import ERRORS_LISTED, cut_to_first_error
from cerebellar_norse.training.jobs import TrainingRequest

GOOD_TICK = {"price": 100.0, "volume": 5.0, "timestamp": 1640995200000, "market_id": "A"}
ODD_VALUES: list[Any] = [None, True, "1", -1.0, 0, 1e300, [], {}, " A", "x" * 70, 1.5, 2**70]


def _first(model: type[BaseModel], data: Any) -> tuple[str, tuple[Any, ...], str] | None:
    try:
        model.model_validate(data)
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        return e["type"], e["loc"], e["msg"]
    return None


def _random_object(rng: random.Random, good: dict[str, Any]) -> dict[str, Any]:
    """Some of ``good``'s fields, some with odd values, and unknown keys anywhere among them."""
    items: list[tuple[str, Any]] = []
    for key, value in good.items():
        if rng.random() < 0.9:
            items.append((key, value if rng.random() < 0.8 else rng.choice(ODD_VALUES)))
    for k in range(rng.choice([0, 0, 1, 3])):
        items.insert(rng.randrange(len(items) + 1), (f"u{k}", rng.choice(ODD_VALUES)))
    return dict(items)


def _random_body(rng: random.Random, model: type[BaseModel]) -> dict[str, Any]:
    if model is TickIn:
        return _random_object(rng, GOOD_TICK)
    if model is BatchIn:
        body = {"ticks": [_random_object(rng, GOOD_TICK) if rng.random() < 0.3 else dict(GOOD_TICK)
                          for _ in range(rng.randrange(0, 5))]}
        return _random_object(rng, body)
    return _random_object(rng, {"files": ["a.csv", "b.csv"], "epochs": 3, "learning_rate": 0.01,
                                "data_timezone": "UTC", "activate": "never"})


@pytest.mark.parametrize("model", [TickIn, BatchIn, TrainingRequest])
def test_a_body_cut_to_its_first_error_fails_with_that_error(model: type[BaseModel]) -> None:
    """pydantic's order (fields, list items, then unknown keys in the body's order) is what the cut relies on."""
    rng = random.Random(7)
    refused = 0
    for _ in range(1500):
        body = _random_body(rng, model)
        first = _first(model, body)
        assert _first(model, cut_to_first_error(model, body)) == first, body
        refused += first is not None
    assert 300 < refused < 1400  # both refused and accepted bodies were tried


@pytest.mark.parametrize("model, body", [
    (BatchIn, {"ticks": [GOOD_TICK, {**GOOD_TICK, **{f"k{i}": i for i in range(20_000)}}]}),
    (BatchIn, {"ticks": [GOOD_TICK] * 3 + [{**GOOD_TICK, "price": -1.0}] * 20_000}),
    (BatchIn, {**{f"k{i}": i for i in range(20_000)}, "ticks": [GOOD_TICK, {**GOOD_TICK, "volume": "1"}]}),
    (TrainingRequest, {f"k{i}": i for i in range(20_000)}),
    (TrainingRequest, {"files": ["a.csv"], **{f"k{i}": i for i in range(20_000)}}),
])
def test_a_body_of_thousands_of_errors_is_refused_with_a_few(model: type[BaseModel], body: dict[str, Any]) -> None:
    """Building 20,000 errors took a tenth of a second of the event loop; the answer names the first only."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    assert caught.value.error_count() <= ERRORS_LISTED
    cut = cut_to_first_error(model, body)
    assert caught.value.errors(include_url=False)[0]["loc"] == (
        ("ticks", 3, "price") if model is BatchIn and len(body["ticks"]) > 3 else
        ("ticks", 1, "k0") if model is BatchIn and "k0" not in body else
        ("ticks", 1, "volume") if model is BatchIn else ("files",) if "files" not in body else ("k0",))
    assert len(json.dumps(cut)) < 500


def test_a_list_longer_than_allowed_is_refused_as_too_long() -> None:
    body = {"ticks": [{**GOOD_TICK, "price": -1.0}] * 65_537, **{f"k{i}": i for i in range(20)}}
    with pytest.raises(ValidationError) as caught:
        BatchIn.model_validate(body)
    assert [(e["type"], e["loc"]) for e in caught.value.errors(include_url=False)][:2] == [
        ("too_long", ("ticks",)), ("extra_forbidden", ("k0",))]


def test_a_tick_of_many_unknown_keys_is_refused_without_listing_them() -> None:
    """The hot path's tick: 75,000 unknown keys (a 1 MB body) took 0.2 s of the event loop to list."""
    keys = 20_000
    body = json.dumps({**GOOD_TICK, **{f"k{i}": i for i in range(keys)}})
    with pytest.raises(ValidationError) as caught:
        parse_tick(body)
    assert caught.value.error_count() == keys > ERRORS_LISTED
    assert [(e["type"], e["loc"]) for e in tick_errors(caught.value, body)] == [("extra_forbidden", ("k0",))]
    bad = json.dumps({**{f"k{i}": i for i in range(keys)}, **GOOD_TICK, "price": "1", "volume": "1"})
    with pytest.raises(ValidationError) as caught:
        parse_tick(bad)
    assert [(e["type"], e["loc"]) for e in tick_errors(caught.value, bad)] == [
        ("float_type", ("price",)), ("float_type", ("volume",)), ("extra_forbidden", ("k0",))]
    short = json.dumps({**GOOD_TICK, "price": "1", **{f"k{i}": i for i in range(ERRORS_LISTED - 1)}})
    with pytest.raises(ValidationError) as caught:
        parse_tick(short)
    assert tick_errors(caught.value, short) == [dict(e) for e in caught.value.errors(include_url=False)]
