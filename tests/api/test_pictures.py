"""``GET /debug/markets/{id}/raster.png`` and ``cerebellar-norse plot-market``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP, tick

from cerebellar_norse.api.deps import ServiceState
from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.cli import main
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.observability.pictures import PNG_MAGIC, TRACE_KEY, MarketTrace

TOKEN = "pic-s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ODD = 'a/b,"c" d'


@pytest.fixture
def svc(tmp_path: Path) -> ServiceState:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP,
               "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN}
    return build_service(load_checked_config(None, environ=environ))


@pytest.fixture
def tc(svc: ServiceState) -> Iterator[TestClient]:
    with TestClient(make_app(svc, restore=False, save_on_shutdown=False)) as c:
        yield c


def send(tc: TestClient, market: str, ks: range) -> None:
    for k in ks:
        r = tc.post("/neural/process", json=tick(market, k))
        assert r.status_code == 200, r.text


def raster(tc: TestClient, market: str, **kw: Any) -> Any:
    return tc.get(f"/debug/markets/{quote(market, safe='')}/raster.png", **kw)


def test_raster_needs_the_token_and_a_known_market(tc: TestClient) -> None:
    send(tc, ODD, range(2))
    assert raster(tc, ODD).status_code == 401
    assert raster(tc, ODD, headers={"Authorization": "Bearer wrong"}).status_code == 401
    r = raster(tc, "NOPE", headers=AUTH)
    assert r.status_code == 404 and "holds no state" in r.json()["error"]["message"]
    assert raster(tc, ODD, headers=AUTH, params={"ticks": 0}).status_code == 422


def test_raster_is_a_png_of_the_ticks_since_the_first_request(tc: TestClient, svc: ServiceState) -> None:
    send(tc, ODD, range(3))
    first = raster(tc, ODD, headers=AUTH)
    assert first.status_code == 200 and first.headers["content-type"] == "image/png"
    assert first.content[:8] == PNG_MAGIC
    send(tc, ODD, range(3, 13))
    send(tc, "OTHER", range(5))  # not watched: not recorded
    trace = svc.trackers[TRACE_KEY]
    assert isinstance(trace, MarketTrace) and set(trace.rings) == {ODD}
    series = trace.series(ODD, 200)
    assert len(series["spikes"]) == 10
    assert series["spikes"].sum() > 0
    assert np.isfinite(series["v"]).all() and np.isfinite(series["readout"]).all()
    assert series["readout"].shape == (10, 3)
    r = raster(tc, ODD, headers=AUTH, params={"ticks": 4})
    assert r.status_code == 200 and r.content[:8] == PNG_MAGIC and len(r.content) > len(first.content)
    assert len(trace.series(ODD, 4)["spikes"]) == 4


@pytest.mark.parametrize("market", ["$$", "$x^$", "$_$", r"$\undefinedcmd$"])
def test_market_ids_that_look_like_math_text_are_drawn_literally(tc: TestClient, market: str) -> None:
    """matplotlib reads "$...$" in a title as math text: "$$" was a 500."""
    send(tc, market, range(3))
    first = raster(tc, market, headers=AUTH)  # starts watching the market: no ticks drawn yet
    assert first.status_code == 200 and first.content[:8] == PNG_MAGIC, first.text
    send(tc, market, range(3, 5))
    drawn = raster(tc, market, headers=AUTH)
    assert drawn.status_code == 200 and drawn.content[:8] == PNG_MAGIC, drawn.text


def test_weight_histograms_take_any_version_text() -> None:
    from cerebellar_norse.config import load_config
    from cerebellar_norse.neurons.topology import generate_weights
    from cerebellar_norse.observability.pictures import histogram_png, literal

    w = generate_weights(load_config(None, environ={}))
    assert histogram_png(w, "my$_$model", (w, "/models/$$other")).startswith(PNG_MAGIC)
    assert literal("$x$ \\$") == "\\$x\\$ \\\\$"


def test_plot_market_writes_the_png(tc: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    import httpx

    base = "http://svc.test"
    seen: list[str] = []

    def get(url: str, headers: dict[str, str], timeout: float) -> httpx.Response:
        assert url.startswith(base)
        seen.append(url)
        return tc.get(url[len(base):], headers=headers)

    monkeypatch.setattr(httpx, "get", get)
    send(tc, ODD, range(5))
    out = tmp_path / "plots" / "m.png"  # a directory not made yet: made, as every command's --output does
    argv = ["plot-market", "--market", ODD, "--url", base, "--output", str(out), "--ticks", "50"]
    assert main([*argv, "--token", TOKEN]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert seen[-1].endswith(f"/debug/markets/{quote(ODD, safe='')}/raster.png?ticks=50")
    assert f"written to {out}" in capsys.readouterr().out
    out.unlink()
    assert main(argv) == 1  # no token
    assert "401" in capsys.readouterr().err and not out.exists()
    assert main(["plot-market", "--market", "NOPE", "--url", base, "--output", str(out), "--token", TOKEN]) == 1
    err = capsys.readouterr().err
    assert "404" in err and "holds no state" in err and TOKEN not in err
    monkeypatch.undo()
    assert main(["plot-market", "--market", ODD, "--url", "http://127.0.0.1:1", "--output", str(out)]) == 1
    assert "cannot reach the service" in capsys.readouterr().err


def test_trace_of_a_batch_with_repeated_markets_syncs_only_watched_slots() -> None:
    from types import SimpleNamespace

    from cerebellar_norse.engine.records import BatchRecord
    from cerebellar_norse.observability import pictures

    synced: list[list[int]] = []
    arrays = SimpleNamespace(v_gr=np.ones((4, 5)), v_pc=np.full((4, 2), 2.0), v_dcn=np.full((4, 3), 3.0),
                             v_out=np.arange(12.0).reshape(4, 3))
    engine = SimpleNamespace(pool=SimpleNamespace(table={"A": 1, "B": 2, "C": 3}, arrays=arrays),
                             backend=SimpleNamespace(sync_to_host=synced.append), sinks=[])
    registry: dict[str, Any] = {}
    trace = MarketTrace.attach(engine, registry)  # type: ignore[arg-type]
    assert MarketTrace.attach(engine, registry) is trace and len(engine.sinks) == 1  # type: ignore[arg-type]
    spikes = np.array([[5, 1, 0], [6, 2, 1], [7, 3, 2], [8, 4, 3]])
    rec = BatchRecord(size=4, step_ns=0, slots=np.array([1, 2, 1, 3]),
                      ticks=np.array([[0.0] * 4, [0.0] * 4, [10.0, 11.0, 12.0, 13.0]]), spikes=spikes)
    trace.observe(rec)  # nobody watched: nothing recorded, no sync
    assert synced == []
    trace.watch("A")
    trace.watch("C")
    trace.observe(rec)
    assert sorted(synced[0]) == [1, 3]
    a = trace.series("A", 10)
    assert a["time_ms"].tolist() == [10.0, 12.0] and a["spikes"].tolist() == [[5, 1, 0], [7, 3, 2]]
    assert np.isnan(a["v"][0]).all() and a["v"][1].tolist() == [1.0, 2.0, 3.0]  # potentials once, at the last tick
    assert np.isnan(a["readout"][0]).all() and a["readout"][1].tolist() == [3.0, 4.0, 5.0]
    assert pictures.raster_png(a)[:8] == PNG_MAGIC
    assert trace.series("B", 10)["spikes"].shape == (0, 3)
    for k in range(pictures.WATCHED_MAX):
        trace.watch(f"M{k}")
    assert "A" not in trace.rings and "C" not in trace.rings and len(trace.rings) == pictures.WATCHED_MAX


def test_the_same_ticks_asked_for_again_are_not_drawn_again(tc: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A HEAD and its GET (or a reload) drew the same picture twice, about half a second each; it is kept and sent again,
    and drawn anew once the market has new ticks or other ticks are asked for."""
    from cerebellar_norse.api.routes import debug
    from cerebellar_norse.observability.pictures import raster_png

    drawn: list[int] = []

    def counting(series: dict[str, Any]) -> bytes:
        drawn.append(len(series["spikes"]))
        return raster_png(series)

    monkeypatch.setattr(debug, "raster_png", counting)
    send(tc, ODD, range(3))
    raster(tc, ODD, headers=AUTH)  # watched from here on
    send(tc, ODD, range(3, 8))
    first = raster(tc, ODD, headers=AUTH)
    head = tc.head(f"/debug/markets/{quote(ODD, safe='')}/raster.png", headers=AUTH)
    again = raster(tc, ODD, headers=AUTH)
    assert first.status_code == head.status_code == again.status_code == 200
    assert again.content == first.content and int(head.headers["content-length"]) == len(first.content)
    assert drawn == [0, 5]
    assert raster(tc, ODD, headers=AUTH, params={"ticks": 2}).status_code == 200  # other ticks: drawn
    send(tc, ODD, range(8, 9))
    newer = raster(tc, ODD, headers=AUTH)  # a new tick: drawn
    assert newer.content != first.content and drawn == [0, 5, 2, 6]


def test_a_raster_is_drawn_in_the_pool_of_server_worker_threads(tc: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawing a picture (about half a second of CPU) is blocking work off the hot path: it runs in the thread pool that
    ``server.worker_threads`` sizes, as the config's description and docs/operations.md say, not in a pool of its own."""
    import threading

    from cerebellar_norse.api.routes import debug
    from cerebellar_norse.observability.pictures import raster_png

    threads: list[str] = []

    def where(series: dict[str, Any]) -> bytes:
        threads.append(threading.current_thread().name)
        return raster_png(series)

    monkeypatch.setattr(debug, "raster_png", where)
    send(tc, "W", range(3))
    assert raster(tc, "W", headers=AUTH).status_code == 200
    assert len(threads) == 1 and threads[0].startswith("cerebellar-norse-worker"), threads
