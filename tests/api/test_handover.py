"""Handover of one market's state between two services (scale-out): export, import, freeze, release, thaw.

In process (TestClient over the real app of two independent services, source and
target); a third service fed every tick without a move is the reference.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP, signal_of, tick

from cerebellar_norse.api.deps import ServiceState
from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.engine.handover import MEDIA_TYPE
from cerebellar_norse.neurons.encoder import S_LAST_TS
from cerebellar_norse.storage import seal, unseal

TOKEN = "handover-token-5d1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BLOB = {**AUTH, "Content-Type": MEDIA_TYPE}
ODD = 'a/b,"c" d'  # a legal id with a slash, a comma, a quote and a space


def _service(root: Path, **env: str) -> ServiceState:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(root), "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN,
               **NO_BOOTSTRAP, **env}
    return build_service(load_checked_config(None, environ=environ))


def _client(svc: ServiceState) -> TestClient:
    return TestClient(make_app(svc, restore=False, save_on_shutdown=False))


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[tuple[TestClient, TestClient, TestClient]]:
    """Source, target and reference services."""
    with _client(_service(tmp_path / "a")) as a, _client(_service(tmp_path / "b")) as b, \
            _client(_service(tmp_path / "ref")) as ref:
        yield a, b, ref


def m(market: str) -> str:
    return quote(market, safe="")


def send(tc: TestClient, market: str, ks: range, **kw: Any) -> list[dict[str, Any]]:
    out = []
    for k in ks:
        r = tc.post("/neural/process", json=tick(market, k), **kw)
        assert r.status_code == 200, r.text
        out.append(signal_of(r.json()))
    return out


def test_moved_market_continues_exactly_where_it_left_off(trio: tuple[TestClient, TestClient, TestClient]) -> None:
    a, b, ref = trio
    for market in ("BTC-USD", ODD):
        send(a, market, range(40))
        expected = send(ref, market, range(60))[40:]
        exp = a.post(f"/neural/markets/{m(market)}/export", headers=AUTH)
        assert exp.status_code == 200, exp.text
        assert exp.headers["content-type"] == MEDIA_TYPE
        assert a.post(f"/neural/markets/{m(market)}/export", headers=AUTH).content == exp.content  # frozen: same state
        imp = b.put(f"/neural/markets/{m(market)}/state", content=exp.content, headers=BLOB)
        assert imp.status_code == 200, imp.text
        assert imp.json()["ticks"] == 40 and imp.json()["replaced"] is False
        assert send(b, market, range(40, 60)) == expected
        rel = a.post(f"/neural/markets/{m(market)}/release", headers=AUTH)
        assert rel.status_code == 200 and rel.json()["state"] == "moved" and rel.json()["previous"] == "moving"
        assert a.get(f"/debug/markets/{m(market)}/state", headers=AUTH).status_code == 404  # forgotten at the source


def test_frozen_and_moved_markets_get_503_with_retry_after_only(trio: tuple[TestClient, TestClient, TestClient]) -> None:
    a, _, _ = trio
    send(a, "X", range(5))
    send(a, "Y", range(5))
    assert a.post("/neural/markets/X/export", headers=AUTH).status_code == 200
    for r in (a.post("/neural/process", json=tick("X", 5)),
              a.post("/neural/process/batch", json={"ticks": [tick("Y", 5), tick("X", 5)]})):
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        err = r.json()["error"]
        assert err["type"] == "market_moving" and "'X'" in err["message"] and err["field"] == "market_id"
    assert send(a, "Y", range(5, 6))  # other markets are served; the refused batch changed nothing of Y
    with a.websocket_connect("/neural/stream") as ws:
        ws.send_json(tick("X", 5))
        assert ws.receive_json()["error"]["type"] == "market_moving"
    assert a.get("/neural/moves", headers=AUTH).json()["markets"][0]["state"] == "moving"
    assert a.post("/neural/markets/X/release", headers=AUTH).status_code == 200
    assert a.post("/neural/process", json=tick("X", 5)).status_code == 503  # moved: still refused, never from rest
    thawed = a.post("/neural/markets/X/thaw", headers=AUTH)
    assert thawed.status_code == 200 and thawed.json()["previous"] == "moved"
    assert a.post("/neural/process", json=tick("X", 6)).json()["warming_up"] is True  # served again, from rest


def test_abort_by_thaw_keeps_the_state(trio: tuple[TestClient, TestClient, TestClient]) -> None:
    a, _, ref = trio
    send(a, "Z", range(30))
    expected = send(ref, "Z", range(35))[30:]
    assert a.post("/neural/markets/Z/export", headers=AUTH).status_code == 200
    assert a.post("/neural/markets/Z/thaw", headers=AUTH).json()["previous"] == "moving"
    assert send(a, "Z", range(30, 35)) == expected


def test_each_step_of_a_move_is_logged_with_its_market(trio: tuple[TestClient, TestClient, TestClient],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A market whose ticks are refused 503 market_moving is found in the log by its id: its export, release and thaw
    wrote nothing (an export by anyone holding the token froze a live market for minutes without a line to say so)."""
    a, _, _ = trio
    send(a, "LOGGED", range(3))
    with caplog.at_level(logging.INFO, logger="cerebellar_norse"):
        assert a.post("/neural/markets/LOGGED/export", headers=AUTH).status_code == 200
        assert a.post("/neural/markets/LOGGED/release", headers=AUTH).status_code == 200
        assert a.post("/neural/markets/LOGGED/thaw", headers=AUTH).status_code == 200
        assert a.post("/neural/markets/NEVER/thaw", headers=AUTH).status_code == 200  # nothing to thaw: no line
    lines = [(r.getMessage().split(":")[0], getattr(r, "fields", {}).get("market_id")) for r in caplog.records
             if r.name == "cerebellar_norse.api.handover"]
    assert lines == [("market frozen and exported", "LOGGED"), ("market released", "LOGGED"),
                     ("market thawed", "LOGGED")], lines


def test_bad_imports_change_nothing(trio: tuple[TestClient, TestClient, TestClient], tmp_path: Path) -> None:
    a, b, _ = trio
    send(a, "Q", range(10))
    send(b, "Q", range(3))
    before = b.get("/debug/markets/Q/state", headers=AUTH).json()
    blob = a.post("/neural/markets/Q/export", headers=AUTH).content
    corrupt = bytearray(blob)
    corrupt[-10] ^= 0xFF
    cases = [
        (b.put("/neural/markets/Q/state", content=bytes(corrupt), headers=BLOB), 422, "checksum"),
        (b.put("/neural/markets/Q/state", content=blob[: len(blob) // 2], headers=BLOB), 422, "checksum"),
        (b.put("/neural/markets/Q/state", content=b"not a state", headers=BLOB), 422, "bad header"),
        (b.put("/neural/markets/OTHER/state", content=blob, headers=BLOB), 422, "'Q'"),
        (b.put("/neural/markets/Q/state", content=blob, headers={**AUTH, "Content-Type": "application/json"}), 415, "octet"),
        (b.put("/neural/markets/Q/state", content=blob, headers={"Content-Type": MEDIA_TYPE}), 401, "token"),
    ]
    for r, status, words in cases:
        assert r.status_code == status, r.text
        assert words in r.json()["error"]["message"]
    with _client(_service(tmp_path / "c", CEREBELLAR_NORSE_NEURAL__SEED="7")) as other:
        r = other.put("/neural/markets/Q/state", content=blob, headers=BLOB)
        assert r.status_code == 409 and "another network" in r.json()["error"]["message"]
    b.app.state.service.engine.model_version = "v-other"  # type: ignore[attr-defined]
    r = b.put("/neural/markets/Q/state", content=blob, headers=BLOB)
    assert r.status_code == 409 and "model" in r.json()["error"]["message"]
    after = b.get("/debug/markets/Q/state", headers=AUTH).json()
    for key in ("captured_at", "model_version"):
        before.pop(key), after.pop(key)
    assert after == before


def test_export_and_release_errors(trio: tuple[TestClient, TestClient, TestClient]) -> None:
    a, _, _ = trio
    assert a.post("/neural/markets/NOPE/export", headers=AUTH).status_code == 404
    assert a.post("/neural/markets/NOPE/export").status_code == 401
    r = a.post("/neural/markets/NOPE/release", headers=AUTH)
    assert r.status_code == 409 and r.json()["error"]["type"] == "conflict"
    assert a.post("/neural/markets/NOPE/process", headers=AUTH).status_code in (404, 405)
    assert not a.get("/neural/moves", headers=AUTH).json()["markets"]  # the failed export froze nothing


def test_x_market_id_header_must_name_every_tick(trio: tuple[TestClient, TestClient, TestClient]) -> None:
    a, _, _ = trio
    r = a.post("/neural/process", json=tick("A", 0), headers={"X-Market-ID": "B"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "market_id"
    r = a.post("/neural/process/batch", json={"ticks": [tick("A", 0), tick("B", 0)]}, headers={"X-Market-ID": "A"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "ticks.1.market_id"
    r = a.post("/neural/process/batch", json={"ticks": [tick("A", 0)]}, headers={"X-Market-ID": "B"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "ticks.0.market_id"  # a batch of one is a batch
    assert a.get("/debug/markets/A/state", headers=AUTH).status_code == 404  # refused before any state changed
    assert a.post("/neural/process", json=tick("A", 0), headers={"X-Market-ID": "A"}).status_code == 200


def test_a_stream_routed_by_its_query_names_the_query_not_a_header(trio: tuple[TestClient, TestClient, TestClient]) -> None:
    a, _, _ = trio
    with a.websocket_connect("/neural/stream?market_id=Q1") as ws:
        ws.send_json(tick("Q2", 0))
        err = ws.receive_json()["error"]
        assert err["field"] == "market_id" and "?market_id=" in err["message"] and "header" not in err["message"]
    with a.websocket_connect("/neural/stream", headers={"X-Market-ID": "Q1"}) as ws:
        ws.send_json(tick("Q2", 0))
        assert "X-Market-ID header 'Q1'" in ws.receive_json()["error"]["message"]
    # a ?market_id= given twice counts by its first, as HAProxy's url_param routes it: a tick of the second market
    # would be applied on the replica of the first
    with a.websocket_connect("/neural/stream?market_id=Q3&market_id=Q4") as ws:
        ws.send_json(tick("Q4", 0))
        err = ws.receive_json()["error"]
        assert err["field"] == "market_id" and "?market_id= of the stream 'Q3'" in err["message"], err
    assert a.get("/debug/markets/Q4/state", headers=AUTH).status_code == 404
    # an empty header is a header, as on HTTP: it names the market "", not "no routing" (?market_id= not used)
    with a.websocket_connect("/neural/stream?market_id=Q2", headers={"X-Market-ID": ""}) as ws:
        ws.send_json(tick("Q2", 0))
        assert "X-Market-ID header ''" in ws.receive_json()["error"]["message"]
    r = a.post("/neural/process", json=tick("Q2", 0), headers={"X-Market-ID": ""})
    assert r.status_code == 422 and "X-Market-ID header ''" in r.json()["error"]["message"]
    assert a.get("/debug/markets/Q2/state", headers=AUTH).status_code == 404


def test_export_bytes_are_a_checksummed_npz(trio: tuple[TestClient, TestClient, TestClient]) -> None:
    import io
    import json

    from cerebellar_norse.storage import unseal

    a, _, _ = trio
    send(a, "N", range(12))
    payload = unseal(a.post("/neural/markets/N/export", headers=AUTH).content, "export")
    with np.load(io.BytesIO(payload), allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        assert {"enc", "v_gr", "v_pc", "v_out"} <= set(z.files)
    assert meta["market_id"] == "N" and meta["ticks"] == 12 and meta["last_timestamp"] == tick("N", 11)["timestamp"]
    assert meta["model_version"] == a.app.state.service.engine.model_version  # type: ignore[attr-defined]


def _resealed(blob: bytes, meta_changes: dict[str, Any] | None = None, enc_changes: dict[int, float] | None = None) -> bytes:
    """An export whose content was changed and whose checksum was made again (as anyone can)."""
    import io
    import json

    from cerebellar_norse.storage import seal, unseal

    with np.load(io.BytesIO(unseal(blob, "export")), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = {**json.loads(str(arrays["meta"])), **(meta_changes or {})}
    arrays["meta"] = np.array(json.dumps(meta))
    arrays["enc"] = arrays["enc"].copy()
    for index, value in (enc_changes or {}).items():
        arrays["enc"][index] = value
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return seal(buf.getvalue())


def test_an_export_resealed_with_bad_values_is_refused(trio: tuple[TestClient, TestClient, TestClient]) -> None:
    from cerebellar_norse.neurons.encoder import S_LAST_TS, S_N_TICKS

    a, b, _ = trio
    send(a, "R", range(6))
    blob = a.post("/neural/markets/R/export", headers=AUTH).content
    ts = tick("R", 5)["timestamp"]
    cases = [
        (_resealed(blob, {"last_timestamp": "x"}), "disagrees"),
        (_resealed(blob, {"ticks": -5}), "disagrees"),
        (_resealed(blob, {"last_timestamp": 10**30}), "disagrees"),
        (_resealed(blob, {"ticks": 6.5}), "disagrees"),
        (_resealed(blob, {"last_timestamp": 1e30}, {S_LAST_TS: 1e30}), "out of range"),
        (_resealed(blob, {"ticks": -1}, {S_N_TICKS: -1.0}), "out of range"),
        (_resealed(blob, None, {S_N_TICKS: 6.5}), "out of range"),
    ]
    from cerebellar_norse.storage import seal

    cases.append((seal(b"sealed bytes that are no archive"), "not an npz archive of arrays"))
    for body, words in cases:
        r = b.put("/neural/markets/R/state", content=body, headers=BLOB)
        assert r.status_code == 422 and words in r.json()["error"]["message"], r.text
        assert "pickle" not in r.json()["error"]["message"], r.text  # numpy's advice is no advice here
    assert b.get("/debug/markets/R/state", headers=AUTH).status_code == 404  # nothing was imported
    r = b.put("/neural/markets/R/state", content=_resealed(blob), headers=BLOB)  # resealed unchanged: accepted
    assert r.status_code == 200 and (r.json()["ticks"], r.json()["last_timestamp"]) == (6, ts), r.text


def test_an_export_of_a_newer_format_is_refused_as_such(trio: tuple[TestClient, TestClient, TestClient]) -> None:
    """During a rolling upgrade a market moved from a replica of a newer version (its export format raised) to one of
    this version is refused saying so (it read 'unknown export format 2'), and a garbled format as before."""
    a, b, _ = trio
    send(a, "R", range(3))
    blob = a.post("/neural/markets/R/export", headers=AUTH).content
    r = b.put("/neural/markets/R/state", content=_resealed(blob, {"format": 2}), headers=BLOB)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"].startswith(
        "request body: exported by a newer version of cerebellar-norse (export format 2; this version reads format 1): "
        "import it into a replica running that version"), r.text
    r = b.put("/neural/markets/R/state", content=_resealed(blob, {"format": "2"}), headers=BLOB)
    assert r.status_code == 422 and "unknown export format '2' (this service reads format 1)" in r.text, r.text
    assert b.get("/debug/markets/R/state", headers=AUTH).status_code == 404  # nothing was imported


@pytest.mark.parametrize("bad_id", ["R\n1", " R", "R" * 65, "R\u00e9"])
def test_an_import_under_an_invalid_market_id_is_refused(trio: tuple[TestClient, TestClient, TestClient],
                                                         bad_id: str) -> None:
    """No tick can name such a market: importing it would hold a slot, and be checkpointed, for good."""
    a, b, _ = trio
    send(a, "R", range(3))
    blob = a.post("/neural/markets/R/export", headers=AUTH).content
    r = b.put(f"/neural/markets/{m(bad_id)}/state", content=_resealed(blob, {"market_id": bad_id}), headers=BLOB)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "market_id"
    assert b.get("/debug/markets", headers=AUTH).json()["total"] == 0  # nothing was imported


def test_an_older_state_is_refused_and_changes_nothing(trio: tuple[TestClient, TestClient, TestClient]) -> None:
    """An export whose last tick is earlier than the market's last tick here would set the market back silently."""
    a, b, ref = trio
    send(a, "S", range(3))  # the stale copy: last tick k=2
    expected = send(ref, "S", range(12))[10:]
    send(b, "S", range(10))  # the newer state held by the target: last tick k=9
    before = b.get("/debug/markets/S/state", headers=AUTH).json()
    old = a.post("/neural/markets/S/export", headers=AUTH).content
    r = b.put("/neural/markets/S/state", content=old, headers=BLOB)
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["type"] == "conflict" and err["field"] == "market_id"
    assert str(tick("S", 2)["timestamp"]) in err["message"] and str(tick("S", 9)["timestamp"]) in err["message"]
    after = b.get("/debug/markets/S/state", headers=AUTH).json()
    for key in ("captured_at",):
        before.pop(key), after.pop(key)
    assert after == before
    assert b.post("/neural/process", json=tick("S", 5)).status_code == 409  # still past k=9: out of order
    assert send(b, "S", range(10, 12)) == expected  # and continues from its own state
    # the same last tick, or a market not held here, is accepted as before
    same = ref.post("/neural/markets/S/export", headers=AUTH).content
    send(b, "T", range(1))
    c = b.put("/neural/markets/S/state", content=same, headers=BLOB)
    assert c.status_code == 200 and c.json()["replaced"] is True, c.text
    fresh = b.put("/neural/markets/S/state", content=old, headers={**BLOB})  # now older again: refused
    assert fresh.status_code == 409
    b.delete("/neural/markets/S", headers=AUTH)
    r = b.put("/neural/markets/S/state", content=old, headers=BLOB)  # reset here: the old state is all there is
    assert r.status_code == 200 and r.json()["replaced"] is False, r.text


@pytest.mark.parametrize(("field", "value", "words"), [
    (0, 0.0, "encoder last price 0.0: out of range (> 0 once a tick was seen)"),
    (0, -5.0, "encoder last price -5.0: out of range"),
    (6, -1.0, "encoder feature variances [-1.0,"),
    (3, 1e300, "encoder feature means [1e+300,"),
    (9, -1.0, "encoder feature counts [-1.0,"),
])
def test_an_import_whose_encoder_no_tick_can_reach_is_refused(trio: tuple[TestClient, TestClient, TestClient],
                                                              field: int, value: float, words: str) -> None:
    """Such a state (finite, so it passed) was imported, and the market's next tick stepped it into NaN (the log of a
    price <= 0, the root of a negative variance) while its answer still looked like probabilities; the next checkpoint
    then held a state the next start refuses, with every other market's in the same file."""
    a, b, _ = trio
    send(a, "Q", range(30))
    blob = a.post("/neural/markets/Q/export", headers=AUTH).content
    with np.load(io.BytesIO(unseal(blob, "export")), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["enc"][field] = value
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    r = b.put("/neural/markets/Q/state", content=seal(buf.getvalue()), headers=BLOB)
    assert r.status_code == 422, r.text
    assert words in r.json()["error"]["message"] and "no market's ticks lead to it" in r.json()["error"]["message"]
    assert b.get("/debug/markets/Q/state", headers=AUTH).status_code == 404  # nothing imported


def test_an_import_whose_last_tick_is_ahead_of_the_clock_is_refused(trio: tuple[TestClient, TestClient, TestClient]) -> None:
    """A state whose last tick lies years ahead (a tick the service refuses as future_timestamp) was imported; the
    market then refused every real tick as out of order until that time."""
    a, b, _ = trio
    send(a, "Q", range(5))
    blob = a.post("/neural/markets/Q/export", headers=AUTH).content
    with np.load(io.BytesIO(unseal(blob, "export")), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    ahead = 4_000_000_000_000  # 2096
    arrays["enc"][S_LAST_TS] = ahead
    arrays["meta"] = np.array(json.dumps({**json.loads(str(arrays["meta"])), "last_timestamp": ahead}, sort_keys=True))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    r = b.put("/neural/markets/Q/state", content=seal(buf.getvalue()), headers=BLOB)
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["type"] == "future_timestamp" and err["field"] == "market_id"
    assert f"last tick at {ahead} is" in err["message"] and "server.max_clock_skew_ms = 300000 ms" in err["message"]
    assert b.get("/debug/markets/Q/state", headers=AUTH).status_code == 404  # nothing imported
    assert send(b, "Q", range(5, 6))  # the market takes ticks
