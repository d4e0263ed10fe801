"""The next journal file made ahead of time (engine/journal.py, segments.SPARE): starting a segment on the event loop,
at a periodic checkpoint or when the open one is full, waits for no disk (no ``fsync``, no ``posix_fallocate`` on the
loop's thread); the new segment is flushed by the checkpoint's worker thread before the checkpoint is written, and a
crash at any point of it loses no acknowledged tick and leaves no file behind once the state dir is recovered.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import T0, ConfigFactory, tick
from test_journal import assert_same_pool, crash, feed

from cerebellar_norse.config import Config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.engine.segments import JOURNAL_DIR, SPARE, list_segments

pytestmark = pytest.mark.asyncio


@pytest.fixture
def cfg(engine_config: ConfigFactory, tmp_path: Path) -> Config:
    return engine_config(state_dir=tmp_path / "state", journal_segment_size="1MB", batch_size=4, max_markets=16)


@pytest.fixture
def opened() -> Iterator[list[Durability]]:
    ds: list[Durability] = []
    yield ds
    for d in ds:
        crash(d)


def recovered(cfg: Config, opened: list[Durability]) -> tuple[Engine, Durability]:
    e = Engine(cfg)
    d = Durability(e)
    opened.append(d)
    d.recover()
    return e, d


def on_the_loop(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The disk waits (fsync, fdatasync, posix_fallocate) made from this thread (the event loop's) from now on."""
    loop_thread = threading.get_ident()
    seen: list[str] = []

    def watching(name: str) -> Callable[..., Any]:
        real = getattr(os, name)

        def call(*a: Any, **k: Any) -> Any:
            if threading.get_ident() == loop_thread:
                seen.append(name)
            return real(*a, **k)
        return call

    for name in ("fsync", "fdatasync", "posix_fallocate"):
        monkeypatch.setattr(os, name, watching(name))
    return seen


async def test_a_periodic_checkpoint_starts_its_journal_file_without_waiting_for_the_disk_on_the_loop(
        cfg: Config, opened: list[Durability], monkeypatch: pytest.MonkeyPatch) -> None:
    e, d = recovered(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(5) for m in "AB"])
    assert await d.checkpoint()  # the first one also makes the next file, in its worker thread
    spare = Path(cfg.paths.state_dir) / JOURNAL_DIR / SPARE
    assert spare.is_file()
    waits = on_the_loop(monkeypatch)
    await feed([e, twin], [tick(m, T0 + 10 + k) for k in range(5) for m in "ABC"])
    assert await d.checkpoint()
    assert waits == [], "the event loop waited for the disk to start the journal file"
    assert not d._unsynced  # flushed by the worker thread before the checkpoint was written
    monkeypatch.undo()
    assert spare.is_file()  # made again for the next one
    await feed([e, twin], [tick(m, T0 + 20 + k) for k in range(3) for m in "AC"])
    crash(d)
    assert spare.is_file()
    e2, _d2 = recovered(cfg, opened)
    assert_same_pool(e2, twin)
    assert not spare.exists() and not list(Path(cfg.paths.state_dir).rglob("*.tmp"))


async def test_a_full_journal_file_is_followed_by_the_one_made_ahead_without_a_disk_wait_on_the_loop(
        cfg: Config, opened: list[Durability], monkeypatch: pytest.MonkeyPatch) -> None:
    e, d = recovered(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(4) for m in "AB"])
    assert await d.checkpoint()
    await feed([e, twin], [tick("B", T0 + 50)])
    waits = on_the_loop(monkeypatch)
    full = d._segments[-1][1]
    d._soft = d._pos  # the open segment reached its size target: the next append starts the next file
    for eng in (e, twin):
        await eng.submit(tick("A", T0 + 100))
    assert d._segments[-1][1] != full and d.stalled is None
    assert waits == [], "the event loop waited for the disk to start the journal file"
    assert len(d._unsynced) == 1  # the checkpoint it woke flushes it
    await feed([e, twin], [tick(m, T0 + 200 + k) for k in range(3) for m in "AB"])
    crash(d)  # before that checkpoint: the file is in the page cache, as after a kill -9
    e2, _d2 = recovered(cfg, opened)
    assert_same_pool(e2, twin)
    assert len(list_segments(Path(cfg.paths.state_dir) / JOURNAL_DIR)) == 1


async def test_with_journal_fsync_a_journal_file_made_ahead_is_flushed_before_its_first_record(
        engine_config: ConfigFactory, tmp_path: Path, opened: list[Durability]) -> None:
    cfg = engine_config(state_dir=tmp_path / "state", journal_segment_size="1MB", batch_size=4, max_markets=16,
                        journal_fsync=True)
    e, d = recovered(cfg, opened)
    await feed([e], [tick(m, T0 + k) for k in range(4) for m in "AB"])
    assert await d.checkpoint()
    await e.submit(tick("B", T0 + 50))
    full = d._segments[-1][1]
    d._soft = d._pos
    await e.submit(tick("A", T0 + 100))
    assert d._segments[-1][1] != full
    assert not d._unsynced  # acknowledged only once its file's header and name are on the disk


async def test_shutdown_removes_the_journal_file_made_ahead(cfg: Config, opened: list[Durability]) -> None:
    e, d = recovered(cfg, opened)
    await feed([e], [tick(m, T0 + k) for k in range(4) for m in "AB"])
    assert await d.checkpoint()
    spare = Path(cfg.paths.state_dir) / JOURNAL_DIR / SPARE
    assert spare.is_file()
    d.close(save=True)
    assert not spare.exists() and list_segments(spare.parent) == []


async def test_a_checkpoint_the_disk_does_not_answer_is_said_at_warning_and_ticks_go_on(
        cfg: Config, opened: list[Durability], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A flush of the checkpoint's worker thread that does not return (a hung network mount, a failing disk): the
    checkpoint showed nowhere below DEBUG while the journal grew. It is said at WARNING once it has taken
    SLOW_CHECKPOINT_S, ticks are served meanwhile, and one INFO line says when it ends."""
    from cerebellar_norse.engine import journal

    monkeypatch.setattr(journal, "SLOW_CHECKPOINT_S", 0.3, raising=False)
    e, d = recovered(cfg, opened)
    await feed([e], [tick(m, T0 + k) for k in range(5) for m in "AB"])
    loop_thread = threading.get_ident()
    answering = threading.Event()
    real_fsync = os.fsync

    def hung_fsync(fd: int) -> None:
        if threading.get_ident() != loop_thread:
            assert answering.wait(30), "the test never let the disk answer"
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", hung_fsync)
    with caplog.at_level(logging.INFO, logger="cerebellar_norse.journal"):
        pending = asyncio.ensure_future(d.checkpoint())
        await asyncio.sleep(0.8)
        assert not pending.done()
        slow = [r for r in caplog.records if "still not written" in r.getMessage()]
        assert len(slow) == 1 and slow[0].levelno == logging.WARNING, [r.getMessage() for r in caplog.records]
        assert str(Path(cfg.paths.state_dir) / "market_state.bin") in slow[0].getMessage()
        await feed([e], [tick(m, T0 + 10 + k) for k in range(5) for m in "AB"])  # served while the disk hangs
        answering.set()
        assert await asyncio.wait_for(pending, 30)
    ended = [r for r in caplog.records if "slow checkpoint" in r.getMessage() and "ended after" in r.getMessage()]
    assert len(ended) == 1 and ended[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]
    assert len([r for r in caplog.records if "still not written" in r.getMessage()]) == 1
