"""Each state dir's identity: a checkpoint and a journal of two different state dirs are never mixed.

A ``market_state.bin`` copied from another service's state dir (same network and model,
a higher journal position) must not make this dir's journal look "already included":
the foreign checkpoint is moved aside with an ERROR naming both, this dir's journal is
kept (never deleted). Old state dirs, written before identities existed, recover as
before; a whole state dir restored from a backup recovers as before.

Also: a market-state import into a full pool whose checkpoint fails gives back the
market it evicted.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import T0, ConfigFactory, tick
from test_journal import assert_same_pool, crash, disk_full, exported_market, feed, start

from cerebellar_norse.config import Config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.handover import import_market
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.engine.persistence import STATE_FILE
from cerebellar_norse.engine.segments import (
    HEADER_SIZE,
    JOURNAL_DIR,
    MAGIC,
    REC,
    SegmentReader,
    list_segments,
    segment_name,
)
from cerebellar_norse.engine.state_dir import STATE_ID_FILE, read_state_id, write_state_id
from cerebellar_norse.storage import read_checksummed, write_checksummed

pytestmark = pytest.mark.asyncio


@pytest.fixture
def two_dirs(engine_config: ConfigFactory, tmp_path: Path) -> Iterator[tuple[Config, Config, list[Durability]]]:
    """Two configs, identical but for their state dirs (two services of the same network and model)."""
    a = engine_config(state_dir=tmp_path / "a", max_markets=16)
    b = engine_config(state_dir=tmp_path / "b", max_markets=16)
    opened: list[Durability] = []
    yield a, b, opened
    for d in opened:
        crash(d)


def sd(cfg: Config) -> Path:
    return Path(cfg.paths.state_dir)


async def crashed_with_journal(cfg: Config, opened: list[Durability], markets: str, n: int) -> Engine:
    """A twin (never stopped) of a service of ``cfg`` that journaled ``n`` ticks per market after its start-up checkpoint,
    then was killed."""
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(n) for m in markets])
    crash(d)
    return twin


async def test_a_checkpoint_copied_from_another_state_dir_is_moved_aside_and_the_journal_kept(
        two_dirs: tuple[Config, Config, list[Durability]], caplog: pytest.LogCaptureFixture) -> None:
    a, b, opened = two_dirs
    await crashed_with_journal(a, opened, "A", 3)  # A: start-up checkpoint at seq 0, records 1..3 in its journal
    eb, db = start(b, opened)  # B: a checkpoint at a higher journal position than A's journal
    await feed([eb], [tick("B", T0 + k) for k in range(20)], chunk=1)
    assert await db.checkpoint() and db.seq == 20
    crash(db)
    shutil.copy2(sd(b) / STATE_FILE, sd(a) / STATE_FILE)  # the operator's mistake
    (_, seg), = list_segments(sd(a) / JOURNAL_DIR)
    raw = seg.read_bytes()

    with caplog.at_level(logging.ERROR):
        e2, _ = start(a, opened)
    assert "B" not in e2.pool.table  # never silently used
    (moved,) = sd(a).glob(f"{STATE_FILE}.foreign-*")
    assert moved.read_bytes() == (sd(b) / STATE_FILE).read_bytes()
    assert "another state dir" in caplog.text and str(moved) in caplog.text and str(seg) in caplog.text
    # this dir's journal (acknowledged ticks of A) is kept, never deleted
    (kept,) = (sd(a) / JOURNAL_DIR).glob(f"{seg.name}.corrupt-*")
    assert kept.read_bytes() == raw and str(kept) in caplog.text
    assert "the checkpoint it continues is not in this state dir any more" in caplog.text


async def test_whole_state_dir_restored_from_a_backup_recovers(two_dirs: tuple[Config, Config, list[Durability]]) -> None:
    """``cp -r`` of a stopped (killed) state dir, then restored over a dir that went on: the backup recovers as it was."""
    a, _b, opened = two_dirs
    twin = await crashed_with_journal(a, opened, "AC", 4)
    backup = sd(a).parent / "backup"
    shutil.copytree(sd(a), backup)
    e, d = start(a, opened)  # the service goes on after the backup
    await feed([e], [tick("A", T0 + 100 + k) for k in range(5)])
    crash(d)
    shutil.rmtree(sd(a))
    shutil.copytree(backup, sd(a))  # restore the whole dir
    e2, _ = start(a, opened)
    assert_same_pool(e2, twin)
    assert not list(sd(a).glob("**/*.foreign-*")) and not list(sd(a).glob("**/*.corrupt-*"))


async def test_a_checkpoint_and_journal_restored_without_the_identity_file_recover(
        two_dirs: tuple[Config, Config, list[Durability]]) -> None:
    """A backup of only ``market_state.bin`` and ``journal/`` (no identity file): they agree, so they are used."""
    a, b, opened = two_dirs
    twin = await crashed_with_journal(a, opened, "AC", 4)
    sd(b).mkdir()
    shutil.copy2(sd(a) / STATE_FILE, sd(b) / STATE_FILE)
    shutil.copytree(sd(a) / JOURNAL_DIR, sd(b) / JOURNAL_DIR)
    assert not (sd(b) / STATE_ID_FILE).exists()
    e2, _ = start(b, opened)
    assert_same_pool(e2, twin)
    assert read_state_id(sd(b)) == read_state_id(sd(a))  # it took their identity (the file's "created" is its own)


def strip_identity(state_dir: Path) -> None:
    """Make the state dir look written by the code before identities: no id file, none in the checkpoint or the
    journal headers (same bytes as that code wrote otherwise)."""
    (state_dir / STATE_ID_FILE).unlink()
    ckpt = state_dir / STATE_FILE
    with np.load(io.BytesIO(read_checksummed(ckpt)), allow_pickle=False) as z:
        data = {k: z[k] for k in z.files if k != "state_id"}
    buf = io.BytesIO()
    np.savez(buf, **data)
    write_checksummed(ckpt, buf.getvalue())
    for _, path in list_segments(state_dir / JOURNAL_DIR):
        raw = bytearray(path.read_bytes())
        head = SegmentReader(path)
        meta = json.loads(raw[len(MAGIC) + 8:len(MAGIC) + 8 + REC.unpack_from(raw, len(MAGIC))[0]])
        assert meta.pop("state_id")
        m = json.dumps(meta, sort_keys=True).encode()
        raw[:HEADER_SIZE] = (MAGIC + REC.pack(len(m), zlib.crc32(m)) + m).ljust(HEADER_SIZE, b"\0")
        path.write_bytes(bytes(raw))
        assert SegmentReader(path).state_id is None and SegmentReader(path).base == head.base


async def test_a_state_dir_written_before_identities_recovers_as_before(
        two_dirs: tuple[Config, Config, list[Durability]]) -> None:
    a, _b, opened = two_dirs
    e, d = start(a, opened)
    twin = Engine(a)
    await feed([e, twin], [tick(m, T0 + k) for k in range(5) for m in "AB"])
    assert await d.checkpoint()  # a checkpoint in the middle, the journal after it
    await feed([e, twin], [tick(m, T0 + 10 + k) for k in range(5) for m in "AC"])
    crash(d)
    strip_identity(sd(a))
    e2, d2 = start(a, opened)
    assert_same_pool(e2, twin)
    assert not list(sd(a).glob("**/*.foreign-*")) and not list(sd(a).glob("**/*.corrupt-*"))
    assert (sd(a) / STATE_ID_FILE).exists()  # from now on it has one
    await feed([e2, twin], [tick("A", T0 + 50 + k) for k in range(3)])
    crash(d2)
    e3, _ = start(a, opened)
    assert_same_pool(e3, twin)


async def test_a_new_checkpoint_copied_into_a_state_dir_written_before_identities_is_moved_aside(
        two_dirs: tuple[Config, Config, list[Durability]], caplog: pytest.LogCaptureFixture) -> None:
    a, b, opened = two_dirs
    await crashed_with_journal(a, opened, "A", 3)
    strip_identity(sd(a))  # an old state dir, with its journal
    eb, db = start(b, opened)
    await feed([eb], [tick("B", T0 + k) for k in range(20)], chunk=1)
    assert await db.checkpoint()
    crash(db)
    shutil.copy2(sd(b) / STATE_FILE, sd(a) / STATE_FILE)
    with caplog.at_level(logging.ERROR):
        e2, _ = start(a, opened)
    assert "B" not in e2.pool.table
    assert len(list(sd(a).glob(f"{STATE_FILE}.foreign-*"))) == 1
    assert len(list((sd(a) / JOURNAL_DIR).glob("*.journal*"))) >= 1  # the old journal is kept


async def test_a_journal_file_copied_from_another_state_dir_is_moved_aside(
        two_dirs: tuple[Config, Config, list[Durability]], caplog: pytest.LogCaptureFixture) -> None:
    a, b, opened = two_dirs
    twin = await crashed_with_journal(a, opened, "A", 3)
    eb, db = start(b, opened)
    await feed([eb], [tick("B", T0 + k) for k in range(3)], chunk=1)
    crash(db)
    (_, theirs), = list_segments(sd(b) / JOURNAL_DIR)
    stray = sd(a) / JOURNAL_DIR / segment_name(3)  # as if it followed A's journal
    shutil.copy2(theirs, stray)
    with caplog.at_level(logging.ERROR):
        e2, _ = start(a, opened)
    assert_same_pool(e2, twin)  # A's own journal applied, B's ticks not
    (moved,) = stray.parent.glob(f"{stray.name}.foreign-*")
    assert "another state dir" in caplog.text and str(moved) in caplog.text


async def test_a_damaged_identity_file_is_moved_aside_and_the_state_still_recovers(
        two_dirs: tuple[Config, Config, list[Durability]], caplog: pytest.LogCaptureFixture) -> None:
    a, _b, opened = two_dirs
    twin = await crashed_with_journal(a, opened, "AB", 3)
    idf = sd(a) / STATE_ID_FILE
    idf.write_bytes(idf.read_bytes()[:-3])
    with caplog.at_level(logging.ERROR):
        e2, _ = start(a, opened)
    assert_same_pool(e2, twin)  # the checkpoint and journal agree: their identity is taken
    assert len(list(sd(a).glob(f"{STATE_ID_FILE}.corrupt-*"))) == 1
    assert "checksum mismatch" in caplog.text
    assert read_checksummed(idf)


async def test_an_identity_too_long_for_a_journal_header_is_moved_aside_and_the_state_still_recovers(
        two_dirs: tuple[Config, Config, list[Durability]], caplog: pytest.LogCaptureFixture) -> None:
    """Fuzzed: a checksummed state-id holding 5000 letters was taken as it stood, and the start failed with a traceback
    (ValueError: journal header too long) when the journal file that names it was created."""
    a, _b, opened = two_dirs
    twin = await crashed_with_journal(a, opened, "AB", 3)
    write_state_id(sd(a), "A" * 5000)
    with caplog.at_level(logging.ERROR):
        e2, _ = start(a, opened)
    assert_same_pool(e2, twin)  # the checkpoint's identity is taken, as for any damaged identity file
    assert len(list(sd(a).glob(f"{STATE_ID_FILE}.corrupt-*"))) == 1
    assert "not a state dir identity ('AAAA" in caplog.text and "(5000 characters)" in caplog.text


async def test_a_checkpoint_whose_identity_is_too_long_is_not_adopted(
        two_dirs: tuple[Config, Config, list[Durability]], caplog: pytest.LogCaptureFixture) -> None:
    """Fuzzed: a checksummed market_state.bin carrying a state id of 5000 letters, in a dir without its state-id file,
    had that id adopted, and the start failed with a traceback (journal header too long) creating the journal file
    that names it. The checkpoint is refused as garbled: moved aside, and the dir gets an identity of its own."""
    a, _b, opened = two_dirs
    await crashed_with_journal(a, opened, "AB", 3)
    (sd(a) / STATE_ID_FILE).unlink()
    shutil.rmtree(sd(a) / JOURNAL_DIR)
    ckpt = sd(a) / STATE_FILE
    with np.load(io.BytesIO(read_checksummed(ckpt)), allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    data["state_id"] = np.array("A" * 5000)
    buf = io.BytesIO()
    np.savez(buf, **data)
    write_checksummed(ckpt, buf.getvalue())
    with caplog.at_level(logging.ERROR):
        e2, d2 = start(a, opened)
    assert e2.pool.used == 0  # the garbled checkpoint is not restored
    assert len(list(sd(a).glob(f"{STATE_FILE}.corrupt-*"))) == 1
    assert "garbles its state id ('AAAA" in caplog.text and "(5000 characters)" in caplog.text
    sid = read_state_id(sd(a))
    assert sid is not None and len(sid) <= 64 and d2.state_id == sid


@pytest.mark.parametrize("where", ["journal file", "checkpoint"])
async def test_an_import_into_a_full_pool_whose_checkpoint_fails_gives_the_evicted_market_back(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """A full disk when the import's journal file is created or when its market_state.bin is written: refused for
    now (503 capacity) and undone either way."""
    from cerebellar_norse.engine import journal as journal_mod
    from cerebellar_norse.errors import JournalWaitError

    cfg = engine_config(state_dir=tmp_path / "state", max_markets=2)
    blob = await exported_market(cfg, "X")
    opened: list[Durability] = []
    e, _d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(4) for m in "AB"])  # full: A least recently used
    if where == "journal file":
        monkeypatch.setattr(os, "posix_fallocate", disk_full)
    else:
        def full(*_a: object, **_k: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(journal_mod, "write_snapshot", full)
    with pytest.raises(JournalWaitError, match=r"errno 28 ENOSPC"):
        import_market(e, "X", blob)
    monkeypatch.undo()
    assert_same_pool(e, twin)  # A back in its place, with its state, LRU order unchanged
    assert e.pool.table.evictions == twin.pool.table.evictions
    await e.drain(save=True)
    e2, d2 = start(cfg, opened)
    assert_same_pool(e2, twin)
    crash(d2)


async def test_verify_data_reports_a_checkpoint_of_another_state_dir_that_would_drop_the_journal(
        two_dirs: tuple[Config, Config, list[Durability]]) -> None:
    """A ``market_state.bin`` copied from another service: the start moves it aside and this dir's journal with it
    (every market from rest); --verify-data said every file was OK (exit 0)."""
    from cerebellar_norse.training.checkpoints import verify_tree

    a, b, opened = two_dirs
    await crashed_with_journal(a, opened, "A", 3)
    assert verify_tree(sd(a))[1] == []
    eb, db = start(b, opened)
    await feed([eb], [tick("B", T0 + k) for k in range(20)], chunk=1)
    assert await db.checkpoint()
    crash(db)
    shutil.copy2(sd(b) / STATE_FILE, sd(a) / STATE_FILE)
    _ok, problems = verify_tree(sd(a))
    assert any(str(sd(a) / STATE_FILE) in p and "another state dir" in p for p in problems), problems


async def test_verify_data_reports_a_checkpoint_of_another_state_dir_after_a_clean_stop(
        two_dirs: tuple[Config, Config, list[Durability]]) -> None:
    """The same copy into a dir a clean stop left without journal files: --verify-data said "market state OK" (exit 0),
    and the start moved the file aside as another state dir's, every market from rest."""
    from cerebellar_norse.training.checkpoints import verify_tree

    a, b, opened = two_dirs
    for cfg, market in ((a, "A"), (b, "B")):
        e, d = start(cfg, opened)
        await feed([e], [tick(market, T0 + k) for k in range(3)], chunk=1)
        d.close(save=True)
    assert not list((sd(a) / JOURNAL_DIR).glob("*.journal"))
    assert verify_tree(sd(a))[1] == []
    shutil.copy2(sd(b) / STATE_FILE, sd(a) / STATE_FILE)
    ok, problems = verify_tree(sd(a))
    (problem,) = problems
    assert problem.startswith(f"{sd(a) / STATE_FILE}: written by another state dir (its state id is {read_state_id(sd(b))}")
    assert not any(line.startswith(str(sd(a) / STATE_FILE)) for line in ok)  # not also "OK"
    e2, _ = start(a, opened)
    assert not len(e2.pool.table) and list(sd(a).glob(f"{STATE_FILE}.foreign-*"))  # as the start does


async def test_verify_data_reports_a_journal_that_does_not_continue_the_checkpoint(
        two_dirs: tuple[Config, Config, list[Durability]]) -> None:
    """Only ``market_state.bin`` restored from an older backup: the journal after the newer checkpoint follows a gap, the
    start moves it aside (its acknowledged ticks lost); --verify-data said every file was OK (exit 0)."""
    from cerebellar_norse.training.checkpoints import verify_tree

    a, _b, opened = two_dirs
    e, d = start(a, opened)
    await feed([e], [tick("A", T0 + k) for k in range(4)], chunk=1)
    assert await d.checkpoint()
    old = (sd(a) / STATE_FILE).read_bytes()  # the backup: journal position 4
    await feed([e], [tick("A", T0 + 10 + k) for k in range(4)], chunk=1)
    assert await d.checkpoint()
    await feed([e], [tick("A", T0 + 20 + k) for k in range(3)], chunk=1)  # acknowledged, only in the journal
    crash(d)
    assert verify_tree(sd(a))[1] == []
    (sd(a) / STATE_FILE).write_bytes(old)
    _ok, problems = verify_tree(sd(a))
    (seg,) = [p for _, p in list_segments(sd(a) / JOURNAL_DIR)]
    assert any(str(seg) in p and "missing" in p for p in problems), problems


async def test_a_journal_replayed_into_fewer_slots_warns_of_the_markets_it_evicted(
        engine_config: ConfigFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """max_markets lowered while the service was stopped after a kill -9: the checkpoint fits, but replaying the journal
    evicts markets (even the most recently used one loses its state); that was said at INFO only, with no WARNING
    as a checkpoint with more markets than the pool gets."""
    opened: list[Durability] = []
    try:
        big = engine_config(state_dir=tmp_path / "s", max_markets=16)
        e, d = start(big, opened)
        await feed([e], [tick(m, T0 + k) for k in range(3) for m in "XY"], chunk=1)
        assert await d.checkpoint()
        await feed([e], [tick(m, T0 + 10 + k) for k in range(2) for m in "XYZ"], chunk=1)
        crash(d)
        small = engine_config(state_dir=tmp_path / "s", max_markets=2)
        with caplog.at_level(logging.WARNING):
            start(small, opened)
        assert any(r.levelno == logging.WARNING and "evicted" in r.getMessage() and "max_markets = 2" in r.getMessage()
                   for r in caplog.records), caplog.text
    finally:
        for d in opened:
            crash(d)


async def test_a_journal_header_with_a_garbled_identity_is_unreadable_never_adopted(
        two_dirs: tuple[Config, Config, list[Durability]]) -> None:
    """A journal file's identity is adopted by a dir that has none; a garbled one (100 letters, CRC valid; the journal
    header's room holds about 4,000) went into the next journal header as it stood. Such a header reads as damaged."""
    from cerebellar_norse.engine.segments import segment_state_id

    a, _b, opened = two_dirs
    await crashed_with_journal(a, opened, "AB", 3)
    (_, path), = list_segments(sd(a) / JOURNAL_DIR)
    raw = bytearray(path.read_bytes())
    meta = json.loads(raw[len(MAGIC) + 8:len(MAGIC) + 8 + REC.unpack_from(raw, len(MAGIC))[0]])
    meta["state_id"] = "A" * 100
    m = json.dumps(meta, sort_keys=True).encode()
    raw[:HEADER_SIZE] = (MAGIC + REC.pack(len(m), zlib.crc32(m)) + m).ljust(HEADER_SIZE, b"\0")
    path.write_bytes(bytes(raw))
    assert segment_state_id(path) == (False, None)
    with pytest.raises(ValueError, match="no state dir identity"):
        SegmentReader(path)
