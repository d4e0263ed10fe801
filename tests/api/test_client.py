"""The Python client against the real server: what trading code passes it, and what it raises."""

from __future__ import annotations

import math
import os
from decimal import Decimal
from typing import Any, get_type_hints

import httpx
import numpy as np
import pytest
from live_helpers import LiveServer, market, signal_of, tick

from cerebellar_norse.client import BatchPartError, Client, Health, PoolHealth, Probabilities, TickAnswer
from cerebellar_norse.errors import CapacityError, EngineFatalError, InputError, TickOrderError


def test_numpy_and_decimal_numbers_are_sent_as_numbers(live: LiveServer) -> None:
    """Values from a DataFrame row (np.float32, np.int64) or Decimal prices answer as the same plain numbers do."""
    plain, typed = market("CLP"), market("CLT")
    with Client(live.url) as c:
        for k in range(3):
            t = tick(plain, k)
            a = c.process(t)
            b = c.process({"price": Decimal(str(t["price"])), "volume": np.float32(t["volume"]),
                           "timestamp": np.int64(t["timestamp"]), "market_id": typed})
            assert signal_of(a) == signal_of(b)
        batch = c.process_batch([{**tick(typed, k), "timestamp": np.int64(tick(typed, k)["timestamp"])} for k in (3, 4)])
        assert [r["market_id"] for r in batch] == [typed, typed]


@pytest.mark.parametrize(("bad", "field"), [
    ({"market_id": "A\nB"}, "market_id"),  # no header can carry it
    ({"market_id": "Ж"}, "market_id"),
    ({"market_id": None}, "market_id"),
    ({"price": float("nan")}, "price"),  # no JSON can carry it
    ({"volume": np.float64("inf")}, "volume"),
    ({"price": Decimal("NaN")}, "price"),
    ({"price": Decimal("sNaN")}, "price"),  # float() of it raises ValueError
    ({"volume": 10**400}, "volume"),  # float() of it raises OverflowError
])
def test_a_tick_that_cannot_be_sent_is_an_input_error_naming_the_field(live: LiveServer, bad: dict[str, Any],
                                                                        field: str) -> None:
    m = market("CLB")
    with Client(live.url) as c:
        with pytest.raises(InputError) as exc:
            c.process({**tick(m, 0), **bad})
        assert exc.value.field == field
        with pytest.raises(InputError) as exc:  # checked before any part of the batch is sent
            c.process_batch([tick(m, 0), {**tick(m, 1), **bad}])
        assert exc.value.field == f"ticks.1.{field}"
        assert c.process(tick(m, 0))["market_id"] == m  # nothing of the refused batch was applied
    with Client(live.url) as c, pytest.raises(InputError, match="mapping"):
        c.process_batch([tick(m, 1), 5])  # type: ignore[list-item]


def test_refusals_and_an_unreachable_service_are_the_errors_tree(live: LiveServer) -> None:
    m = market("CLE")
    with Client(live.url) as c:
        c.process(tick(m, 5))
        with pytest.raises(TickOrderError):
            c.process(tick(m, 1))
        with pytest.raises(InputError) as exc:
            c.process({**tick(m, 6), "price": -1.0})
        assert exc.value.field == "price" and exc.value.status_code == 422
        with pytest.raises(InputError, match="cannot be sent as JSON"):
            c.process({**tick(m, 6), "extra": object()})
    with Client("http://127.0.0.1:9", timeout_s=2) as c, pytest.raises(EngineFatalError, match="cannot reach"):
        c.process(tick(m, 7))


def test_a_refused_tick_of_a_split_batch_is_named_by_its_place_in_the_callers_list(live: LiveServer) -> None:
    """The server numbers the ticks of the one-market part it got; the error names the caller's index."""
    a, b = market("CLIA"), market("CLIB")
    ticks = [tick(a, 0), tick(b, 0), {**tick(a, 1), "price": -1.0}]
    with Client(live.url) as c:
        with pytest.raises(InputError) as exc:
            c.process_batch(ticks)
        assert exc.value.field == "ticks.2.price" and exc.value.status_code == 422
        assert str(exc.value).startswith("ticks.2.price: ")
        with pytest.raises(BatchPartError) as part:  # b's part is sent first and applied, a's refused
            c.process_batch([tick(b, 1), tick(a, 0), tick(a, 1), {**tick(a, 2), "price": -1.0}])
        assert part.value.applied == [b] and part.value.failed == a
        assert isinstance(part.value.cause, InputError) and part.value.cause.field == "ticks.3.price"
        with pytest.raises(TickOrderError) as order:
            c.process_batch([tick(a, 5), tick(b, 9), tick(a, 4)])
        assert order.value.field == "ticks.2.timestamp"


def test_health_of_something_that_is_not_the_service_raises_the_tree() -> None:
    """HAProxy with no replica up answers its own HTML 503 (nothing delivered: a capacity refusal, retried later); a
    200 that is not the service's health is an EngineFatalError, not a JSON error or a KeyError."""
    page = b"<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n</body></html>\n"
    transport = httpx.MockTransport(lambda request: httpx.Response(503, content=page, headers={"Content-Type": "text/html"}))
    with Client("http://haproxy.invalid", transport=transport) as c, pytest.raises(CapacityError):
        c.health()
    listing = httpx.MockTransport(lambda request: httpx.Response(200, json=[1, 2]))
    with Client("http://haproxy.invalid", transport=listing) as c, pytest.raises(EngineFatalError, match="not the service's health"):
        c.health()


def test_an_error_carries_the_id_the_service_keeps_its_request_under(live: LiveServer) -> None:
    """The id in the error finds the request in the service (GET /debug/requests/{id}, its logs): what a trading
    system hands to whoever runs the service, also for a split batch's renamed error."""
    a, b = market("CLRA"), market("CLRB")
    with Client(live.url) as c, httpx.Client(base_url=live.url) as debug:
        with pytest.raises(InputError) as exc:
            c.process({**tick(a, 0), "price": -1.0})
        rid = exc.value.request_id
        assert rid and str(exc.value).endswith(f"(request_id {rid})")
        kept = debug.get(f"/debug/requests/{rid}").json()
        assert (kept["route"], kept["status"]) == ("/neural/process", 422)
        with pytest.raises(InputError) as part:
            c.process_batch([tick(a, 0), tick(b, 0), {**tick(a, 1), "price": -1.0}])
        assert part.value.field == "ticks.2.price" and str(part.value).endswith(f"(request_id {part.value.request_id})")
        assert debug.get(f"/debug/requests/{part.value.request_id}").json()["status"] == 422
        first, second = c.process(tick(a, 0)), c.process(tick(a, 1))
        assert first["request_id"] != second["request_id"]  # each request its own id


def test_the_answer_has_exactly_the_typed_fields_of_the_client(live: LiveServer) -> None:
    """What ``process`` and ``process_batch`` are typed to return is what the service sends: every field, its type
    (never null), the probabilities summing to 1."""
    m = market("CLTY")
    fields, probabilities = get_type_hints(TickAnswer), get_type_hints(Probabilities)
    with Client(live.url) as c:
        answers = [c.process(tick(m, 0)), *c.process_batch([tick(m, 1), tick(market("CLTZ"), 0)])]
    for answer in answers:
        assert set(answer) == set(fields)
        for key, typ in fields.items():
            if typ is Probabilities:
                assert set(answer[key]) == set(probabilities)  # type: ignore[literal-required]
                assert all(isinstance(p, float) for p in answer["probabilities"].values())
            else:
                assert type(answer[key]) is typ, (key, answer[key])  # type: ignore[literal-required]
        assert math.isclose(sum(answer["probabilities"].values()), 1.0, abs_tol=1e-6)
        assert math.isclose(answer["prediction"], answer["probabilities"]["up"] - answer["probabilities"]["down"],
                            abs_tol=1e-6)


def test_an_error_carries_the_services_error_type_and_status(live: LiveServer) -> None:
    """Two 409s of the tick route (``out_of_order``, ``future_timestamp``) and a 422 are told apart by the error's
    ``error_type``, not by parsing its message."""
    import time

    m = market("CLET")
    with Client(live.url) as c:
        c.process(tick(m, 5))
        with pytest.raises(TickOrderError) as order:
            c.process(tick(m, 1))
        with pytest.raises(InputError) as future:
            c.process({**tick(m, 6), "timestamp": int(time.time() * 1000) + 86_400_000})
        with pytest.raises(InputError) as invalid:
            c.process({**tick(m, 6), "price": -1.0})
        with pytest.raises(InputError) as part:  # a split batch's renamed error keeps them
            c.process_batch([tick(m, 7), tick(market("CLEU"), 0), {**tick(m, 8), "price": -1.0}])
    assert (order.value.error_type, order.value.http_status) == ("out_of_order", 409)
    assert (future.value.error_type, future.value.http_status, future.value.field) == ("future_timestamp", 409, "timestamp")
    assert (invalid.value.error_type, invalid.value.http_status) == ("validation", 422)
    assert (part.value.error_type, part.value.http_status, part.value.field) == ("validation", 422, "ticks.2.price")


def test_health_has_the_typed_fields_of_the_client(live: LiveServer) -> None:
    """``health()`` is typed ``Health``: the service's answer has its required keys, and no key or type it does not
    declare."""
    fields, pool = get_type_hints(Health), get_type_hints(PoolHealth)
    with Client(live.url) as c:
        health = c.health()
    assert Health.__required_keys__ <= set(health) <= set(fields), set(health) ^ set(fields)
    for key, value in health.items():
        if key == "pool":
            assert set(health["pool"]) == set(pool)
            assert all(type(health["pool"][k]) is t for k, t in pool.items())  # type: ignore[literal-required]
        else:
            assert type(value) is fields[key], (key, value)


def test_a_client_used_on_both_sides_of_a_fork_answers_each_process_its_own_ticks(live: LiveServer) -> None:
    """A client made before ``os.fork()`` (a ``multiprocessing`` pool of the ``fork`` start method) holds a kept-alive
    connection; parent and child then sending at once must not share that socket: each gets the results of its own
    ticks, never the other's or a garbled answer."""
    rounds, per_round = 4, 25
    with Client(live.url) as c:
        c.process(tick(market("CLFW"), 0))  # a connection in the pool, inherited by the children
        for _ in range(rounds):
            go_r, go_w = os.pipe()
            out_r, out_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover (the child reports through the pipe)
                status = 1
                try:
                    os.close(go_w)
                    os.read(go_r, 1)  # start with the parent
                    m = market("CLFC")
                    wrong = [r["market_id"] for r in (c.process(tick(m, k)) for k in range(per_round)) if r["market_id"] != m]
                    os.write(out_w, repr(wrong).encode())
                    status = 0
                except BaseException as exc:  # anything the child meets goes to the parent
                    os.write(out_w, f"{type(exc).__name__}: {exc}".encode())
                finally:
                    os._exit(status)
            os.close(go_r)
            os.close(out_w)
            m = market("CLFP")
            os.write(go_w, b"x")
            try:
                mine = [c.process(tick(m, k))["market_id"] for k in range(per_round)]
            finally:
                os.close(go_w)
                with os.fdopen(out_r, "rb") as child_out:
                    child = child_out.read().decode()
                _, status = os.waitpid(pid, 0)
            assert child == "[]" and os.waitstatus_to_exitcode(status) == 0, child
            assert mine == [m] * per_round



def test_the_client_examples_of_the_documentation_run_as_written(live: LiveServer) -> None:
    """docs/scale-out.md's example and the client module's own run against a service (its URL for the port)."""
    import contextlib
    import io
    import re
    import textwrap
    from pathlib import Path

    import cerebellar_norse.client as client_module

    doc = (Path(__file__).resolve().parents[2] / "docs" / "scale-out.md").read_text(encoding="utf-8")
    section = doc.split("### The Python client\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1
    module_example = textwrap.dedent((client_module.__doc__ or "").split("Example::\n", 1)[1])
    printed = []
    runs = [("docs/scale-out.md", blocks[0]), ("cerebellar_norse/client.py", module_example)]
    for name, code in [*runs, *runs]:  # a second run, as a user trying it again would, against the same service
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code.replace("http://127.0.0.1:8080", live.url), name, "exec"), {"__name__": "example"})
        printed.append(out.getvalue())
    assert printed[0].startswith("['BTC-USD', 'ETH-USD', 'BTC-USD'] ") and printed[2].startswith("['BTC-USD', ")
    assert -1.0 <= float(printed[1]) <= 1.0 and -1.0 <= float(printed[3]) <= 1.0
