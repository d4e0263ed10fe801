"""Recordings (``debug.record_requests``): escaping, replay, checksums, rotation, overflow.

Every legal market id (1–64 printable ASCII characters, ``,`` and ``"`` included) must
come back from a recording unchanged and in order, so that ``replay`` feeds the network
exactly the ticks that were served; a recording cut or edited after the fact is refused
by ``--verify-data`` and by ``replay`` (exit 1, naming the file and line).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_helpers import T0, core, run

from cerebellar_norse.config import load_config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.recorder import TickRecorder
from cerebellar_norse.engine.recording import read_recording, verify_recordings
from cerebellar_norse.engine.recording_format import COLUMNS, checksum_path
from cerebellar_norse.errors import DataError
from cerebellar_norse.neurons.network import CerebellarNetwork
from cerebellar_norse.ticks import Tick

# The ids that broke the unescaped format, and the other legal extremes.
SPECIAL_IDS = ["a,b", '"q', 'x"y', " sp ", "\\", "\\\\", "M" * 64, ",", '"', '""', "a b", "'", "x\\,\"y", "#"]
PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))  # every legal character, in 64-character ids
ALL_IDS = [*SPECIAL_IDS, *(PRINTABLE[i:i + 64] for i in range(0, len(PRINTABLE), 64)), "PLAIN"]


def interleaved_ticks(ids: list[str], per_market: int = 3) -> list[Tick]:
    """Ticks of every market, interleaved, times rising (ties across markets keep their order)."""
    out = []
    for k in range(per_market):
        for j, m in enumerate(ids):
            out.append(Tick(100.0 + 0.37 * j + 0.011 * k, float(j * k) + 0.5, T0 + 1000 * k, m))
    return out


def recording_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("ticks-*.csv"))


def record_and_close(directory: Path, ticks: list[Tick], **kw: Any) -> TickRecorder:
    rec = TickRecorder(directory, **kw)
    rec.record(ticks, np.tile([0.25, 0.5, 0.25], (len(ticks), 1)), "v1")
    rec.close()
    return rec


# -- the format --------------------------------------------------------------------------


def test_every_legal_market_id_round_trips_with_what_was_served(tmp_path: Path) -> None:
    ticks = interleaved_ticks(ALL_IDS)
    rng = np.random.default_rng(0)
    probs = rng.dirichlet([1.0, 1.0, 1.0], len(ticks)).astype(np.float32)
    rids = [f"req-{i}" if i % 3 else None for i in range(len(ticks))]
    rec = TickRecorder(tmp_path)
    rec.record(ticks[:5], probs[:5], "model \"v1\", x", rids[:5])
    rec.record(ticks[5:], probs[5:], "model \"v1\", x", rids[5:])
    rec.close()
    assert (rec.written, rec.dropped) == (len(ticks), 0)
    (path,) = recording_files(tmp_path)
    assert path.read_text().splitlines()[0] == ",".join(COLUMNS)
    scan = read_recording(path)
    assert scan.ticks == ticks  # identical ticks (ids, prices, volumes, times) in the order recorded
    assert [r.probabilities for r in scan.records] == [tuple(p) for p in probs.astype(np.float64).tolist()]
    assert {r.model_version for r in scan.records} == {'model "v1", x'}
    assert [r.request_id for r in scan.records] == [r or "" for r in rids]
    assert [r.line for r in scan.records] == list(range(2, len(ticks) + 2))


def test_records_without_results_leave_the_result_fields_empty(tmp_path: Path) -> None:
    rec = TickRecorder(tmp_path)
    rec.write([Tick(100.0, 1.0, T0, "A")])
    rec.close()
    (path,) = recording_files(tmp_path)
    assert path.read_text().splitlines()[1] == f"{T0},A,100.0,1.0,,,,,,0,0,"  # batch 0, position 0, start not captured
    (r,) = read_recording(path).records
    assert r.probabilities is None and r.model_version == "" and r.request_id == ""


def test_free_text_fields_stay_on_one_line(tmp_path: Path) -> None:
    rec = TickRecorder(tmp_path)
    rec.record([Tick(100.0, 1.0, T0, "A")], None, "v1\nv2", ["id\r\n\u00e9"])
    rec.close()
    (path,) = recording_files(tmp_path)
    assert len(path.read_text().splitlines()) == 2
    (r,) = read_recording(path).records
    assert (r.model_version, r.request_id) == ("v1?v2", "id???")


# -- record -> replay through the service path ---------------------------------------------


@pytest.mark.asyncio
async def test_served_ticks_replay_to_the_results_that_were_served(config_file: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(config_file, environ={})
    ticks = interleaved_ticks(ALL_IDS)
    engine = Engine(cfg)
    served = [core(r) for r in await engine.submit_many(ticks[:7])]
    for t in ticks[7:]:
        served.append(core(await engine.submit(t)))
    await engine.drain(save=False)

    (path,) = recording_files(tmp_path / "state" / "recordings")
    assert checksum_path(path).exists()
    assert read_recording(path).ticks == ticks
    assert {r.model_version for r in read_recording(path).records} == {engine.model_version}

    code, out, err = run(capsys, "--config", config_file, "replay", path, "--json")
    assert code == 0, err
    replayed = [core(json.loads(line)) for line in out.splitlines()]
    assert replayed == served  # same ticks, same order: bit-identical results
    want = [core(r) for r in CerebellarNetwork(cfg, max_markets=len(ALL_IDS)).process_ticks(ticks)]
    assert replayed == want

    code, out, err = run(capsys, "--config", config_file, "replay", path)
    assert code == 0, err
    assert f"replayed {len(ticks)} ticks of {len(ALL_IDS)} markets" in out


def test_plain_tick_csv_still_replays(config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv_path = tmp_path / "ticks.csv"
    csv_path.write_text("timestamp,market_id,price,volume\n"
                        f"{T0},A,100.0,5\n{T0 + 1},\"a,b\",101.0,6\n{T0 + 2},A,100.5,7\n", encoding="utf-8")
    code, out, err = run(capsys, "--config", config_file, "replay", csv_path, "--json")
    assert code == 0, err
    assert [json.loads(line)["market_id"] for line in out.splitlines()] == ["A", "a,b", "A"]


def test_plain_tick_csv_names_every_skipped_row(config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv_path = tmp_path / "ticks.csv"
    rows = "".join(f"{T0 + i},A,{100 + i % 7}.0,5\n" for i in range(200))
    csv_path.write_text("timestamp,market_id,price,volume\n" + rows + f"{T0 + 500},a,b,100.0,5\n", encoding="utf-8")
    code, out, err = run(capsys, "--config", config_file, "replay", csv_path, "--json")
    assert code == 0, err
    assert len(out.splitlines()) == 200
    assert f"warning: row skipped: {csv_path}:202: expected 4 fields, got 5" in err


# -- corrupt recordings: --verify-data and replay ---------------------------------------------


def _cut_mid_line(data: bytes) -> bytes:
    return data[:-7]


def _drop_last_line(data: bytes) -> bytes:
    return data[:data.rstrip(b"\n").rfind(b"\n") + 1]


def _edit_price(data: bytes) -> bytes:
    return data.replace(b",100.37,", b",100.38,", 1)


def _drop_middle_line(data: bytes) -> bytes:
    lines = data.split(b"\n")
    return b"\n".join(lines[:3] + lines[4:])


def _unbalance_quote(data: bytes) -> bytes:
    return data.replace(b',"""q",', b',""q",', 1)


CORRUPTIONS = {"cut-mid-line": _cut_mid_line, "last-line-removed": _drop_last_line, "price-edited": _edit_price,
               "line-removed": _drop_middle_line, "quote-removed": _unbalance_quote}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_closed_recording_cut_or_edited_fails_verify_and_replay(corrupt: Any, config_file: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    rdir = tmp_path / "state" / "recordings"
    record_and_close(rdir, interleaved_ticks(ALL_IDS))
    (path,) = recording_files(rdir)
    code, out, err = run(capsys, "--verify-data", tmp_path / "state")
    assert (code, err) == (0, "")
    assert f"{path}: recording OK ({3 * len(ALL_IDS)} ticks, checksum verified)" in out

    data = path.read_bytes()
    changed = corrupt(data)
    assert changed != data
    path.write_bytes(changed)

    code, out, err = run(capsys, "--verify-data", tmp_path / "state")
    assert code == 1
    assert f"cerebellar-norse: {path}: checksum mismatch" in err
    code, out, err = run(capsys, "--config", config_file, "replay", path, "--json")
    assert code == 1 and out == ""
    assert f"cerebellar-norse: {path}: checksum mismatch" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("edit", "line", "reason"), [
    (lambda s: s.replace('"a,b"', "a,b", 1), 2, "expected 12 fields, got 13"),
    (lambda s: s.replace('"""q"', '""q"', 1), 3, "',' expected after '\"'"),
    (lambda s: s.replace(",100.37,", ",-1.0,", 1), 3, "price '-1.0' is not > 0"),
    (lambda s: s.replace(f"{T0 + 1000},", f"{T0 - 1},", 1), 2 + len(ALL_IDS), "goes back in time"),
    (lambda s: s.replace(f"{T0},", "17,", 1), 2, "timestamp 17 is not between"),
    (lambda s: s.replace("\n", "\n\n", 1), 2, "expected 12 fields, got 0"),
], ids=["unquoted-comma", "broken-quote", "bad-price", "time-backwards", "bad-time", "blank-line"])
def test_malformed_open_recording_is_refused_naming_file_and_line(edit: Any, line: int, reason: str, config_file: Path,
                                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rdir = tmp_path / "state" / "recordings"
    record_and_close(rdir, interleaved_ticks(ALL_IDS))
    (path,) = recording_files(rdir)
    checksum_path(path).unlink()  # the newest file without a checksum: the open one (or left by a crash)
    path.write_text(edit(path.read_text()))

    code, _, err = run(capsys, "--config", config_file, "replay", path, "--json")
    assert code == 1
    first = err.splitlines()[0]
    assert first.startswith(f"cerebellar-norse: {path}:{line}: ") and reason in first, err
    with pytest.raises(DataError, match=f"^{path}:{line}: "):
        read_recording(path)
    code, _, err = run(capsys, "--verify-data", tmp_path / "state")
    assert code == 1
    assert f"cerebellar-norse: {path}:{line}: " in err and reason in err


def test_torn_last_line_of_open_recording_is_a_warning(config_file: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rdir = tmp_path / "state" / "recordings"
    ticks = interleaved_ticks(ALL_IDS)
    record_and_close(rdir, ticks)
    (path,) = recording_files(rdir)
    checksum_path(path).unlink()
    path.write_bytes(path.read_bytes()[:-9])  # a crash cut the last record
    torn = len(ticks) + 1

    code, out, err = run(capsys, "--verify-data", tmp_path / "state")
    assert code == 0, err
    assert f"cerebellar-norse: warning: {path}:{torn}: last line is incomplete" in err
    assert f"{path}: open recording OK so far ({len(ticks) - 1} ticks" in out

    code, out, err = run(capsys, "--config", config_file, "replay", path, "--json")
    assert code == 0, err
    assert f"warning: {path}:{torn}: last line is incomplete" in err
    assert [json.loads(line)["market_id"] for line in out.splitlines()] == [t.market_id for t in ticks[:-1]]


def test_closed_recording_without_checksum_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rdir = tmp_path / "recordings"
    record_and_close(rdir, interleaved_ticks(["A"]))
    record_and_close(rdir, interleaved_ticks(["B"]))
    first, second = recording_files(rdir)
    assert first.name.endswith("-0001.csv") and second.name.endswith("-0002.csv")
    checksum_path(first).unlink()
    code, _, err = run(capsys, "--verify-data", tmp_path)
    assert code == 1
    assert f"cerebellar-norse: {first}: checksum file {first.name}.sha256 missing" in err

    checksum_path(first).write_text(f"{hashlib.sha256(first.read_bytes()).hexdigest()}  {first.name}\n")
    second.unlink()  # a checksum whose recording is gone
    code, _, err = run(capsys, "--verify-data", tmp_path)
    assert code == 1
    assert f"cerebellar-norse: {second}: recording missing" in err


def test_old_unescaped_recordings_are_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rdir = tmp_path / "recordings"
    record_and_close(rdir, interleaved_ticks(["A"]))
    (rdir / "ticks-20220101.csv").write_text(f"timestamp,market_id,price,volume\n{T0},a,b,100.0,1.0\n")
    code, _, err = run(capsys, "--verify-data", tmp_path)
    assert code == 0
    assert "ticks-20220101.csv: recording in the old format" in err
    for p in recording_files(rdir):
        if p.name != "ticks-20220101.csv":
            p.unlink()
            checksum_path(p).unlink()
    code, _, err = run(capsys, "--verify-data", tmp_path)
    assert code == 0 and "no models or state files found" not in err


# -- open files, crashes ----------------------------------------------------------------------


def test_open_files_of_running_recorders_are_checked_line_by_line(tmp_path: Path) -> None:
    a, b = TickRecorder(tmp_path), TickRecorder(tmp_path)
    try:
        a.record([Tick(100.0, 1.0, T0, "A")])
        assert a.flush()
        b.record([Tick(100.0, 1.0, T0, "B")])
        assert b.flush()
        first, second = recording_files(tmp_path)  # both open: the older one is locked by its writer
        assert not checksum_path(first).exists() and not checksum_path(second).exists()
        v = verify_recordings(tmp_path)
        assert v.problems == [] and v.warnings == []
        assert sorted(v.ok) == [f"{p}: open recording OK so far (1 ticks checked line by line; checksummed when closed)"
                                for p in (first, second)]
    finally:
        a.close()
        b.close()
    v = verify_recordings(tmp_path)
    assert v.problems == [] and len(v.ok) == 2 and all("checksum verified" in line for line in v.ok)


def test_file_left_open_by_a_crash_is_checksummed_by_the_next_recorder(tmp_path: Path) -> None:
    ticks = interleaved_ticks(["A", "B"])
    record_and_close(tmp_path, ticks)
    (left,) = recording_files(tmp_path)
    checksum_path(left).unlink()
    left.write_bytes(left.read_bytes() + b"1640995203000,A,10")  # the crash cut a record

    record_and_close(tmp_path, ticks)
    first, second = recording_files(tmp_path)
    assert first == left and second.name.endswith("-0002.csv")
    assert checksum_path(left).exists()
    v = verify_recordings(tmp_path)
    assert v.problems == []
    assert v.warnings == [f"{left}:{len(ticks) + 2}: last line is incomplete (cut by a crash while it was written); ignored"]
    assert read_recording(left).ticks == ticks


# -- rotation ---------------------------------------------------------------------------------


def _sha256sum_ok(path: Path) -> bool:
    digest, name = checksum_path(path).read_text().rstrip("\n").split("  ")
    return name == path.name and digest == hashlib.sha256(path.read_bytes()).hexdigest()


def test_rotation_by_size_checksums_every_closed_file(tmp_path: Path) -> None:
    ticks = interleaved_ticks(ALL_IDS, per_market=10)
    rec = TickRecorder(tmp_path, max_bytes=1500)
    for start in range(0, len(ticks), 7):
        rec.record(ticks[start:start + 7], np.tile([0.1, 0.2, 0.7], (len(ticks[start:start + 7]), 1)), "v1")
        if start % 5 == 0:
            assert rec.flush()
    rec.close()
    files = recording_files(tmp_path)
    assert len(files) >= 3
    # a new file starts at the first batch handed over after the current one reached max_bytes: it holds at most
    # what the writer had taken when it got there (here at most 5 batches of 7 ticks between two flushes)
    longest = max(len(line) for p in files for line in p.read_bytes().splitlines(keepends=True)[1:])
    assert all(p.stat().st_size <= 1500 + 35 * longest for p in files)
    assert all(len(read_recording(p).records) > 0 for p in files)
    assert all(_sha256sum_ok(p) for p in files)
    assert [t for p in files for t in read_recording(p).ticks] == ticks
    v = verify_recordings(tmp_path)
    assert v.problems == [] and v.warnings == [] and len(v.ok) == len(files)


def test_rotation_by_utc_date(tmp_path: Path) -> None:
    now = [datetime(2024, 1, 1, 23, 59, 59, 900_000, tzinfo=UTC).timestamp()]
    rec = TickRecorder(tmp_path, clock=lambda: now[0])
    rec.record([Tick(100.0, 1.0, T0, "A")])
    assert rec.flush()
    assert [p.name for p in recording_files(tmp_path)] == ["ticks-20240101-0001.csv"]
    assert not checksum_path(tmp_path / "ticks-20240101-0001.csv").exists()
    now[0] += 0.2  # past midnight UTC
    rec.record([Tick(100.0, 1.0, T0 + 1, "A")])
    assert rec.flush()
    assert _sha256sum_ok(tmp_path / "ticks-20240101-0001.csv")
    rec.close()
    assert [p.name for p in recording_files(tmp_path)] == ["ticks-20240101-0001.csv", "ticks-20240102-0001.csv"]
    assert _sha256sum_ok(tmp_path / "ticks-20240102-0001.csv")
    assert [r.tick.timestamp for p in recording_files(tmp_path) for r in read_recording(p).records] == [T0, T0 + 1]


def test_file_is_closed_at_midnight_without_traffic(tmp_path: Path) -> None:
    now = [datetime(2024, 1, 1, 23, 59, 59, tzinfo=UTC).timestamp()]
    rec = TickRecorder(tmp_path, clock=lambda: now[0], flush_interval_s=0.01)
    try:
        rec.record([Tick(100.0, 1.0, T0, "A")])
        assert rec.flush()
        path = tmp_path / "ticks-20240101-0001.csv"
        assert path.exists() and not checksum_path(path).exists()
        now[0] += 2.0
        deadline = time.monotonic() + 10
        while not checksum_path(path).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _sha256sum_ok(path)
    finally:
        rec.close()
    assert recording_files(tmp_path) == [path]


# -- off the hot path -----------------------------------------------------------------------


def test_overflow_drops_and_counts_without_blocking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = TickRecorder(tmp_path, capacity=4, flush_interval_s=0.01)
    inside, release = threading.Event(), threading.Event()
    write = rec._write_batches

    def stuck_disk(batches: Any) -> None:  # the writer thread hangs on the disk
        inside.set()
        assert release.wait(30)
        write(batches)

    monkeypatch.setattr(rec, "_write_batches", stuck_disk)
    ticks = [Tick(100.0, 1.0, T0 + i, "A") for i in range(2000)]
    assert rec.record(ticks[:1]) == 1
    assert inside.wait(10)  # the first tick is in the writer's hands; the buffer is empty again
    taken = [rec.record(ticks[1:4]), rec.record(ticks[4:7])]  # 3 fit, then 1 of 3
    t0 = time.perf_counter()
    for i in range(7, 2000):
        taken.append(rec.record(ticks[i:i + 1]))
    per_call = (time.perf_counter() - t0) / 1993
    assert taken[:2] == [3, 1] and sum(taken[2:]) == 0
    assert rec.dropped == 2 + 1993
    assert per_call < 0.001  # never waits for the disk
    release.set()
    rec.close()
    (path,) = recording_files(tmp_path)
    assert read_recording(path).ticks == ticks[:5]
    assert rec.written == 5 and rec.dropped == 1995
    assert rec.record(ticks[:1]) == 0 and rec.dropped == 1996  # closed: dropped, counted


@pytest.mark.asyncio
async def test_engine_hands_ticks_to_the_recorder_without_writing(config_file: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(load_config(config_file, environ={}))
    release = threading.Event()
    await engine.submit(Tick(100.0, 1.0, T0, "A"))
    assert engine.recorder is not None
    write = engine.recorder._write_batches
    monkeypatch.setattr(engine.recorder, "_write_batches", lambda b: (release.wait(30), write(b)))
    t0 = time.perf_counter()
    for i in range(1, 50):
        await asyncio.wait_for(engine.submit(Tick(100.0, 1.0, T0 + i, "A")), 5)  # the disk hangs, requests do not
    assert time.perf_counter() - t0 < 5
    release.set()
    await engine.drain(save=False)
    (path,) = recording_files(tmp_path / "state" / "recordings")
    assert [t.timestamp for t in read_recording(path).ticks] == [T0 + i for i in range(50)]


def test_close_without_waiting_still_closes_the_file(tmp_path: Path) -> None:
    rec = TickRecorder(tmp_path)
    rec.record([Tick(100.0, 1.0, T0, "A")])
    rec.close(wait=False)
    assert rec.flush()  # returns once the writer has stopped
    (path,) = recording_files(tmp_path)
    assert _sha256sum_ok(path) and read_recording(path).ticks == [Tick(100.0, 1.0, T0, "A")]


def test_failed_writes_are_logged_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    rec = TickRecorder(blocked)
    assert rec.record([Tick(100.0, 1.0, T0, "A"), Tick(100.0, 1.0, T0 + 1, "A")]) == 2
    assert rec.flush()
    rec.close()
    assert (rec.written, rec.dropped, rec.write_errors) == (0, 2, 1)
    assert any(r.levelname == "ERROR" and "recording write failed" in r.getMessage() for r in caplog.records)
    assert any(r.levelname == "WARNING" and "recording dropped 2 ticks" in r.getMessage() for r in caplog.records)
