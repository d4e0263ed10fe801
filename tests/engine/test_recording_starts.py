"""Recorded starting states: a recording made while markets are warm replays with zero divergence.

The engine serves ticks with recording off (markets warm up), then recording is
switched on, or a file is rotated in the middle of the stream; the recording holds, at
each market's first tick in each file, the market's full state from just before the
step (or "from rest"), and ``replay --detect-divergence --tolerance 0`` finds not a
single bit of difference. Planted changes (an edited starting state, an edited tick,
another model) are found at the right tick; a damaged companion is refused by
``--verify-data`` and by ``replay``, naming the file and the problem.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_helpers import T0, moving_ticks, run, serve

from cerebellar_norse.config import Config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.recorder import TickRecorder, state_record
from cerebellar_norse.engine.recording import read_recording, scan_states
from cerebellar_norse.engine.recording_format import HEADER_V1, STATES_MAGIC, checksum_path, states_path
from cerebellar_norse.errors import DataError
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.ticks import Tick
from cerebellar_norse.training.checkpoints import ModelStore

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"

# legal market ids that need escaping somewhere: CSV quoting, JSON, file-system-like names
ODD_IDS = ["ES", "a,b", 'q"x', "x/y", "../up", "\\", "'", "#c", "sp ace", "{}", "~" * 64]
WARM = 25  # ticks each market sees before recording starts


def with_recording(cfg: Config, on: bool) -> Config:
    return cfg.model_copy(update={"debug": cfg.debug.model_copy(update={"record_requests": on})})


def recordings(cfg: Config) -> list[Path]:
    return sorted((Path(cfg.paths.state_dir) / "recordings").glob("ticks-*.csv"))


def report(capsys: pytest.CaptureFixture[str], config_file: Path, path: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run(capsys, "--config", config_file, "replay", path, "--detect-divergence", "--json",
                         "--tolerance", "0", *extra)
    return code, (json.loads(out) if out.strip() else {}), err


def by_market(rep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["market_id"]: m for m in rep["markets"]}


async def warm_then_record(cfg: Config, markets: list[str], new: list[str], per_market: int = 20) -> tuple[Engine, list[Tick]]:
    """Serve ``markets`` WARM ticks with recording off, then ``markets + new`` with it on; returns the recorded ticks."""
    engine = Engine(with_recording(cfg, False))
    await serve(engine, moving_ticks(markets, WARM))
    engine.cfg = cfg  # recording switched on (a config reload)
    recorded = moving_ticks(markets + new, per_market, start=WARM)
    await serve(engine, recorded)
    await engine.drain(save=False)
    return engine, recorded


def rewrite_states(path: Path, edit: Any) -> None:
    """Rewrite a companion with ``edit(market, state)`` applied to every state, with fresh digests and sidecar."""
    states, problems, _, _ = scan_states(path)
    assert problems == []
    data = STATES_MAGIC + b"".join(state_record(line, st.market_id, edit(st.market_id, dict(st.state)))
                                   for line, st in sorted(states.items()))
    path.write_bytes(data)
    checksum_path(path).write_text(f"{hashlib.sha256(data).hexdigest()}  {path.name}\n", encoding="ascii")


# -- zero divergence --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_markets_warm_when_recording_starts_replay_with_zero_divergence(cfg: Config, config_file: Path,
                                                                              capsys: pytest.CaptureFixture[str]) -> None:
    engine, ticks = await warm_then_record(cfg, ["LIVE", "a,b"], ["NEW"])
    (path,) = recordings(cfg)
    scan = read_recording(path)
    assert scan.version == 2 and scan.ticks == ticks
    first = {m: next(r for r in scan.records if r.tick.market_id == m) for m in ("LIVE", "a,b", "NEW")}
    assert {m: r.start for m, r in first.items()} == {"LIVE": "state", "a,b": "state", "NEW": "rest"}
    assert sorted(st.market_id for st in scan.states.values()) == ["LIVE", "a,b"]
    assert all(r.start == "" for r in scan.records if r not in first.values())
    # the state recorded is the one the market had after its last tick before recording (WARM ticks seen)
    assert scan.states[first["LIVE"].line].state["enc"].shape == engine.arrays.read_slot(0)["enc"].shape
    assert engine.recorder is None and checksum_path(states_path(path)).exists()

    code, rep, err = report(capsys, config_file, path)
    assert code == 0, err
    assert rep["diverged"] == [] and rep["tolerance"] == 0 and rep["compared"] == len(ticks)
    assert {m["market_id"]: (m["start"], m["max_abs_diff"]) for m in rep["markets"]} == {
        "LIVE": ("state", 0.0), "a,b": ("state", 0.0), "NEW": ("rest", 0.0)}

    # the same recording without its starting states is what replay could do before: LIVE diverges at once
    v1 = path.with_name("copy.csv")
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="ascii"))))[1:]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(row[:9] for row in rows)
    v1.write_text(HEADER_V1 + buf.getvalue(), encoding="ascii")
    code, rep, _ = report(capsys, config_file, v1)
    assert code == 1 and set(rep["diverged"]) == {"LIVE", "a,b"}
    d = by_market(rep)["LIVE"]["first_divergence"]
    assert d["tick_index"] == 0 and d["at_first_tick"] and by_market(rep)["LIVE"]["start"] == "not recorded"
    assert by_market(rep)["NEW"]["first_divergence"] is None
    code, out, _ = run(capsys, "--config", config_file, "replay", v1, "--detect-divergence")
    assert code == 1 and "probably not at rest when recording started" in out


@pytest.mark.asyncio
async def test_every_file_of_a_stream_rotated_midway_replays_on_its_own(cfg: Config, config_file: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    markets = ["A", "B/1", 'c"d']
    engine = Engine(with_recording(cfg, False))
    await serve(engine, moving_ticks(markets, WARM))
    engine.cfg = cfg
    engine.recorder = TickRecorder(Path(cfg.paths.state_dir) / "recordings", max_bytes=6000)
    ticks = moving_ticks(markets, 60, start=WARM)
    for k in range(0, len(ticks), 15):  # the writer catches up now and then, as it does every 0.1 s
        await serve(engine, ticks[k:k + 15])
        assert engine.recorder.flush()
    await engine.drain(save=False)

    files = recordings(cfg)
    assert len(files) >= 3
    assert [t for p in files for t in read_recording(p).ticks] == ticks  # nothing lost at the seams
    for p in files:
        scan = read_recording(p)
        starts = {r.tick.market_id: r.start for r in scan.records if r.start}
        assert starts == {m: "state" for m in {r.tick.market_id for r in scan.records}}, p  # every market warm
        code, rep, err = report(capsys, config_file, p)
        assert code == 0, (p, err)
        assert rep["diverged"] == [] and rep["compared"] == len(scan.records)
        assert all(m["max_abs_diff"] == 0.0 for m in rep["markets"])


@pytest.mark.asyncio
async def test_markets_evicted_or_reset_mid_recording_restart_from_rest_in_replay(cfg: Config, config_file: Path,
                                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    small = cfg.model_copy(update={"performance": cfg.performance.model_copy(
        update={"max_markets": 2, "memory_pool_enabled": False})})
    engine = Engine(with_recording(small, False))
    await serve(engine, moving_ticks(["A", "B"], WARM))
    engine.cfg = small
    ticks = moving_ticks(["A", "B", "C"], 12, start=WARM)  # three markets in two slots: evictions all along
    await serve(engine, ticks[:18], batch=1)
    assert engine.reset_market("A") or engine.reset_market("B") or engine.reset_market("C")
    await serve(engine, ticks[18:], batch=1)
    assert engine.pool.table.evictions > 0
    await engine.drain(save=False)

    (path,) = recordings(cfg)
    scan = read_recording(path)
    assert sum(r.start == "rest" for r in scan.records) > 3  # every return after an eviction starts from rest
    code, rep, err = report(capsys, config_file, path)
    assert code == 0, err
    assert rep["diverged"] == [] and rep["compared"] == len(ticks)


@pytest.mark.asyncio
async def test_odd_market_ids_round_trip_with_their_states(cfg: Config, config_file: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    _, ticks = await warm_then_record(cfg, ODD_IDS, [], per_market=4)
    (path,) = recordings(cfg)
    scan = read_recording(path)
    assert scan.ticks == ticks
    assert sorted(st.market_id for st in scan.states.values()) == sorted(ODD_IDS)
    code, rep, err = report(capsys, config_file, path)
    assert code == 0, err
    assert rep["diverged"] == [] and sorted(rep["markets"][i]["market_id"] for i in range(len(ODD_IDS))) == sorted(ODD_IDS)


def test_companion_records_hold_any_market_id(tmp_path: Path) -> None:
    """The companion's JSON header escapes what no CSV field could hold (the service never accepts such ids)."""
    ids = ["line\nbreak", "tab\there", "\u00e9\u4e2d\U0001f600", '"quoted",comma', "a/b\\c", "\x00nul"]
    rng = np.random.default_rng(1)
    states: list[dict[str, np.ndarray]] = [{"enc": rng.normal(size=4), "v": rng.normal(size=(2, 3)).astype(np.float32)}
                                           for _ in ids]
    path = tmp_path / "ticks-20240101-0001.states"
    path.write_bytes(STATES_MAGIC + b"".join(state_record(2 + i, m, s) for i, (m, s) in enumerate(zip(ids, states, strict=True))))
    data = path.read_bytes()
    assert all(json.dumps(m).encode("ascii") in data for m in ids)  # escaped in the JSON header lines
    got, problems, warnings, _ = scan_states(path, check_sum=False)
    assert problems == warnings == []
    assert [got[2 + i].market_id for i in range(len(ids))] == ids
    for i, s in enumerate(states):
        for k, v in s.items():
            assert got[2 + i].state[k].dtype == v.dtype and np.array_equal(got[2 + i].state[k], v)


@pytest.mark.asyncio
async def test_request_ids_batches_and_positions_are_recorded(cfg: Config) -> None:
    engine = Engine(cfg)
    ticks = moving_ticks(["A", "B"], 5)
    await engine.submit(ticks[0])
    await engine.submit_many(ticks[1:6])
    await engine.drain(save=False)
    (path,) = recordings(cfg)
    recs = read_recording(path).records
    assert [(r.batch, r.seq) for r in recs] == [(0, 0), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]
    assert [r.start for r in recs] == ["rest", "rest", "", "", "", ""]
    assert all(r.request_id == "" for r in recs)  # the engine hands over none yet

    rec = TickRecorder(tmp := Path(cfg.paths.state_dir) / "direct")
    rec.record(ticks[:3], None, "v", ["r-1", None, "r,3"])
    rec.close()
    (path,) = sorted(tmp.glob("ticks-*.csv"))
    assert [r.request_id for r in read_recording(path).records] == ["r-1", "", "r,3"]


# -- planted divergences ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_edited_starting_state_is_found_at_the_markets_first_tick(cfg: Config, config_file: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    await warm_then_record(cfg, ["LIVE", "OTHER"], [])
    (path,) = recordings(cfg)
    first = next(r for r in read_recording(path).records if r.tick.market_id == "LIVE")

    def nudge(market: str, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if market == "LIVE":
            state["v_out"] = state["v_out"] + np.asarray(0.5, dtype=state["v_out"].dtype)
        return state

    rewrite_states(states_path(path), nudge)
    code, rep, err = report(capsys, config_file, path)
    assert code == 1, err
    assert rep["diverged"] == ["LIVE"]
    d = by_market(rep)["LIVE"]["first_divergence"]
    assert (d["tick_index"], d["line"], d["at_first_tick"]) == (0, first.line, False)
    assert d["recorded"] != d["replayed"]


@pytest.mark.asyncio
async def test_an_edited_tick_and_another_model_are_found_at_their_ticks(cfg: Config, config_file: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    store = ModelStore(Path(cfg.paths.state_dir))
    for version, seed in (("vA", 8), ("vOther", 11)):
        seeded = cfg.model_copy(update={"neural": cfg.neural.model_copy(update={"seed": seed})})
        store.save(generate_weights(seeded), cfg, {}, version)
    engine = Engine(with_recording(cfg, False), store.load("vA").weights, "vA")
    await serve(engine, moving_ticks(["A", "B"], WARM))
    engine.cfg = cfg
    ticks = moving_ticks(["A", "B"], 20, start=WARM)
    await serve(engine, ticks)
    await engine.drain(save=False)
    (path,) = recordings(cfg)
    original = path.read_bytes()

    def rewrite(edit: Any) -> None:
        rows = list(csv.reader(io.StringIO(original.decode("ascii"))))
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([rows[0], *(edit(i, row) for i, row in enumerate(rows[1:]))])
        path.write_text(buf.getvalue(), encoding="ascii")
        checksum_path(path).write_text(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n", encoding="ascii")

    nth = 7  # the 8th recorded tick of B gets the volume of another
    index = [i for i, t in enumerate(ticks) if t.market_id == "B"][nth]
    rewrite(lambda i, row: [*row[:3], "1234.5", *row[4:]] if i == index else row)
    code, rep, err = report(capsys, config_file, path)
    assert code == 1, err
    assert rep["diverged"] == ["B"]
    d = by_market(rep)["B"]["first_divergence"]
    assert (d["tick_index"], d["line"]) == (nth, index + 2)

    switch = 11
    rewrite(lambda i, row: [*row[:7], "vOther", *row[8:]] if i >= switch else row)
    code, rep, err = report(capsys, config_file, path)
    assert code == 1, err
    assert rep["model_versions"] == ["vA", "vOther"] and set(rep["diverged"]) == {"A", "B"}
    for m in ("A", "B"):
        first_other = next(i for i, t in enumerate(ticks) if i >= switch and t.market_id == m)
        assert by_market(rep)[m]["first_divergence"]["line"] == first_other + 2


# -- damaged companions -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_damaged_companion_is_refused_by_verify_and_replay(cfg: Config, config_file: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    await warm_then_record(cfg, ["LIVE", "a,b"], [])
    (path,) = recordings(cfg)
    companion = states_path(path)
    state_dir = Path(cfg.paths.state_dir)
    code, out, err = run(capsys, "--verify-data", state_dir)
    assert code == 0, err
    assert f"{path}: recording OK ({len(read_recording(path).records)} ticks, 2 starting states, checksum verified)" in out
    assert_verify_lines_as_documented(out, path, len(read_recording(path).records), sealed=True)

    good = companion.read_bytes()
    damaged = bytearray(good)
    damaged[-20] ^= 0x01  # one bit of the last state's payload
    companion.write_bytes(bytes(damaged))
    code, _, err = run(capsys, "--verify-data", state_dir)
    assert code == 1
    assert f"cerebellar-norse: {companion}: checksum mismatch" in err
    assert f"{companion}: record at byte" in err and "payload does not match its sha256" in err
    code, out, err = run(capsys, "--config", config_file, "replay", path, "--detect-divergence")
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.startswith(f"cerebellar-norse: {companion}: checksum mismatch")
    with pytest.raises(DataError) as refused:
        read_recording(path)
    assert any(p.startswith(f"{companion}: record at byte") and "payload does not match its sha256" in p
               for p in refused.value.report)

    # the open file (no sidecars): the record's own digest still catches it
    checksum_path(companion).unlink()
    checksum_path(path).unlink()
    code, _, err = run(capsys, "--config", config_file, "replay", path, "--detect-divergence")
    assert code == 1 and f"{companion}: record at byte" in err and "payload does not match its sha256" in err

    # missing altogether: the first line that needs it is named
    companion.unlink()
    code, _, err = run(capsys, "--config", config_file, "replay", path, "--detect-divergence")
    assert code == 1 and f"{companion.name}, which is missing" in err and f"{path}:" in err

    # a header that is not JSON, and a state of the wrong shape for this config
    companion.write_bytes(STATES_MAGIC + b"not json\n")
    code, _, err = run(capsys, "--verify-data", state_dir)
    assert code == 1 and f"{companion}: record at byte {len(STATES_MAGIC)}: record header is not a JSON line" in err
    companion.write_bytes(good)
    rewrite_states(companion, lambda m, s: {**s, "v_out": np.zeros((*s["v_out"].shape, 2), dtype=s["v_out"].dtype)})
    checksum_path(companion).unlink()
    code, _, err = run(capsys, "--config", config_file, "replay", path, "--detect-divergence")
    assert code == 1 and "does not fit this config's network (field 'v_out'" in err and f"{path}:" in err


def test_a_companion_cut_by_a_crash_is_a_warning(tmp_path: Path) -> None:
    path = _one_state_one_rest(tmp_path)
    assert [r.start for r in read_recording(path).records] == ["state", "rest"]
    companion = states_path(path)
    for side in (checksum_path(path), checksum_path(companion)):
        side.unlink()
    companion.write_bytes(companion.read_bytes() + b'{"line":9,')  # a record cut short after the last one
    scan = read_recording(path)
    assert len(scan.states) == 1 and any("last record" in w and "incomplete" in w for w in scan.warnings)


class _OnePool:  # the slot table and arrays before_step reads: market "W" holds a state, others none
    class table:  # noqa: N801
        @staticmethod
        def get(m: str) -> int | None:
            return 0 if m == "W" else None

    class arrays:  # noqa: N801
        @staticmethod
        def read_slot(slot: int) -> dict[str, np.ndarray]:
            return {"enc": np.arange(4.0)}


def _one_state_one_rest(rdir: Path) -> Path:
    """A closed recording in ``rdir`` of one batch: market "W" from a held state, "N" from rest."""
    rec = TickRecorder(rdir)
    batch = [Tick(100.0, 1.0, T0, "W"), Tick(100.0, 1.0, T0, "N")]
    rec.before_step(_OnePool(), batch)  # type: ignore[arg-type]
    rec.record(batch)
    rec.close()
    (path,) = sorted(rdir.glob("ticks-*.csv"))
    return path


@pytest.mark.parametrize("what", ["dangling link", "FIFO", "/dev/zero"])
@pytest.mark.parametrize("name", ["{rec}.sha256", "{stem}.states", "{stem}.states.sha256"])
def test_a_recordings_file_that_is_no_regular_file_is_named_not_waited_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, what: str) -> None:
    """A FIFO or a link to /dev/zero as a recording's checksum or starting-state file made --verify-data wait for a
    writer (or read) for ever; a dangling link as the recording's checksum file made the closed recording pass for the
    open one (verified line by line, exit 0)."""
    import os
    import threading

    rdir = tmp_path / "recordings"
    path = _one_state_one_rest(rdir)
    target = rdir / name.format(rec=path.name, stem=path.stem)
    assert target.exists()
    target.unlink()
    if what == "FIFO":
        os.mkfifo(target)
    else:
        target.symlink_to(tmp_path / "gone" if what == "dangling link" else Path(what))
    got: list[tuple[int, str, str]] = []
    t = threading.Thread(target=lambda: got.append(run(capsys, "--verify-data", tmp_path)), daemon=True)
    t.start()
    t.join(30)
    assert got, "--verify-data still running after 30 s"
    code, _, err = got[0]
    assert code == 1 and str(target) in err and "Traceback" not in err


def assert_verify_lines_as_documented(out: str, path: Path, ticks: int, sealed: bool) -> None:
    """``--verify-data`` printed its line for the recording as docs/operations.md's table (Recordings, Verify)
    shows it, with N ticks and K starting states written out."""
    row = "| closed file matches its checksum" if sealed else "| the open file"
    (shown,) = [line.split("`")[1] for line in OPERATIONS.read_text(encoding="utf-8").splitlines() if line.startswith(row)]
    shown = re.sub(r"-\d{4}\.csv", path.name[-9:], shown)  # the doc's sample file, …-0003.csv, as this one
    shown = shown.replace("(N ticks", f"({ticks} ticks").replace("K starting states", "2 starting states")
    pattern = ".*".join(re.escape(part) for part in shown.split("…"))
    assert any(re.fullmatch(pattern, line) and line.startswith(str(path)) for line in out.splitlines()), (shown, out)


@pytest.mark.asyncio
async def test_an_open_recording_with_starting_states_verifies_as_documented(cfg: Config, capsys: pytest.CaptureFixture[str]) -> None:
    """The open file (the newest one without a checksum: left by a crash) with starting states; the doc showed its
    line without them."""
    await warm_then_record(cfg, ["LIVE", "a,b"], [])
    (path,) = recordings(cfg)
    checksum_path(path).unlink()
    checksum_path(states_path(path)).unlink()
    code, out, err = run(capsys, "--verify-data", Path(cfg.paths.state_dir))
    assert code == 0, err
    assert_verify_lines_as_documented(out, path, len(read_recording(path).records), sealed=False)
