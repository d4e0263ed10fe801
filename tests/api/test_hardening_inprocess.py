"""Units behind the hardening: token rules, reload refusals, the OpenAPI document per config, log summaries."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.deps import AuthError, check_token, configured_token
from cerebellar_norse.api.exposure import exposure_problems, has_token, reload_auth_refusal
from cerebellar_norse.api.openapi import live_document
from cerebellar_norse.api.schemas import TickIn
from cerebellar_norse.config import Config, load_config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.errors import InputError
from cerebellar_norse.observability.ratelimit import SummaryLog
from cerebellar_norse.ticks import MARKET_ID_PATTERN, FutureTickError, Tick, check_market_id, check_not_future


def cfg_with(**env: str) -> Config:
    return load_config(None, environ={f"CEREBELLAR_NORSE_{k.upper()}": v for k, v in env.items()})


# -- tokens ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["", " ", "\t\n  "])
def test_blank_token_is_no_token(raw: str) -> None:
    cfg = cfg_with(server__api_token=raw)
    assert cfg.server.api_token is None and configured_token(cfg) is None and not has_token(cfg)
    check_token(cfg, None)  # no token: open (on loopback only, see exposure_problems)
    public = cfg_with(server__api_token=raw, server__host="0.0.0.0")
    [problem] = exposure_problems(public)
    assert problem.key == "server.api_token" and "0.0.0.0" in problem.message


def test_token_loses_surrounding_blanks() -> None:
    cfg = cfg_with(server__api_token="  s3cret \n")
    assert configured_token(cfg) == b"s3cret"
    check_token(cfg, "Bearer s3cret")


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Bearer  \t", "bearer", "Basic s3cret", "s3cret",
                                    "Bearer s3cre", "Bearer s3cret2", "Bearer S3CRET", "Bearer s3cret s3cret", "Bearer \x00"])
def test_only_the_token_authenticates(header: str | None) -> None:
    cfg = cfg_with(server__api_token="s3cret")
    with pytest.raises(AuthError):
        check_token(cfg, header)


def test_token_compare_is_constant_time_and_byte_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    import cerebellar_norse.api.deps as deps

    calls: list[tuple[bytes, bytes]] = []
    real = deps.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(deps.hmac, "compare_digest", spy)
    cfg = cfg_with(server__api_token="clé")
    check_token(cfg, "Bearer " + "clé".encode().decode("latin-1"))  # the UTF-8 bytes as an HTTP header carries them
    with pytest.raises(AuthError):
        check_token(cfg, "Token clé")  # the digest is compared even when the scheme is wrong
    assert len(calls) == 2 and all(b == "clé".encode() for _, b in calls)


# -- reload ------------------------------------------------------------------------------------------


A, B = "tok-A-secret", "tok-B-secret"


@pytest.mark.parametrize(("running", "new", "refused"), [
    ({}, {}, None),
    ({}, {"server__api_token": A}, None),  # adding a token strengthens auth
    ({"server__api_token": A}, {"server__api_token": A}, None),
    ({"server__api_token": A}, {}, "removing"),
    ({"server__api_token": A}, {"server__api_token": "  "}, "removing"),
    ({"server__api_token": A}, {"server__api_token": B}, "changes"),
    ({"server__api_token": A, "server__host": "0.0.0.0"}, {"server__host": "0.0.0.0"}, "not loopback"),
    ({"server__api_token": A, "server__host": "0.0.0.0"}, {"server__api_token": ""}, "not loopback"),  # running host
    ({}, {"server__host": "0.0.0.0"}, "not loopback"),  # would not start either
])
def test_reload_never_weakens_or_swaps_auth(running: dict[str, str], new: dict[str, str], refused: str | None) -> None:
    why = reload_auth_refusal(cfg_with(**running), cfg_with(**new))
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why and "server.api_token" in why
        assert A not in why and B not in why  # the key, never the secret


# -- the OpenAPI document follows the config ------------------------------------------------------


BASE_DOC: dict[str, Any] = {
    "paths": {"/models": {"get": {"security": [{"bearerAuth": []}], "responses": {"200": {}, "401": {}}}}},
    "components": {"securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
                   "schemas": {"BatchIn": {"properties": {"ticks": {"maxItems": 65536}}}}},
}


def test_document_declares_security_only_with_a_token() -> None:
    with_token = live_document(BASE_DOC, token=True, queue_size=4096)
    assert with_token["paths"]["/models"]["get"]["security"] == [{"bearerAuth": []}]
    assert "401" in with_token["paths"]["/models"]["get"]["responses"]
    open_doc = live_document(BASE_DOC, token=False, queue_size=4096)
    assert open_doc["paths"]["/models"]["get"]["security"] == []  # open, and says so
    assert "401" not in open_doc["paths"]["/models"]["get"]["responses"]
    assert "securitySchemes" not in open_doc["components"]
    assert BASE_DOC["paths"]["/models"]["get"]["security"]  # the base is not modified


@pytest.mark.parametrize(("queue", "most"), [(300, 300), (4096, 4096), (100_000, 65_536)])
def test_document_batch_limit_follows_the_queue(queue: int, most: int) -> None:
    doc = live_document(BASE_DOC, token=True, queue_size=queue)
    assert doc["components"]["schemas"]["BatchIn"]["properties"]["ticks"]["maxItems"] == most


# -- schema constraints match validation -------------------------------------------------------------


@pytest.mark.parametrize("value", ["A", "BTC/USD", "a b", "~!", " A", "A ", "", "A\x01", "Ü", "x" * 64, "x" * 65, "a\n"])
def test_market_id_pattern_is_the_check(value: str) -> None:
    import re

    try:
        check_market_id(value)
        ok = True
    except InputError:
        ok = False
    assert (re.fullmatch(MARKET_ID_PATTERN, value) is not None) is ok  # the pattern bounds the length too


def test_integral_timestamp_is_an_integer() -> None:
    body = '{"price": 1, "volume": 0, "timestamp": 1640995200000.0, "market_id": "A"}'
    assert TickIn.model_validate_json(body).timestamp == 1640995200000
    with pytest.raises(ValueError, match="valid integer"):
        TickIn.model_validate_json(body.replace("1640995200000.0", "1640995200000.5"))


def test_future_ticks() -> None:
    now = 1_700_000_000_000
    ticks = [Tick(1.0, 1.0, now - 5, "A"), Tick(1.0, 1.0, now + 1000, "A"), Tick(1.0, 1.0, now + 1001, "B")]
    check_not_future(ticks[:2], now, 1000, batch=True)  # exactly at the bound is fine
    with pytest.raises(FutureTickError) as exc:
        check_not_future(ticks, now, 1000, batch=True)
    assert exc.value.field == "ticks.2.timestamp" and exc.value.status_code == 409
    with pytest.raises(FutureTickError) as exc:
        check_not_future(ticks[2:], now, 1000, batch=False)
    assert exc.value.field == "timestamp"


# -- log volume -------------------------------------------------------------------------------------------


def test_summary_log_writes_at_most_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    log = logging.getLogger("test.summary")
    summary = SummaryLog(log, "evicted", 60.0, "evicted", clock=lambda: clock[0])
    with caplog.at_level(logging.INFO, logger="test.summary"):
        total = 0
        for k in range(31_000):  # one event every 10 ms for 310 s
            clock[0] = k * 0.01
            summary.add(2, last=f"M{k}")
            total += 2
        summary.flush()
    lines = [r for r in caplog.records if r.name == "test.summary"]
    assert len(lines) == 7  # at 0 s, 60, 120, 180, 240, 300, and the flush
    assert sum(r.fields["evicted"] for r in lines) == total  # type: ignore[attr-defined]
    assert lines[0].fields["occurrences"] == 1 and lines[1].fields["occurrences"] == 6000  # type: ignore[attr-defined]
    assert lines[-1].fields["last"] == "M30999"  # type: ignore[attr-defined]
    assert not summary.flush()  # nothing left


def test_engine_logs_evictions_as_a_summary(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = {"CEREBELLAR_NORSE_PERFORMANCE__MAX_MARKETS": "2", "CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path),
           "CEREBELLAR_NORSE_NEURAL__GRANULE_SIZE": "64", "CEREBELLAR_NORSE_NEURAL__CONNECTIONS_PER_NEURON": "16",
           **NO_BOOTSTRAP}
    engine = Engine(load_config(None, environ=env))
    with caplog.at_level(logging.INFO, logger="cerebellar_norse.engine"):
        for k in range(500):  # every batch evicts
            engine.process_now([Tick(100.0, 1.0, 1_640_995_200_000 + k, f"M{k % 7}")])
        lines = [r for r in caplog.records if r.getMessage() == "evicted least recently used markets"]
        assert len(lines) == 1  # the first at once; the rest wait for the interval
        engine.eviction_log.flush()
    lines = [r for r in caplog.records if r.getMessage() == "evicted least recently used markets"]
    assert len(lines) == 2
    assert sum(r.fields["evicted"] for r in lines) == engine.pool.table.evictions == 498  # type: ignore[attr-defined]
