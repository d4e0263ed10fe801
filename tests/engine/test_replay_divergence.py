"""``replay --detect-divergence``: a recording made by the engine replays bit for bit; planted changes are found.

Each test serves ticks through the real :class:`Engine` with ``debug.record_requests``
on, then replays the recording with the real command line (in process) and reads its
report: zero divergence for the untouched recording; for an edited price, the edited
tick of that market and no other; for another model version, the first tick served
"by" it in each market.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import T0, moving_ticks, run, serve

from cerebellar_norse.config import Config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.recording import read_recording
from cerebellar_norse.engine.recording_format import checksum_path
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.ticks import Tick
from cerebellar_norse.training.checkpoints import ModelStore

MARKETS = ["ES", "a,b", 'q"x']
PER_MARKET = 30


def store_model(cfg: Config, version: str, seed: int) -> None:
    """Store the untrained network of ``seed`` as model ``version`` (same shape, other weights)."""
    seeded = cfg.model_copy(update={"neural": cfg.neural.model_copy(update={"seed": seed})})
    ModelStore(Path(cfg.paths.state_dir)).save(generate_weights(seeded), cfg, {}, version)


def the_recording(cfg: Config) -> Path:
    (path,) = sorted((Path(cfg.paths.state_dir) / "recordings").glob("ticks-*.csv"))
    return path


async def record_served_by(cfg: Config, version: str, seed: int) -> tuple[list[Tick], Path]:
    """Store the seed network as model ``version``, serve the test's ticks with it and return them and the recording."""
    store_model(cfg, version, seed)
    engine = Engine(cfg, ModelStore(Path(cfg.paths.state_dir)).load(version).weights, version)
    ticks = moving_ticks(MARKETS, PER_MARKET)
    await serve(engine, ticks)
    await engine.drain(save=False)
    return ticks, the_recording(cfg)


def rewrite(path: Path, edit: Callable[[int, list[str]], list[str]]) -> None:
    """Rewrite a recording's records (``edit(record index, fields)``) in its own format, with a fresh checksum."""
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="ascii"))))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(rows[0])
    for i, row in enumerate(rows[1:]):
        w.writerow(edit(i, row))
    path.write_text(buf.getvalue(), encoding="ascii")
    checksum_path(path).write_text(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n", encoding="ascii")


def report(capsys: pytest.CaptureFixture[str], config_file: Path, path: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run(capsys, "--config", config_file, "replay", path, "--detect-divergence", "--json", *extra)
    return code, (json.loads(out) if out.strip() else {}), err


def by_market(rep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["market_id"]: m for m in rep["markets"]}


@pytest.mark.asyncio
async def test_engine_recording_replays_with_zero_divergence(cfg: Config, config_file: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    ticks, path = await record_served_by(cfg, "vA", seed=8)
    assert all(r.probabilities is not None and r.model_version == "vA" for r in read_recording(path).records)

    code, rep, err = report(capsys, config_file, path)
    assert code == 0, err
    assert rep["diverged"] == [] and rep["model_versions"] == ["vA"]
    assert rep["ticks"] == rep["compared"] == len(ticks)
    for m in MARKETS:
        entry = by_market(rep)[m]
        assert (entry["ticks"], entry["compared"], entry["max_abs_diff"], entry["first_divergence"]) == (PER_MARKET, PER_MARKET, 0.0, None)

    code, out, err = run(capsys, "--config", config_file, "replay", path, "--detect-divergence")
    assert code == 0, err
    assert "no divergence" in out.splitlines()[-1]
    assert f"replayed {len(ticks)} ticks of {len(MARKETS)} markets" in out


@pytest.mark.asyncio
async def test_untrained_seed_network_and_a_model_swap_mid_recording_replay_exactly(cfg: Config, config_file: Path,
                                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    store_model(cfg, "vB", seed=9)
    engine = Engine(cfg)  # no stored model: serves seed-<seed>
    ticks = moving_ticks(MARKETS, PER_MARKET)
    await serve(engine, ticks[:40])
    engine.set_weights(ModelStore(Path(cfg.paths.state_dir)).load("vB").weights, "vB")  # market states kept
    await serve(engine, ticks[40:])
    await engine.drain(save=False)

    code, rep, err = report(capsys, config_file, the_recording(cfg))
    assert code == 0, err
    assert rep["model_versions"] == [f"seed-{cfg.neural.seed}", "vB"]
    assert rep["diverged"] == [] and rep["compared"] == len(ticks)


@pytest.mark.asyncio
async def test_an_edited_price_is_found_at_its_tick_and_only_in_its_market(cfg: Config, config_file: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    engine = Engine(cfg)
    ticks = moving_ticks(MARKETS, PER_MARKET)
    await serve(engine, ticks)
    await engine.drain(save=False)
    path = the_recording(cfg)
    target, nth = "a,b", 17  # the 18th tick of market "a,b" ...
    positions = [i for i, t in enumerate(ticks) if t.market_id == target]
    index, previous = positions[nth], ticks[positions[nth - 1]]
    assert ticks[index].price != previous.price  # ... gets its previous price: a return of 0 (a large one was served)
    rewrite(path, lambda i, row: [*row[:2], repr(previous.price), *row[3:]] if i == index else row)

    code, rep, err = report(capsys, config_file, path)
    assert code == 1, err
    assert rep["diverged"] == [target]
    d = by_market(rep)[target]["first_divergence"]
    assert (d["tick_index"], d["line"], d["timestamp"]) == (nth, index + 2, ticks[index].timestamp)
    assert d["max_abs_diff"] > 1e-9 and not d["at_first_tick"]
    assert d["recorded"] != d["replayed"] and len(d["recorded"]) == len(d["replayed"]) == 3
    assert all(by_market(rep)[m]["first_divergence"] is None for m in MARKETS if m != target)

    code, out, _ = run(capsys, "--config", config_file, "replay", path, "--detect-divergence")
    assert code == 1
    line = next(x for x in out.splitlines() if x.startswith('market "a,b"'))
    assert f"DIVERGES at tick {nth} of the market (line {index + 2}" in line and "recorded [" in line and "replayed [" in line
    assert out.splitlines()[-1] == f"divergence in 1 of {len(MARKETS)} markets"

    # a looser tolerance than the difference hides it; --market limits the replay to one market
    code, rep, _ = report(capsys, config_file, path, "--tolerance", "1.0")
    assert code == 0 and rep["diverged"] == []
    code, rep, _ = report(capsys, config_file, path, "--market", "ES")
    assert code == 0 and [m["market_id"] for m in rep["markets"]] == ["ES"]
    code, rep, _ = report(capsys, config_file, path, "--market", target)
    assert code == 1 and by_market(rep)[target]["first_divergence"]["tick_index"] == nth


@pytest.mark.asyncio
async def test_another_model_version_is_found_at_the_first_tick_it_served(cfg: Config, config_file: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    store_model(cfg, "vOther", seed=11)
    ticks, path = await record_served_by(cfg, "vA", seed=8)
    switch = 50  # records from here on claim to be served by vOther
    rewrite(path, lambda i, row: [*row[:7], "vOther", *row[8:]] if i >= switch else row)

    code, rep, err = report(capsys, config_file, path)
    assert code == 1, err
    assert rep["model_versions"] == ["vA", "vOther"]
    assert set(rep["diverged"]) == set(MARKETS)
    for m in MARKETS:
        first_other = next(i for i, t in enumerate(ticks) if i >= switch and t.market_id == m)
        d = by_market(rep)[m]["first_divergence"]
        assert d["line"] == first_other + 2 and d["model_version"] == "vOther"
        assert d["tick_index"] == sum(1 for t in ticks[:first_other] if t.market_id == m)


@pytest.mark.asyncio
async def test_a_recorded_version_missing_from_the_store_is_a_clear_error(cfg: Config, config_file: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    engine = Engine(cfg, generate_weights(cfg), "gone-model")
    await serve(engine, moving_ticks(MARKETS, 3))
    await engine.drain(save=False)
    code, out, err = run(capsys, "--config", config_file, "replay", the_recording(cfg), "--detect-divergence")
    assert code == 1 and out == ""
    assert "'gone-model', which is not stored in" in err and str(Path(cfg.paths.state_dir) / "models") in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # without a comparison, replay goes on through the served model and says so
    code, out, err = run(capsys, "--config", config_file, "replay", the_recording(cfg))
    assert code == 0, err
    assert "model 'gone-model' replayed through the served model" in err
    assert f"through model seed-{cfg.neural.seed} (the served model in place of a version not stored)" in out


@pytest.mark.asyncio
async def test_markets_live_when_recording_starts_replay_from_their_recorded_state(cfg: Config, config_file: Path,
                                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A market already live when recording began replays exactly from its recorded state; a new one from rest."""
    off = cfg.model_copy(update={"debug": cfg.debug.model_copy(update={"record_requests": False})})
    engine = Engine(off)
    await serve(engine, moving_ticks(["LIVE"], 20))  # served before recording was switched on
    engine.cfg = cfg
    await serve(engine, moving_ticks(["LIVE", "NEW"], 20, start=20))
    await engine.drain(save=False)

    code, rep, err = report(capsys, config_file, the_recording(cfg), "--tolerance", "0")
    assert code == 0, err
    assert rep["diverged"] == []
    assert {m: (by_market(rep)[m]["start"], by_market(rep)[m]["compared"]) for m in ("LIVE", "NEW")} == {
        "LIVE": ("state", 20), "NEW": ("rest", 20)}
    code, out, _ = run(capsys, "--config", config_file, "replay", the_recording(cfg), "--detect-divergence")
    assert code == 0 and "no divergence" in out.splitlines()[-1]


def test_divergence_needs_a_recording_and_a_sane_tolerance(tmp_path: Path, config_file: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "ticks.csv"
    plain.write_text(f"timestamp,market_id,price,volume\n{T0},A,100.0,1.0\n{T0 + 1},A,100.5,1.0\n", encoding="ascii")
    code, _, err = run(capsys, "--config", config_file, "replay", plain, "--detect-divergence")
    assert code == 1 and "needs a recording" in err
    code, out, err = run(capsys, "--config", config_file, "replay", plain, "--market", "A", "--json")
    assert code == 0, err
    assert len(out.splitlines()) == 2
    code, _, err = run(capsys, "--config", config_file, "replay", plain, "--market", "B")
    assert code == 1 and "no tick of market 'B'" in err
    with pytest.raises(SystemExit) as usage:  # a value that is no tolerance: a usage error, not "diverged" (exit 1)
        run(capsys, "--config", config_file, "replay", plain, "--detect-divergence", "--tolerance", "-1")
    assert usage.value.code == 2 and "argument --tolerance" in capsys.readouterr().err
