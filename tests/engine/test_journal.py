"""The tick journal and checkpoints (engine/journal.py, engine/segments.py): a crash loses no acknowledged tick.

A "crash" here abandons a running engine without any shutdown step (its journal is
left as the process would leave it: mapped pages in the page cache, no final
checkpoint); a new engine then recovers from the state dir, and every market's state
must equal, bit for bit, that of an engine that never stopped and was fed the same
ticks. The real kill -9 of a service process is in tests/ops/test_faults_durability.py.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from engine_helpers import T0, ConfigFactory, StreamFactory, assert_same_state, crash, tick

from cerebellar_norse.config import Config
from cerebellar_norse.engine import pool as pool_mod
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.handover import export_market, import_market
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.engine.persistence import STATE_FILE
from cerebellar_norse.engine.segments import (
    HEADER_SIZE,
    JOURNAL_DIR,
    KIND_TICKS,
    MAGIC,
    ONE,
    REC,
    SPARE,
    SegmentReader,
    list_segments,
)
from cerebellar_norse.errors import JournalWaitError, StorageError
from cerebellar_norse.neurons.encoder import S_N_TICKS
from cerebellar_norse.neurons.topology import Weights, generate_weights
from cerebellar_norse.ticks import Tick

if TYPE_CHECKING:
    from cerebellar_norse.training.checkpoints import ModelStore

pytestmark = pytest.mark.asyncio


def states(engine: Engine) -> dict[str, dict[str, np.ndarray]]:
    return {m: engine.arrays.read_slot(s) for m, s in engine.pool.table.items()}


def assert_same_pool(got: Engine, want: Engine) -> None:
    """Same markets in the same least-recently-used order, each state bit for bit equal."""
    assert got.pool.table.markets() == want.pool.table.markets()
    w = states(want)
    for m, st in states(got).items():
        assert_same_state(st, w[m])


def interleaved(by_market: dict[str, list[Tick]]) -> list[Tick]:
    return sorted((t for ts in by_market.values() for t in ts), key=lambda t: (t.timestamp, t.market_id))


async def feed(engines: list[Engine], ticks: list[Tick], chunk: int = 37) -> None:
    """The same ticks to every engine: single submits and batches of ``chunk`` alternating."""
    k = 0
    while k < len(ticks):
        part = ticks[k:k + chunk]
        for e in engines:
            if len(part) % 2:
                for t in part:
                    await e.submit(t)
            else:
                await e.submit_many(part)
        k += chunk


def start(cfg: Config, opened: list[Durability], **kw: object) -> tuple[Engine, Durability]:
    e = Engine(cfg, **kw)  # type: ignore[arg-type]
    d = Durability(e)
    opened.append(d)
    d.recover()
    return e, d


async def test_crash_then_recovery_equals_a_never_stopped_engine(journaled: tuple[Config, list[Durability]], streams: StreamFactory) -> None:
    cfg, opened = journaled
    ticks = interleaved(streams(900, 10, seed=3))
    first, d = start(cfg, opened)
    first.warm_up()  # scratch ticks: not journaled
    twin = Engine(cfg)
    await feed([first, twin], ticks[:300])
    assert await d.checkpoint()  # a checkpoint in the middle: replay starts after it
    await feed([first, twin], ticks[300:600])
    for e in (first, twin):  # slot releases replay cannot reproduce: a reset, idle eviction
        assert e.reset_market(ticks[0].market_id)
        e.cfg = e.cfg.model_copy(update={"performance": e.cfg.performance.model_copy(update={"garbage_collection_threshold": 0.5})})
        assert e.collect_idle(time.monotonic() + 10_000) == 1  # above 8 of 16 slots: one idle market goes
    await feed([first, twin], ticks[600:])
    assert d.seq > 0
    crash(d)

    second, _d2 = start(cfg, opened)
    assert_same_pool(second, twin)
    assert second.stats.ticks == 0  # replayed ticks are not counted as served
    # both go on identically
    more = [tick(m, T0 + 10_000_000 + k) for k in range(3) for m in twin.pool.table.markets()]
    await feed([second, twin], more)
    assert_same_pool(second, twin)


async def test_recovery_after_recovery_and_graceful_stop(journaled: tuple[Config, list[Durability]], streams: StreamFactory) -> None:
    cfg, opened = journaled
    ticks = interleaved(streams(300, 4, seed=5))
    twin = Engine(cfg)
    e, d = start(cfg, opened)
    await feed([e, twin], ticks[:100])
    crash(d)
    e, d = start(cfg, opened)  # recovers, checkpoints, journals on
    await feed([e, twin], ticks[100:200])
    crash(d)
    e, d = start(cfg, opened)
    await feed([e, twin], ticks[200:])
    await e.drain(save=True)  # graceful: final checkpoint, journal removed
    state_dir = cfg.paths.state_dir
    assert list_segments(Path(state_dir) / JOURNAL_DIR) == []
    e, d = start(cfg, opened)
    assert_same_pool(e, twin)


async def test_segments_roll_over_and_checkpoints_remove_what_they_cover(engine_config: ConfigFactory, tmp_path: Path,
                                                                         streams: StreamFactory) -> None:
    cfg = engine_config(state_dir=tmp_path / "state", journal_segment_size="1MB", batch_size=64)
    ticks = interleaved(streams(40_000, 8, seed=1))
    opened: list[Durability] = []
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    for k in range(0, 38_016, 64):
        for x in (e, twin):
            await x.submit_many(ticks[k:k + 64])
    jdir = tmp_path / "state" / JOURNAL_DIR
    assert len(list_segments(jdir)) >= 2  # 38k ticks of 29 bytes (+ 17 per record) do not fit one MB
    assert await d.checkpoint()
    assert [p for _, p in list_segments(jdir)] == [d._segments[-1][1]]  # only the open, empty one is left
    for k in range(38_016, 39_000, 64):
        for x in (e, twin):
            await x.submit_many(ticks[k:min(k + 64, 39_000)])
    crash(d)
    e2, d2 = start(cfg, opened)
    assert_same_pool(e2, twin)
    crash(d2)


@pytest.mark.parametrize("written", ["body only", "header and half the body", "all but the last byte"])
async def test_a_crash_mid_append_drops_only_that_record(journaled: tuple[Config, list[Durability]],
                                                         caplog: pytest.LogCaptureFixture, written: str) -> None:
    """A kill in the middle of the last record's copy: it was never acknowledged; it is dropped, nothing else."""
    cfg, opened = journaled
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick("A", T0 + k) for k in range(5)])
    assert d._mm is not None
    pos, seq = d._pos, d.seq
    body = ONE.pack(seq + 1, KIND_TICKS, 1, 101.0, 5.0, T0 + 99, 1) + b"A"
    record = REC.pack(len(body), zlib.crc32(body)) + body
    part = {"body only": (8, len(record)), "header and half the body": (0, 8 + len(body) // 2),
            "all but the last byte": (0, len(record) - 1)}[written]
    d._mm[pos + part[0]:pos + part[1]] = record[part[0]:part[1]]
    crash(d)
    with caplog.at_level(logging.WARNING):
        e2, _ = start(cfg, opened)
    assert_same_pool(e2, twin)
    assert "unfinished last record" in caplog.text
    assert not list((Path(cfg.paths.state_dir) / JOURNAL_DIR).glob("*.corrupt-*"))


async def test_a_damaged_record_applies_the_records_before_it_and_quarantines_the_file(
        journaled: tuple[Config, list[Durability]], caplog: pytest.LogCaptureFixture) -> None:
    cfg, opened = journaled
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick("A", T0 + k) for k in range(4)], chunk=1)
    third_record = d._pos
    await feed([e], [tick("A", T0 + 10 + k) for k in range(3)], chunk=1)
    (_, path), = list_segments(Path(cfg.paths.state_dir) / JOURNAL_DIR)
    crash(d)
    raw = bytearray(path.read_bytes())
    raw[third_record + 20] ^= 0x40  # a flipped bit in the 5th record's body: it and all after are unusable
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.ERROR):
        e2, _ = start(cfg, opened)
    assert_same_pool(e2, twin)  # the 4 records before the damage, nothing after
    (moved,) = path.parent.glob(f"{path.name}.corrupt-*")
    assert moved.read_bytes() == bytes(raw)  # kept as found
    assert "checksum mismatch" in caplog.text and str(moved) in caplog.text


@pytest.mark.parametrize(("price", "at", "market", "named"), [
    (float("nan"), 99, b"A", "ticks.0.price: must be finite, got nan"),
    (-1.0, 99, b"A", "ticks.0.price: must be > 0, got -1.0"),
    (101.0, 99, b"", "ticks.0.market_id: must be 1 to 64 characters, got 0"),
    (101.0, -T0 - 5, b"A", "ticks.0.timestamp: -5 is not ms since the epoch before 2100"),
    (101.0, 1, b"A", f"ticks.0.timestamp: tick at {T0 + 1} is older than the market's last tick at {T0 + 4}"),
])
async def test_a_record_whose_checksum_holds_but_no_service_wrote_is_damage(
        journaled: tuple[Config, list[Durability]], caplog: pytest.LogCaptureFixture,
        price: float, at: int, market: bytes, named: str) -> None:
    """Such a record (a tick no request can carry, or one older than its market's last) was replayed: a NaN price
    made the market's state NaN, a time before 1970 or an older tick set its clock back, an empty id made a market no
    tick can name; the start-up checkpoint then saved that state, and the next start refused it with every market."""
    cfg, opened = journaled
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick("A", T0 + k) for k in range(5)])
    assert d._mm is not None
    body = ONE.pack(d.seq + 1, KIND_TICKS, 1, price, 5.0, T0 + at, len(market)) + market
    d._mm[d._pos:d._pos + REC.size + len(body)] = REC.pack(len(body), zlib.crc32(body)) + body
    (_, path), = list_segments(Path(cfg.paths.state_dir) / JOURNAL_DIR)
    crash(d)
    with caplog.at_level(logging.ERROR):
        e2, _ = start(cfg, opened)
    assert_same_pool(e2, twin)  # the records before it, not it
    (moved,) = path.parent.glob(f"{path.name}.corrupt-*")
    assert named in caplog.text and "which no service journals" in caplog.text and str(moved) in caplog.text


async def test_corrupt_checkpoint_is_quarantined_with_the_journal_that_continues_it(
        journaled: tuple[Config, list[Durability]], caplog: pytest.LogCaptureFixture) -> None:
    cfg, opened = journaled
    e, d = start(cfg, opened)
    await feed([e], [tick(f"M{k}", T0) for k in range(3)])
    assert await d.checkpoint()
    await feed([e], [tick("M0", T0 + 5)])
    crash(d)
    state_dir = Path(cfg.paths.state_dir)
    ckpt = state_dir / STATE_FILE
    ckpt.write_bytes(ckpt.read_bytes()[:-10])
    with caplog.at_level(logging.ERROR):
        e2, _ = start(cfg, opened)
    assert e2.pool.used == 0  # nothing it could trust
    assert len(list(state_dir.glob(f"{STATE_FILE}.corrupt-*"))) == 1
    assert len(list((state_dir / JOURNAL_DIR).glob("*.journal.corrupt-*"))) == 1
    assert "checkpoint it continues is missing or unusable" in caplog.text


async def fed_with_another_model(cfg: Config, opened: list[Durability]) -> tuple[Weights, Engine, Durability, Engine]:
    """A second model's weights, a journaling engine and its twin without a journal, both after 5 ticks of A and B."""
    w2 = generate_weights(cfg)
    w2.w_out = w2.w_out[::-1].copy()
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(5) for m in "AB"])
    return w2, e, d, twin


async def test_model_swap_checkpoints_so_replay_never_mixes_models(journaled: tuple[Config, list[Durability]]) -> None:
    cfg, opened = journaled
    w2, e, d, twin = await fed_with_another_model(cfg, opened)
    for x in (e, twin):
        x.set_weights(w2.copy(), "v2")
    await feed([e, twin], [tick(m, T0 + 100 + k) for k in range(5) for m in "AB"])
    crash(d)
    e2, _ = start(cfg, opened, weights=w2.copy(), model_version="v2")
    assert_same_pool(e2, twin)


def disk_full(*_a: object) -> None:
    """``os.posix_fallocate`` on a full disk."""
    raise OSError(errno.ENOSPC, "No space left on device")


def checkpoint_disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills up after a checkpoint started its journal file, while it writes ``market_state.bin``."""
    from cerebellar_norse.engine import journal as journal_mod

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "market_state.bin")

    monkeypatch.setattr(journal_mod, "write_snapshot", full)


async def exported_market(cfg: Config, market: str) -> bytes:
    """The exported state of ``market`` after 30 ticks on an engine of its own."""
    source = Engine(cfg)
    await feed([source], [tick(market, T0 + k) for k in range(30)])
    blob = export_market(source, market)
    assert blob is not None
    return blob


@pytest.mark.parametrize("records", [0, 5])
@pytest.mark.parametrize("reset", [False, True])
async def test_a_swap_whose_checkpoint_finds_no_space_is_refused_for_now_and_the_journal_goes_on(
        journaled: tuple[Config, list[Durability]], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        reset: bool, records: int) -> None:
    """A full disk at the swap's checkpoint, once its journal file (of the new model) was started: the swap is refused
    for now (503 capacity, Retry-After) and undone (model and every market's state), the journal file goes on with the
    model kept, so the ticks acknowledged afterwards survive a crash; the swap succeeds once there is room. (It used to
    stop the service: the journal file started for the swap carried the refused model.)"""


    cfg, opened = journaled
    w2, e, d, twin = await fed_with_another_model(cfg, opened)
    version = e.model_version
    if not records:
        assert await d.checkpoint()  # the open journal file holds no record: the swap's is the same file
    checkpoint_disk_full(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="cerebellar_norse.journal"):
        for _ in range(2):  # a second try is refused the same way: nothing failed for good
            with pytest.raises(JournalWaitError, match=r"errno 28 ENOSPC.*nothing was changed") as refused:
                e.set_weights(w2.copy(), "v2", reset_states=reset)
            assert refused.value.retry_after_s >= 1
    monkeypatch.undo()
    assert d.failed is None and e.snapshot().accepting
    assert e.model_version == version and e.fingerprint()["model_version"] == version
    assert_same_pool(e, twin)
    # (records of the start, before the block, are captured too where another test left INFO on)
    assert [r.levelno for r in caplog.records if r.levelno >= logging.WARNING] == [logging.WARNING] * 2
    assert "no further tick" not in caplog.text
    await feed([e, twin], [tick(m, T0 + 100 + k) for k in range(records + 1) for m in "AB"])  # acknowledged
    crash(d)
    e2, d2 = start(cfg, opened)
    assert_same_pool(e2, twin)
    state_dir = Path(cfg.paths.state_dir)
    assert not list(state_dir.glob("**/*.foreign-*")) and not list(state_dir.glob("**/*.corrupt-*"))
    assert not list(state_dir.glob("**/*.tmp"))
    for x in (e2, twin):  # with room again, the swap goes through
        x.set_weights(w2.copy(), "v2", reset_states=reset)
    await feed([e2, twin], [tick(m, T0 + 200) for m in "AB"])
    crash(d2)
    e3, _ = start(cfg, opened, weights=w2.copy(), model_version="v2")
    assert_same_pool(e3, twin)


@pytest.mark.parametrize("reset", [False, True])
async def test_a_refused_swap_keeps_each_markets_last_use_and_the_pending_learning(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reset: bool) -> None:
    """The undo gave the markets a reset released their LRU order back but stamped each as used at the undo (idle
    eviction then spared a market idle for long), and a new learner dropped the pending predictions and the counts."""
    cfg = engine_config(state_dir=tmp_path / "state", max_markets=3, garbage_collection_threshold=1.0,
                        training={"online_learning": True})
    clock = [0.0]  # the pool's time.monotonic(), s
    monkeypatch.setattr(pool_mod, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    opened: list[Durability] = []
    try:
        e, _ = start(cfg, opened)
        for k, market in enumerate("ABC"):  # A last used at 0 s, B at 100 s, C at 200 s
            clock[0] = 100.0 * k
            for j in range(12):  # more than horizon_ticks (10): some predictions are judged
                await e.submit(tick(market, T0 + 100 * k + j, price=100.0 + j % 3))
        learner = e.learner
        assert learner is not None and learner.judged > 0
        pending = {m: list(q) for m, q in learner.pending.items()}
        judged, table = learner.judged, e.pool.table.bookkeeping()
        clock[0] = 250.0
        checkpoint_disk_full(monkeypatch)
        with pytest.raises(JournalWaitError):
            e.set_weights(generate_weights(cfg), "v2", reset_states=reset)
        assert e.learner is learner and learner.judged == judged
        assert {m: list(q) for m, q in learner.pending.items()} == pending
        assert e.pool.table.bookkeeping() == table  # slots, LRU order, last-use times
        assert e.pool.table.evict_idle(1, 120.0, now=300.0) == ["A", "B"]  # idle 300 s and 200 s; C only 100 s
    finally:
        for d in opened:
            crash(d)


@pytest.mark.parametrize("reset", [False, True])
async def test_a_refused_swap_keeps_the_synapses_online_learning_changed(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reset: bool) -> None:
    """The undo kept the learner and its counts but repacked the model's weights: what it had learned was gone."""
    cfg = engine_config(state_dir=tmp_path / "state", max_markets=3, training={"online_learning": True})
    opened: list[Durability] = []
    try:
        e, _ = start(cfg, opened)
        for j in range(60):
            await e.submit(tick("A", T0 + j, price=100.0 + (j * 7) % 5))
        views = e.backend.learning_views()
        assert e.learner is not None and e.learner.updates > 0 and views is not None
        learned = views.pf_w.copy()
        checkpoint_disk_full(monkeypatch)
        with pytest.raises(JournalWaitError):
            e.set_weights(generate_weights(cfg), "v2", reset_states=reset)
        views = e.backend.learning_views()
        assert views is not None
        np.testing.assert_array_equal(views.pf_w, learned)
    finally:
        for d in opened:
            crash(d)


@pytest.mark.parametrize("after", [0, 5])
async def test_a_model_swap_with_no_tick_since_the_last_checkpoint_survives_a_crash(
        journaled: tuple[Config, list[Durability]], after: int) -> None:
    """The swap's checkpoint is written although the journal did not move: the old one is of the old model."""
    cfg, opened = journaled
    w2, e, d, twin = await fed_with_another_model(cfg, opened)
    assert await d.checkpoint()
    seq = d.seq
    for x in (e, twin):
        x.set_weights(w2.copy(), "v2")
    assert d.seq == seq  # nothing journaled since the checkpoint
    await feed([e, twin], [tick(m, T0 + 100 + k) for k in range(after) for m in "AB"])
    crash(d)
    e2, _ = start(cfg, opened, weights=w2.copy(), model_version="v2")
    assert_same_pool(e2, twin)
    state_dir = Path(cfg.paths.state_dir)
    assert not list(state_dir.glob("**/*.foreign-*")) and not list(state_dir.glob("**/*.corrupt-*"))


@pytest.mark.parametrize("held", [False, True])
async def test_an_import_whose_checkpoint_finds_no_space_is_refused_for_now_and_changes_nothing(
        journaled: tuple[Config, list[Durability]], monkeypatch: pytest.MonkeyPatch, held: bool) -> None:
    """A full disk at the import's checkpoint (its journal file started): the import is refused for now (503 capacity)
    and undone, so neither a save nor a crash keeps a state whose import the caller saw fail; the journal goes on, and
    the import succeeds once there is room."""


    cfg, opened = journaled
    blob = await exported_market(cfg, "X")
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(4) for m in (("A", "X") if held else ("A",))])

    checkpoint_disk_full(monkeypatch)
    for _ in range(2):
        with pytest.raises(JournalWaitError, match=r"errno 28 ENOSPC"):
            import_market(e, "X", blob)
    monkeypatch.undo()
    assert d.failed is None
    assert_same_pool(e, twin)
    await feed([e, twin], [tick("A", T0 + 50)])
    crash(d)
    e2, _ = start(cfg, opened)
    assert_same_pool(e2, twin)
    import_market(e2, "X", blob)
    assert e2.pool.table.get("X") is not None


@pytest.mark.parametrize("before", ["just started", "after a checkpoint"])
async def test_an_import_with_no_tick_since_the_last_checkpoint_survives_a_crash(
        journaled: tuple[Config, list[Durability]], before: str) -> None:
    """Replay cannot rebuild a state that came from another replica: the import's checkpoint must hold it."""
    cfg, opened = journaled
    blob = await exported_market(cfg, "X")
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    if before == "after a checkpoint":
        await feed([e, twin], [tick("A", T0 + k) for k in range(5)])
        assert await d.checkpoint()
    seq = d.seq
    for x in (e, twin):
        import_market(x, "X", blob)
    assert d.seq == seq  # an import appends no record
    await feed([e, twin], [tick(m, T0 + 100 + k) for k in range(3) for m in ("A", "X")])
    crash(d)
    e2, _ = start(cfg, opened)
    assert_same_pool(e2, twin)
    slot = e2.pool.table.get("X")
    assert slot is not None and e2.arrays.read_slot(slot)["enc"][S_N_TICKS] == 33  # 30 imported, 3 replayed


@pytest.mark.parametrize("kept", [0, 2])
async def test_a_segment_truncated_between_records_is_reported_and_moved_aside(
        journaled: tuple[Config, list[Durability]], caplog: pytest.LogCaptureFixture, kept: int) -> None:
    """Cut exactly after a record (or to its header): what is left is applied, the loss is an ERROR, the file kept aside."""
    cfg, opened = journaled
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    acked = [tick("A", T0 + k) for k in range(4)]
    await feed([e, twin], acked[:kept], chunk=1)
    cut = d._pos
    await feed([e], acked[kept:], chunk=1)
    (_, path), = list_segments(Path(cfg.paths.state_dir) / JOURNAL_DIR)
    crash(d)
    size = path.stat().st_size
    os.truncate(path, cut)
    with caplog.at_level(logging.ERROR):
        e2, _ = start(cfg, opened)
    assert_same_pool(e2, twin)  # the records before the cut, nothing after
    (moved,) = path.parent.glob(f"{path.name}.corrupt-*")
    assert moved.stat().st_size == cut
    assert str(path) in caplog.text and str(moved) in caplog.text
    assert f"shorter than the {size} bytes reserved" in caplog.text and f"from record {kept + 1} on" in caplog.text


async def test_a_truncated_segment_of_the_previous_model_is_moved_aside(
        journaled: tuple[Config, list[Durability]], caplog: pytest.LogCaptureFixture) -> None:
    """A crash after a swap's checkpoint, before the old model's journal file was deleted; that file was then cut."""
    cfg, opened = journaled
    w2 = generate_weights(cfg)
    w2.w_out = w2.w_out[::-1].copy()
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick("A", T0 + k) for k in range(4)], chunk=1)
    (_, old), = list_segments(Path(cfg.paths.state_dir) / JOURNAL_DIR)
    cut = HEADER_SIZE + (d._pos - HEADER_SIZE) // 2
    kept = old.read_bytes()[:cut]
    for x in (e, twin):
        x.set_weights(w2.copy(), "v2")
    assert not old.exists()  # covered by the swap's checkpoint
    await feed([e, twin], [tick("A", T0 + 10 + k) for k in range(3)], chunk=1)
    crash(d)
    old.write_bytes(kept)
    with caplog.at_level(logging.ERROR):
        e2, _ = start(cfg, opened, weights=w2.copy(), model_version="v2")
    assert_same_pool(e2, twin)  # the newer journal file still applies: no record is missing before it
    (moved,) = old.parent.glob(f"{old.name}.corrupt-*")
    assert str(moved) in caplog.text and "shorter than the" in caplog.text


async def test_a_segment_whose_header_has_no_size_is_still_replayed(journaled: tuple[Config, list[Durability]]) -> None:
    """Segments written before headers recorded their size are read as before (their length is not checked)."""
    cfg, opened = journaled
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(4) for m in "AB"])
    (_, path), = list_segments(Path(cfg.paths.state_dir) / JOURNAL_DIR)
    crash(d)
    raw = bytearray(path.read_bytes())
    head = SegmentReader(path)
    meta = json.dumps({"base_seq": head.base, "fingerprint": head.fingerprint}, sort_keys=True).encode()
    old = MAGIC + REC.pack(len(meta), zlib.crc32(meta)) + meta
    raw[:HEADER_SIZE] = old.ljust(HEADER_SIZE, b"\0")
    path.write_bytes(bytes(raw[:len(raw.rstrip(b"\0"))]))  # and shorter than it was reserved
    assert SegmentReader(path).size is None
    e2, _ = start(cfg, opened)
    assert_same_pool(e2, twin)
    assert not list(path.parent.glob("*.corrupt-*"))


async def test_warm_up_ticks_are_not_journaled(journaled: tuple[Config, list[Durability]]) -> None:
    cfg, opened = journaled
    e, d = start(cfg, opened)
    e.warm_up()
    assert d.seq == 0 and d._pos == HEADER_SIZE
    await e.submit(tick("A", T0))
    assert d.seq == 1
    crash(d)
    (_, path), = list_segments(Path(cfg.paths.state_dir) / JOURNAL_DIR)
    recs = list(SegmentReader(path).records())
    assert [(r.seq, [t.market_id for t in r.ticks], r.markets) for r in recs] == [(1, ["A"], [])]


async def test_a_journal_that_cannot_grow_stops_acknowledging(engine_config: ConfigFactory, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Disk full when a new segment is needed: the batch fails, on_fatal is told once, nothing more is acknowledged."""
    cfg = engine_config(state_dir=tmp_path / "state", journal_segment_size="1MB", batch_size=256)
    e = Engine(cfg)
    fatal: list[StorageError] = []
    d = Durability(e, on_fatal=fatal.append)
    d.recover()
    twin = Engine(cfg)
    acked = [tick("A", T0 + k) for k in range(10)]
    await feed([e, twin], acked, chunk=1)

    monkeypatch.setattr(os, "posix_fallocate", disk_full)
    d._size = d._soft = d._pos + 40  # the open segment is full: the next append needs a new one
    with caplog.at_level(logging.ERROR), pytest.raises(StorageError, match=r"errno 28 ENOSPC"):
        await e.submit(tick("A", T0 + 100))
    with pytest.raises(StorageError):
        await e.submit(tick("A", T0 + 101))
    assert len(fatal) == 1 and "cannot create journal file" in str(fatal[0]) and fatal[0].errno == errno.ENOSPC
    assert caplog.text.count("no further tick is acknowledged") == 1
    assert "Traceback" not in caplog.text
    monkeypatch.undo()
    crash(d)
    e2 = Engine(cfg)
    d2 = Durability(e2)
    d2.recover()
    assert_same_pool(e2, twin)  # every acknowledged tick, none of the failed ones
    crash(d2)


async def test_ticks_refused_after_a_failed_journal_write_are_never_kept(engine_config: ConfigFactory, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Disk full when a new segment is needed, then the service's own shutdown (drain with save, as after on_fatal):
    the ticks answered with an error (the failing step, ticks queued behind it, later submissions) are in no state
    saved or restored, and the journal is kept; the restart equals an engine that got the acknowledged ticks only."""
    cfg = engine_config(state_dir=tmp_path / "state", journal_segment_size="1MB", batch_size=4)
    e = Engine(cfg)
    d = Durability(e, on_fatal=lambda exc: None)
    d.recover()
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(6) for m in "AB"])

    monkeypatch.setattr(os, "posix_fallocate", disk_full)
    d._size = d._soft = d._pos + 40  # the open segment is full: the next append needs a new one
    with pytest.raises(StorageError, match=r"errno 28 ENOSPC"):  # 3 steps of 4: the first fails, two were queued behind
        await e.submit_many([tick(m, T0 + 100 + k) for k in range(6) for m in "AB"])
    with pytest.raises(StorageError, match=r"errno 28 ENOSPC") as later:
        await e.submit(tick("C", T0 + 200))  # a later submission: refused, never stepped
    assert later.value is not d.failed and later.value.reported  # a new error each time (no traceback that grows)
    assert e.pool.table.get("C") is None
    assert e.pool.last_timestamp("A") < T0 + 102  # only the failing step itself was applied
    assert e.snapshot().accepting is False  # /health says so beside its 503 reason
    assert d.failed is not None and d.failed.reported  # logged once when it failed, not again per refused request
    await e.drain(save=True)  # what the service does once on_fatal has stopped it
    monkeypatch.undo()
    assert list_segments(Path(cfg.paths.state_dir) / JOURNAL_DIR)  # the journal is kept
    e2 = Engine(cfg)
    d2 = Durability(e2)
    d2.recover()
    assert_same_pool(e2, twin)  # every acknowledged tick, none of the refused ones
    await e2.submit_many([tick(m, T0 + 100 + k) for k in range(6) for m in "AB"])  # the client's retry applies once
    await twin.submit_many([tick(m, T0 + 100 + k) for k in range(6) for m in "AB"])
    assert_same_pool(e2, twin)
    crash(d2)


async def test_replaying_the_evictions_the_service_made_itself_is_no_warning(engine_config: ConfigFactory, tmp_path: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """More markets than slots while serving: the replay after a kill -9 evicts exactly as the service did, loses
    nothing, and must not tell the operator to raise max_markets and restore a backup (that WARNING is for a pool
    made smaller while the service was stopped)."""
    cfg = engine_config(state_dir=tmp_path / "state", max_markets=2)
    opened: list[Durability] = []
    try:
        e, d = start(cfg, opened)
        twin = Engine(cfg)
        await feed([e, twin], [tick(m, T0 + k) for k in range(4) for m in "XYZ"], chunk=1)
        assert e.pool.table.evictions > 0
        crash(d)
        with caplog.at_level(logging.INFO):
            e2, _ = start(cfg, opened)
        assert_same_pool(e2, twin)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        assert "as the service did when it served those ticks" in caplog.text
    finally:
        for d in opened:
            crash(d)


async def test_a_market_evicted_while_serving_that_took_older_ticks_replays_into_a_larger_pool(
        engine_config: ConfigFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A market evicted to make room starts from rest and may take ticks older than its last one; replayed into a pool
    that still holds it (performance.max_markets raised while stopped, as the eviction warning advises), that batch is
    no damage: every record is applied, nothing is moved aside."""
    small = engine_config(state_dir=tmp_path / "state", max_markets=2)
    opened: list[Durability] = []
    try:
        e, d = start(small, opened)
        await feed([e], [tick("A", T0 + 100), tick("B", T0 + 100), tick("C", T0 + 100)], chunk=1)  # C evicts A
        await feed([e], [tick("A", T0 + 50), tick("A", T0 + 60)], chunk=1)  # A from rest: older ticks are accepted
        assert e.pool.table.evictions >= 1 and e.pool.last_timestamp("A") == T0 + 60
        crash(d)
        large = engine_config(state_dir=tmp_path / "state", max_markets=8)
        with caplog.at_level(logging.WARNING):
            e2, _ = start(large, opened)
        journal = Path(large.paths.state_dir) / JOURNAL_DIR
        assert not list(journal.glob("*.corrupt-*")), caplog.text
        assert "which no service journals" not in caplog.text
        assert e2.pool.last_timestamp("A") == T0 + 60 and e2.pool.last_timestamp("C") == T0 + 100
        a = e2.arrays.read_slot(e2.pool.table.get("A"))
        assert a["enc"][S_N_TICKS] == 2  # from rest at the older ticks, as served
    finally:
        for d in opened:
            crash(d)


async def test_a_failed_final_save_keeps_the_previous_checkpoint_and_the_journal(
        journaled: tuple[Config, list[Durability]], monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, opened = journaled
    e, _d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(6) for m in "AB"])
    ckpt = Path(cfg.paths.state_dir) / STATE_FILE
    before = ckpt.read_bytes()

    def fail(*_a: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(StorageError, match=rf"cannot save market state {ckpt}: Read-only file system \(errno 30 EROFS\)"):
        await e.drain(save=True)
    monkeypatch.undo()
    assert ckpt.read_bytes() == before
    assert [p.name for p in ckpt.parent.iterdir() if p.name.endswith(".tmp")] == []
    e2, _ = start(cfg, opened)
    assert_same_pool(e2, twin)


async def test_one_service_per_state_dir(journaled: tuple[Config, list[Durability]]) -> None:
    cfg, opened = journaled
    start(cfg, opened)
    with pytest.raises(StorageError, match=rf"in use by another cerebellar-norse process \(pid {os.getpid()}\)"):
        Durability(Engine(cfg)).recover()


async def test_deleting_or_replacing_the_pid_file_does_not_free_the_state_dir(tmp_path: Path) -> None:
    from cerebellar_norse.engine.state_dir import StateDirLock

    held = StateDirLock(tmp_path).acquire()
    try:
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
        (tmp_path / ".lock").unlink()
        with pytest.raises(StorageError, match=r"in use by another cerebellar-norse process \(pid \?\)"):
            StateDirLock(tmp_path).acquire()
        (tmp_path / ".lock").write_text("999999\n")  # a stale file of another process
        with pytest.raises(StorageError, match=r"\(pid 999999\)"):
            StateDirLock(tmp_path).acquire()
    finally:
        held.release()
    again = StateDirLock(tmp_path).acquire()  # released: free again, and the pid file names the new holder
    assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
    again.release()


async def test_a_directory_where_the_next_journal_file_goes_is_moved_aside_and_named_by_verify_data(
        journaled: tuple[Config, list[Durability]], capsys: pytest.CaptureFixture[str]) -> None:
    """A directory as ``journal/.next.journal.spare`` (the file made ahead of time, removed at start) stopped every start
    (`cannot use …: Is a directory`) while --verify-data said OK."""
    from cerebellar_norse.training.commands import cmd_verify_data

    cfg, opened = journaled
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick("A", T0 + k) for k in range(5)])
    crash(d)
    spare = Path(cfg.paths.state_dir) / JOURNAL_DIR / SPARE
    if spare.exists():
        spare.unlink()
    spare.mkdir()
    (spare / "kept").write_text("x")
    assert cmd_verify_data(cfg.paths.state_dir) == 1
    assert f"{spare}: a directory, not a journal file: the service moves it aside at start" in capsys.readouterr().err
    e2, _ = start(cfg, opened)
    assert_same_pool(e2, twin)  # every acknowledged tick
    (moved,) = spare.parent.glob(f"{SPARE}.misplaced-*")
    assert (moved / "kept").read_text() == "x"


async def test_a_reset_after_a_failed_journal_write_is_refused_and_changes_nothing(
        journaled: tuple[Config, list[Durability]]) -> None:
    """Once the journal cannot be written, a reset could not be made durable: refused, the market keeps its state."""
    cfg, opened = journaled
    e, d = start(cfg, opened)
    await feed([e], [tick("A", T0 + k) for k in range(3)])
    d._fail(StorageError("cannot write journal file x: No space left on device (errno 28 ENOSPC)", "x", 28))
    with pytest.raises(StorageError, match="No space left on device"):
        e.reset_market("A")
    assert e.pool.table.get("A") is not None and e.pool.last_timestamp("A") == T0 + 2


@pytest.mark.parametrize("how", ["crash", "graceful"])
async def test_a_model_activated_while_stopped_keeps_every_market(journaled: tuple[Config, list[Durability]],
                                                                   how: str) -> None:
    """States saved with model v1, a start serving v2: restored and replayed with v1, then v2 swapped in, as live."""
    cfg, opened = journaled
    w2, e, d, twin = await fed_with_another_model(cfg, opened)
    await feed([e, twin], [tick(m, T0 + 50 + k) for k in range(3) for m in "AB"])
    if how == "crash":
        crash(d)
    else:
        await e.drain()
    twin.set_weights(w2.copy(), "v2")  # what a live swap would have made of the states
    v1 = e.weights
    e2 = Engine(cfg, weights=w2.copy(), model_version="v2")
    e2.model_for = lambda version: v1 if version == e.model_version else None
    d2 = Durability(e2)
    opened.append(d2)
    d2.recover()
    e2.finish_restore(reset_states=False)
    assert e2.model_version == "v2" and e2.swap_after_restore is None
    assert_same_pool(e2, twin)
    await feed([e2, twin], [tick(m, T0 + 100 + k) for k in range(3) for m in "AB"])
    assert_same_pool(e2, twin)
    crash(d2)
    e3, _ = start(cfg, opened, weights=w2.copy(), model_version="v2")  # the swap was checkpointed: v1 is not needed
    assert_same_pool(e3, twin)


async def test_states_of_a_model_no_longer_stored_are_moved_aside(journaled: tuple[Config, list[Durability]]) -> None:
    cfg, opened = journaled
    w2, e, _, _ = await fed_with_another_model(cfg, opened)
    await e.drain()
    e2 = Engine(cfg, weights=w2.copy(), model_version="v2")
    e2.model_for = lambda version: None
    d2 = Durability(e2)
    opened.append(d2)
    d2.recover()
    e2.finish_restore(reset_states=False)
    assert e2.model_version == "v2" and e2.pool.used == 0
    assert len(list(Path(cfg.paths.state_dir).glob(f"{STATE_FILE}.foreign-*"))) == 1
    assert e2.restore_problem is not None  # /health says so (degraded), in words that name the model
    assert e2.restore_problem.startswith(f"market state was saved with model {e.model_version}, which is not stored")


async def test_fsync_mode_journals_the_same(engine_config: ConfigFactory, tmp_path: Path) -> None:
    cfg = engine_config(state_dir=tmp_path / "state", journal_fsync=True)
    opened: list[Durability] = []
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(4) for m in "ABC"])
    crash(d)
    e2, d2 = start(cfg, opened)
    assert_same_pool(e2, twin)
    crash(d2)


async def test_a_restart_under_another_model_moves_state_and_journal_aside(journaled: tuple[Config, list[Durability]],
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """E.g. the active model is unusable and another one is served: nothing of the old model is replayed or lost."""
    cfg, opened = journaled
    e, d = start(cfg, opened)
    await feed([e], [tick("A", T0 + k) for k in range(3)])
    crash(d)
    state_dir = Path(cfg.paths.state_dir)
    (state_dir / f".{STATE_FILE}.abc123.tmp").write_bytes(b"half a checkpoint")  # a write the crash cut short
    with caplog.at_level(logging.ERROR):
        e2, _ = start(cfg, opened, model_version="another")
    assert e2.pool.used == 0
    assert len(list(state_dir.glob(f"{STATE_FILE}.foreign-*"))) == 1
    assert len(list((state_dir / JOURNAL_DIR).glob("*.journal.foreign-*"))) == 1
    assert not list(state_dir.glob("*.tmp"))
    assert "written for another network or model" in caplog.text


async def test_states_of_the_untrained_seed_network_survive_a_model_activated_while_stopped(
        journaled: tuple[Config, list[Durability]]) -> None:
    """A service that served the untrained network (``seed-N``, never stored in models/), then a model trained and
    activated while it was stopped (``train --activate``): the states are restored with the seed's network, then the
    model is swapped in; not moved aside as foreign with the advice to restore ``models/seed-N``, which cannot exist."""
    from cerebellar_norse.api.server import stored_weights
    from cerebellar_norse.training.checkpoints import ModelStore

    cfg, opened = journaled
    w2, e, _, twin = await fed_with_another_model(cfg, opened)
    assert e.model_version == f"seed-{cfg.neural.seed}"
    await e.drain()
    twin.set_weights(w2.copy(), "v2")
    e2 = Engine(cfg, weights=w2.copy(), model_version="v2")
    e2.model_for = stored_weights(cfg, ModelStore(Path(cfg.paths.state_dir)))
    d2 = Durability(e2)
    opened.append(d2)
    d2.recover()
    e2.finish_restore(reset_states=False)
    assert e2.restore_problem is None
    assert not list(Path(cfg.paths.state_dir).glob(f"{STATE_FILE}.foreign-*"))
    assert e2.model_version == "v2" and e2.pool.used == 2
    assert_same_pool(e2, twin)
    assert stored_weights(cfg, ModelStore(Path(cfg.paths.state_dir)))("v9") is None  # not stored, not a seed


async def test_verify_data_names_a_damaged_journal_file_and_state_id(journaled: tuple[Config, list[Durability]],
                                                                     streams: StreamFactory,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """At start the service moves a damaged journal file aside (the acknowledged ticks after the damage are lost) and a
    damaged state-id too; --verify-data, the operators' integrity check before a start, said OK (exit 0) for both."""
    from cerebellar_norse.engine.state_dir import STATE_ID_FILE
    from cerebellar_norse.training.checkpoints import verify_tree
    from cerebellar_norse.training.commands import cmd_verify_data

    cfg, opened = journaled
    e, d = start(cfg, opened)
    await feed([e], interleaved(streams(40, 2, seed=5)))
    crash(d)
    root = Path(cfg.paths.state_dir)
    (_, seg), = list_segments(root / JOURNAL_DIR)
    ok, problems = verify_tree(root)
    assert problems == []
    assert f"{root / STATE_ID_FILE}: state dir identity OK" in ok
    assert any(line.startswith(f"{seg}: journal OK (40 records") for line in ok)

    good = seg.read_bytes()
    bad = bytearray(good)
    bad[HEADER_SIZE + 20] ^= 0xFF  # inside the first record, with more records after it
    seg.write_bytes(bytes(bad))
    ok, problems = verify_tree(root)
    (problem,) = problems
    assert problem.startswith(f"{seg}: checksum mismatch in the record at offset {HEADER_SIZE}")
    assert cmd_verify_data(str(root)) == 1
    assert str(seg) in capsys.readouterr().err
    seg.write_bytes(good)

    sid = root / STATE_ID_FILE
    sid.write_bytes(sid.read_bytes().replace(b'"state_id": "', b'"state_id": "0'))
    ok, problems = verify_tree(root)
    (problem,) = problems
    assert problem.startswith(f"{sid}: checksum mismatch")
    assert any(line.startswith(f"{seg}: journal OK") for line in ok)


async def crashed_segment(cfg: Config, opened: list[Durability],
                          streams: StreamFactory) -> tuple[Durability, Path, Path, bytearray]:
    """An engine fed 10 ticks on 2 markets, then killed: its journal, the state dir, its one segment and its bytes."""
    e, d = start(cfg, opened)
    await feed([e], interleaved(streams(10, 2, seed=7)))
    crash(d)
    root = Path(cfg.paths.state_dir)
    (_, seg), = list_segments(root / JOURNAL_DIR)
    return d, root, seg, bytearray(seg.read_bytes())


async def test_verify_data_bounds_a_cut_append_as_the_journals_writer_did(journaled: tuple[Config, list[Durability]],
                                                                          streams: StreamFactory) -> None:
    """Bytes after the journal's end farther than one record of its writer cannot be a cut append: the service
    moves such a file aside at start. --verify-data, which reads no config, bounded the tail by 1 MiB and said
    "journal OK" for the same file; both now take the bound from the segment's header."""
    from cerebellar_norse.engine.segments import parse_header
    from cerebellar_norse.training.checkpoints import verify_tree

    cfg, opened = journaled
    d, root, seg, data = await crashed_segment(cfg, opened, streams)
    writer_bound = int(parse_header(bytes(data))["max_record"])
    assert writer_bound == d.max_record < 1 << 20
    end = len(data.rstrip(b"\x00"))
    assert end + writer_bound + 16 < len(data)
    data[end + writer_bound + 8] = 0x7A  # past any append the writer could have cut short
    seg.write_bytes(bytes(data))
    reader = SegmentReader(seg)  # the default bound (1 MiB), as --verify-data reads it
    assert reader.max_record == writer_bound
    list(reader.records())
    assert reader.damage is not None and "non-zero bytes after the end of the journal" in reader.damage
    _, problems = verify_tree(root)
    assert any(p.startswith(f"{seg}: non-zero bytes after the end of the journal") for p in problems), problems


async def test_verify_data_tells_the_batch_size_a_cut_append_of_an_older_journal_file_needs(
        journaled: tuple[Config, list[Durability]], streams: StreamFactory) -> None:
    """A journal file written before headers recorded their writer's largest record (max_record) is bounded at start
    by the service's own batch_size: bytes after the end past one record of it move the file aside. --verify-data,
    which reads no config, said "journal OK" for such a file; it now names the batch_size the drop needs."""
    from cerebellar_norse.engine.segments import batch_size_for_record, parse_header
    from cerebellar_norse.training.checkpoints import verify_tree

    cfg, opened = journaled
    _, root, seg, data = await crashed_segment(cfg, opened, streams)
    head = parse_header(bytes(data))
    bound = int(head.pop("max_record"))  # as the previous version wrote it
    meta = json.dumps(head, sort_keys=True).encode()
    data[:HEADER_SIZE] = (MAGIC + REC.pack(len(meta), zlib.crc32(meta)) + meta).ljust(HEADER_SIZE, b"\0")
    end = len(data.rstrip(b"\x00"))
    data[end + bound + 8] = 0x7A  # one record of this config's batch_size cannot reach it
    seg.write_bytes(bytes(data))
    need = batch_size_for_record(bound + 9)
    assert need == cfg.performance.batch_size + 1 and batch_size_for_record(bound) == cfg.performance.batch_size
    ok, problems = verify_tree(root)
    assert not problems, problems
    (line,) = [o for o in ok if o.startswith(f"{seg}: journal OK")]
    assert line.endswith(f"an unfinished last record ({bound + 9} bytes) is dropped where performance.batch_size is"
                         f" {need} or more (the file does not record its writer's largest record; with a smaller"
                         " batch_size the service moves it aside at start))"), line
    start(cfg, opened)  # this config's batch_size is smaller: moved aside, as --verify-data said it would be
    assert len(list((root / JOURNAL_DIR).glob(f"{seg.name}.corrupt-*"))) == 1


@pytest.mark.parametrize("damage", ["nan_state", "market_twice", "row_of_another_width"])
async def test_verify_data_reads_the_market_states_as_the_start_does(journaled: tuple[Config, list[Durability]],
                                                                     streams: StreamFactory, damage: str) -> None:
    """A market_state.bin whose checksum holds over states no market can reach (NaN) or a market listed twice is moved
    aside at start, and every market starts from rest; --verify-data checked only its checksum and said "market
    state OK"."""
    import io

    from cerebellar_norse.engine.persistence import load_pool
    from cerebellar_norse.storage import read_checksummed, write_checksummed
    from cerebellar_norse.training.checkpoints import verify_tree

    cfg, opened = journaled
    e, d = start(cfg, opened)
    await feed([e], interleaved(streams(30, 3, seed=9)))
    d.close(save=True)
    root = Path(cfg.paths.state_dir)
    spath = root / STATE_FILE
    ok, problems = verify_tree(root)
    assert problems == [] and f"{spath}: market state OK (3 markets)" in ok
    with np.load(io.BytesIO(read_checksummed(spath)), allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    if damage == "nan_state":
        field = next(k for k in data if data[k].dtype.kind == "f" and data[k].ndim >= 2)
        data[field] = data[field].copy()
        data[field][1].flat[0] = np.nan
        want = "holds non-finite values"
    elif damage == "market_twice":
        data["markets"] = np.array([data["markets"][0]] * len(data["markets"]))
        want = "a market id appears more than once"
    else:  # one value per market where the network holds 3 (the start refuses the shape; verify said OK)
        data["i_out"] = data["i_out"][:, 0].copy()
        want = "field 'i_out' has shape (3,), expected (3, 3)"
    buf = io.BytesIO()
    np.savez(buf, **data)
    write_checksummed(spath, buf.getvalue())
    with pytest.raises(Exception, match=re.escape(want)):  # what the start does with it
        load_pool(Engine(cfg).pool, spath, e.fingerprint())
    ok, problems = verify_tree(root)
    (problem,) = problems
    assert problem.startswith(str(spath)) and want in problem, problem
    assert problem.endswith("the service moves it aside at start and every market starts from rest")
    assert not any(line.startswith(f"{spath}: market state OK") for line in ok)


async def test_what_stands_where_journal_files_go_is_moved_aside_and_named_by_verify_data(
        journaled: tuple[Config, list[Durability]], streams: StreamFactory) -> None:
    """A directory named as a journal file made the start fail once the journal reached its position ("cannot create
    journal file …: Is a directory"), and --verify-data said nothing of it; a file where the journal directory goes
    stopped the start. Both now show in --verify-data, and the start moves them aside and replays the journal."""
    from cerebellar_norse.engine.segments import segment_name
    from cerebellar_norse.training.checkpoints import verify_tree

    cfg, opened = journaled
    ticks = interleaved(streams(40, 3, seed=11))
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], ticks)
    crash(d)
    root = Path(cfg.paths.state_dir)
    jdir = root / JOURNAL_DIR
    (_, seg), = list_segments(jdir)
    blocker = jdir / segment_name(d.seq)  # where the recovered journal's first file is created
    blocker.mkdir()
    stray = root / "recordings" / JOURNAL_DIR
    stray.parent.mkdir()
    stray.write_text("not the service's")  # a file called journal outside a state dir: not reported

    ok, problems = verify_tree(root)
    assert problems == [f"{blocker}: a directory, not a journal file: the service moves it aside at start"]
    assert any(line.startswith(f"{seg}: journal OK") for line in ok)

    second = Engine(cfg)
    d2 = Durability(second)
    opened.append(d2)
    rep = d2.recover()
    (moved,) = rep.quarantined
    assert Path(moved).is_dir() and Path(moved).name.startswith(f"{blocker.name}.misplaced-")
    assert rep.ticks == len(ticks)
    assert_same_pool(second, twin)
    await feed([second, twin], [tick(m, T0 + 10_000_000) for m in twin.pool.table.markets()])
    assert_same_pool(second, twin)
    d2.close(save=True)

    shutil.rmtree(jdir)
    jdir.write_bytes(b"")  # a file where the journal directory goes
    ok, problems = verify_tree(root)
    assert problems == [f"{jdir}: a regular file, not the journal's directory: the service moves it aside at start"]
    third, _d3 = start(cfg, opened)
    assert jdir.is_dir() and len(list_segments(jdir)) == 1
    assert_same_pool(third, twin)
    assert verify_tree(root)[1] == [] and stray.read_text() == "not the service's"


async def saved_with_a_stored_model(cfg: Config, opened: list[Durability]) -> tuple[Path, ModelStore, str]:
    """A model stored under the state dir's models/, served to two markets, their states saved at a graceful stop:
    the state dir, the store and the model's version."""
    from cerebellar_norse.training.checkpoints import ModelStore

    root = Path(cfg.paths.state_dir)
    store = ModelStore(root)
    version = "20240101T000000Z-aaaaaa"
    w = generate_weights(cfg)
    store.save(w, cfg, {"validation": {"loss": 1.0}}, version=version)
    e, d = start(cfg, opened, weights=w.copy(), model_version=version)
    await feed([e], [tick(m, T0 + k) for k in range(5) for m in "AB"])
    d.close(save=True)
    return root, store, version


async def test_verify_data_names_market_state_saved_with_a_model_not_stored(
        journaled: tuple[Config, list[Durability]]) -> None:
    """The start moves aside a market_state.bin saved with a model that is no longer stored (every market from rest,
    /health degraded); --verify-data said "market state OK" for it."""
    from cerebellar_norse.training.checkpoints import verify_tree

    cfg, opened = journaled
    root, store, version = await saved_with_a_stored_model(cfg, opened)
    spath = root / STATE_FILE
    ok, problems = verify_tree(root)
    assert problems == [] and f"{spath}: market state OK (2 markets)" in ok

    shutil.move(store.root / version, root / "elsewhere")
    ok, problems = verify_tree(root)
    assert problems == [f"{spath}: saved with model {version}, which is not stored in {store.root} (or is not usable, "
                        f"above): the service moves it aside at start, every market starts from rest and /health says "
                        f"degraded; restore models/{version} from a backup"]
    assert not any(line.startswith(f"{spath}:") for line in ok)
    e2 = Engine(cfg, weights=generate_weights(cfg), model_version="20240102T000000Z-bbbbbb")
    e2.model_for = lambda v: None  # what the service's store answers for a version it does not hold
    d2 = Durability(e2)
    opened.append(d2)
    d2.recover()  # what the start then does
    assert e2.pool.used == 0 and len(list(root.glob(f"{STATE_FILE}.foreign-*"))) == 1


async def test_market_state_saved_with_a_model_it_may_not_read_refuses_the_start_and_moves_nothing(
        journaled: tuple[Config, list[Durability]], monkeypatch: pytest.MonkeyPatch, unreadable: Callable[[Path, int], None]) -> None:
    """The model the market state was saved with is stored but may not be read (permissions): the restore under it
    refuses the start with the file and the errno, and market_state.bin stays where it is (it was moved aside as
    saved with a model "not stored or not usable", every market from rest); --verify-data says the same line."""
    from cerebellar_norse.api.server import stored_weights
    from cerebellar_norse.training.checkpoints import verify_tree

    cfg, opened = journaled
    root, store, version = await saved_with_a_stored_model(cfg, opened)
    spath = root / STATE_FILE
    before = spath.read_bytes()
    locked = store.root / version / "weights.npz"
    unreadable(locked, errno.EACCES)
    said = (f"cannot read model file {locked}: Permission denied (errno 13 EACCES): the service does not start on a "
            "model it cannot read (nothing is moved aside): make it readable by the service's user (e.g. chown) and "
            "start again")
    _, problems = verify_tree(root)
    assert problems == [said]
    e2 = Engine(cfg, weights=generate_weights(cfg), model_version="20240102T000000Z-bbbbbb")
    e2.model_for = stored_weights(cfg, store)
    d2 = Durability(e2)
    opened.append(d2)
    with pytest.raises(StorageError) as refused:
        d2.recover()
    assert str(refused.value) == said
    monkeypatch.undo()
    assert spath.read_bytes() == before and not list(root.glob(f"{STATE_FILE}.*-*"))
    again = Engine(cfg, weights=generate_weights(cfg), model_version="20240102T000000Z-bbbbbb")
    again.model_for = stored_weights(cfg, store)
    d3 = Durability(again)  # (the refused start let go of the state dir's lock)
    opened.append(d3)
    d3.recover()  # readable again: restored with its model, as before
    assert again.pool.used == 2 and again.restore_problem is None


async def served_with_a_twin(cfg: Config, opened: list[Durability], fatal: list[StorageError],
                             ticks: list[Tick]) -> tuple[Engine, Durability, Engine]:
    """A journaling engine whose fatal errors go to ``fatal`` and a twin without a journal, both fed ``ticks``."""
    e = Engine(cfg)
    d = Durability(e, on_fatal=fatal.append)
    opened.append(d)
    d.recover()
    twin = Engine(cfg)
    await feed([e, twin], ticks)
    return e, d, twin


@pytest.mark.parametrize("replaced", [False, True])
async def test_a_state_dir_moved_while_held_is_not_recreated_by_its_path(journaled: tuple[Config, list[Durability]],
                                                                         streams: StreamFactory, replaced: bool) -> None:
    """Moved away (or replaced by an empty directory) while served, the state dir's next checkpoint wrote a new state dir
    by its old path: journal and market state without models, identity or lock, and the next start there lost every
    market. The journal now fails (no tick acknowledged after it, the service stops) and writes nothing by the path;
    the directory put back restores every acknowledged tick."""
    cfg, opened = journaled
    fatal: list[StorageError] = []
    ticks = interleaved(streams(30, 3, seed=13))
    e, d, twin = await served_with_a_twin(cfg, opened, fatal, ticks[:60])
    root = Path(cfg.paths.state_dir)
    moved = root.with_name("state.moved")
    root.rename(moved)
    if replaced:
        root.mkdir()
    await feed([e, twin], ticks[60:])  # appends go on into the mapped journal file, in the directory as moved
    assert not await d.checkpoint()
    (err,) = fatal
    why = "now names another directory" if replaced else "no longer exists"
    assert str(err).startswith(f"state dir {root} {why}: it was moved or replaced while the service ran")
    assert d.failed is err
    d.close(save=True)
    if replaced:
        assert list(root.iterdir()) == []
        root.rmdir()
    assert not root.exists()
    moved.rename(root)
    e2, _ = start(cfg, opened)
    assert_same_pool(e2, twin)


async def test_a_state_dir_named_by_a_link_is_served_in_place_until_the_link_points_elsewhere(
        engine_config: ConfigFactory, tmp_path: Path, streams: StreamFactory) -> None:
    """paths.state_dir a symbolic link to the directory: the directory locked is the link's target, so checkpoints
    and the final save go on; the link pointed at another directory while served fails the journal as a moved state
    dir does (writes by the path would go to the other directory)."""
    real, other = tmp_path / "real", tmp_path / "other"
    real.mkdir()
    other.mkdir()
    link = tmp_path / "state"
    link.symlink_to(real)
    cfg = engine_config(state_dir=link, max_markets=16)
    opened: list[Durability] = []
    try:
        fatal: list[StorageError] = []
        ticks = interleaved(streams(30, 3, seed=17))
        e, d, twin = await served_with_a_twin(cfg, opened, fatal, ticks[:60])
        assert await d.checkpoint()
        await feed([e, twin], ticks[60:])
        d.close(save=True)
        assert fatal == [] and (real / "market_state.bin").exists()
        e2, d2 = start(cfg, opened)
        assert_same_pool(e2, twin)
        d2.close(save=True)

        e3 = Engine(cfg)
        d3 = Durability(e3, on_fatal=fatal.append)
        opened.append(d3)
        d3.recover()
        link.unlink()
        link.symlink_to(other)
        with pytest.raises(StorageError, match=r"now names another directory: it was moved or replaced"):
            d3.checkpoint_now()
        (err,) = fatal
        assert str(err).startswith(f"state dir {link} now names another directory")
        assert list(other.iterdir()) == []
    finally:
        for d in opened:
            crash(d)


async def test_verify_data_finds_the_model_of_market_state_in_a_models_dir_that_is_a_link(
        journaled: tuple[Config, list[Durability]], tmp_path: Path) -> None:
    """models/ a symbolic link to a directory elsewhere (the service reads its models through it): the model the
    market state was saved with is stored, so --verify-data names no problem (it said "not stored")."""
    from cerebellar_norse.training.checkpoints import verify_tree

    cfg, opened = journaled
    root, store, _ = await saved_with_a_stored_model(cfg, opened)
    shared = tmp_path / "shared-models"
    shutil.move(store.root, shared)
    store.root.symlink_to(shared)
    ok, problems = verify_tree(root)
    assert problems == []
    assert f"{root / STATE_FILE}: market state OK (2 markets)" in ok


SHORTAGES = {  # what a new file can lack for a while: errno, its text, what the journal says it waits for
    "EMFILE": (errno.EMFILE, "Too many open files", "a file descriptor"),
    "ENOSPC": (errno.ENOSPC, "No space left on device", "disk space (no space left on device)"),
    "EDQUOT": (errno.EDQUOT, "Disk quota exceeded", "disk space (disk quota exceeded)"),
}


def no_new_file(monkeypatch: pytest.MonkeyPatch, shortage: str) -> None:
    """The journal's next file cannot be created: no descriptor to open it (EMFILE), no room to reserve its blocks
    (ENOSPC, EDQUOT: ``posix_fallocate`` fails, as on a full disk or a used-up quota)."""
    from cerebellar_norse.engine import journal as journal_mod

    code, text, _ = SHORTAGES[shortage]

    def fail(*_a: object, **_k: object) -> None:
        raise OSError(code, text)

    if code == errno.EMFILE:
        monkeypatch.setattr(journal_mod, "create_segment", fail)
    else:
        monkeypatch.setattr(os, "posix_fallocate", fail)


@pytest.mark.parametrize("shortage", sorted(SHORTAGES))
@pytest.mark.parametrize("where", ["segment", "checkpoint"])
async def test_a_periodic_checkpoint_without_a_file_descriptor_or_disk_space_is_skipped_not_fatal(
        journaled: tuple[Config, list[Durability]], streams: StreamFactory, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, where: str, shortage: str) -> None:
    """EMFILE, ENOSPC or EDQUOT when a periodic checkpoint starts its segment or writes its file: one WARNING however
    many are skipped, the service goes on acknowledging ticks, and the next checkpoint (the shortage over) covers
    them all, with an INFO line."""
    from cerebellar_norse.engine import journal as journal_mod

    code, text, _ = SHORTAGES[shortage]

    def fail(*_a: object, **_k: object) -> None:
        raise OSError(code, text)

    cfg, opened = journaled
    ticks = interleaved(streams(120, 3, seed=7))
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    await feed([e, twin], ticks[:40])
    if where == "segment":
        no_new_file(monkeypatch, shortage)
    else:
        monkeypatch.setattr(journal_mod, "write_snapshot", fail)
    with caplog.at_level(logging.INFO, logger="cerebellar_norse.journal"):
        assert not await d.checkpoint()
        await feed([e, twin], ticks[40:60])  # still acknowledged
        assert not await d.checkpoint()  # skipped again: no second WARNING
        assert d.failed is None
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert f"errno {code} {shortage}" in warnings[0] and "checkpoint skipped" in warnings[0]
        if shortage != "EMFILE":
            assert f"free space in the state dir {d.state_dir}" in warnings[0] or \
                f"free space on the file system of the state dir {d.state_dir}" in warnings[0]
        await feed([e, twin], ticks[60:80])  # still acknowledged
        monkeypatch.undo()
        assert await d.checkpoint()
    assert "checkpoint written again after 2 skipped" in caplog.text
    await feed([e, twin], ticks[80:])
    crash(d)
    again, _ = start(cfg, opened)
    assert_same_pool(again, twin)


@pytest.mark.parametrize("shortage", sorted(SHORTAGES))
async def test_a_full_segment_whose_next_file_finds_no_descriptor_or_space_waits_instead_of_stopping(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, shortage: str) -> None:
    """EMFILE, ENOSPC or EDQUOT when a full segment needs its next file: the tick being journaled is kept (the
    segment's reserve holds it), later ticks and resets are refused with a 503-kind error before they change
    anything, one WARNING names the cause, the path and what to do; once the shortage is over the next submission
    starts the file and is served, and a restart replays exactly the acknowledged ticks."""


    code, _, cause = SHORTAGES[shortage]
    cfg = engine_config(state_dir=tmp_path / "state", journal_segment_size="1MB", batch_size=4, max_markets=16)
    fatal: list[StorageError] = []
    e, d, twin = await served_with_a_twin(cfg, [], fatal, [tick(m, T0 + k) for k in range(6) for m in "AB"])

    no_new_file(monkeypatch, shortage)
    d._soft = d._pos  # the open segment reached its size target: the next append starts the next file
    full = d._segments[-1][1]
    with caplog.at_level(logging.INFO, logger="cerebellar_norse.journal"):
        for eng in (e, twin):
            await eng.submit(tick("A", T0 + 100))  # acknowledged: in the reserve of the full file
        assert d.stalled is not None and d.failed is None and not fatal
        for _ in range(3):
            with pytest.raises(JournalWaitError, match=rf"errno {code} {shortage}.*nothing was changed") as refused:
                await e.submit(tick("B", T0 + 100))
            assert refused.value.retry_after_s >= 1
        with pytest.raises(JournalWaitError):
            await e.submit_many([tick("C", T0 + 100), tick("C", T0 + 101)])
        with pytest.raises(JournalWaitError):
            e.reset_market("A")
        assert e.pool.table.get("C") is None and e.pool.table.get("A") is not None  # refused: nothing changed
        assert not await d.checkpoint()  # a periodic checkpoint cannot start its file either: no second WARNING
        assert e.snapshot().accepting  # (the watchdog keeps being fed: the service is not stopping)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        said = warnings[0].getMessage()
        assert f"errno {code} {shortage}" in said and str(full) in said and f"waiting for {cause}" in said
        reason = d.wait_reason()
        assert reason is not None and reason.startswith(f"journal waiting for {cause}: cannot create journal file")
        if shortage != "EMFILE":
            assert f"state dir {d.state_dir}" in said and f"state dir {d.state_dir}" in reason
        assert "no further tick is acknowledged" not in caplog.text

        monkeypatch.undo()  # a descriptor or the space is free again
        d._retry_at = 0.0  # (the next try for space is due: SPACE_RETRY_S after the last)
        for eng in (e, twin):
            await eng.submit(tick("B", T0 + 100))
    assert d.stalled is None and d._segments[-1][1] != full
    assert "ticks are accepted again" in caplog.text
    await feed([e, twin], [tick(m, T0 + 200 + k) for k in range(4) for m in "ABC"])
    assert not fatal
    crash(d)
    e2 = Engine(cfg)
    d2 = Durability(e2)
    d2.recover()
    assert_same_pool(e2, twin)  # every acknowledged tick, none of the refused ones
    crash(d2)


@pytest.mark.parametrize("shortage", ["EMFILE", "ENOSPC"])
async def test_a_journal_waiting_for_space_tries_its_next_file_at_most_every_quarter_second(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shortage: str) -> None:
    """A try on a full disk reserves what the disk has of the file's size and gives it back: refused ticks between
    two tries (SPACE_RETRY_S apart) do not repeat it; a missing descriptor (one failed open) is tried with each."""
    from cerebellar_norse.engine import journal as journal_mod
    from cerebellar_norse.engine import segments as segments_mod


    clock = [1000.0]
    monkeypatch.setattr(journal_mod, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    cfg = engine_config(state_dir=tmp_path / "state", journal_segment_size="1MB", batch_size=4, max_markets=16)
    e = Engine(cfg)
    d = Durability(e, on_fatal=lambda exc: None)
    d.recover()
    await feed([e], [tick(m, T0 + k) for k in range(3) for m in "AB"])
    code, text, _ = SHORTAGES[shortage]
    tries: list[int] = []

    def fail(*_a: object, **_k: object) -> None:
        tries.append(1)
        raise OSError(code, text)

    monkeypatch.setattr(journal_mod, "create_segment", fail)
    d._soft = d._pos
    await e.submit(tick("A", T0 + 10))  # into the reserve: the journal waits
    assert d.stalled is not None and len(tries) == 1
    for _ in range(5):
        with pytest.raises(JournalWaitError, match=rf"errno {code} {shortage}"):
            await e.submit(tick("B", T0 + 10))
    assert len(tries) == (1 if shortage == "ENOSPC" else 6)
    clock[0] += journal_mod.SPACE_RETRY_S
    with pytest.raises(JournalWaitError):
        await e.submit(tick("B", T0 + 10))
    assert len(tries) == (2 if shortage == "ENOSPC" else 7)
    monkeypatch.setattr(journal_mod, "create_segment", segments_mod.create_segment)  # the space is back
    clock[0] += journal_mod.SPACE_RETRY_S
    await e.submit(tick("B", T0 + 10))
    assert d.stalled is None
    crash(d)


@pytest.mark.parametrize("shortage", ["EMFILE", "ENOSPC"])
@pytest.mark.parametrize("reset", [False, True])
async def test_a_swap_whose_journal_file_finds_no_descriptor_or_space_is_refused_not_fatal(
        journaled: tuple[Config, list[Durability]], monkeypatch: pytest.MonkeyPatch, reset: bool, shortage: str) -> None:
    """EMFILE or ENOSPC when a model swap starts its journal file: the swap is refused (503 kind) and undone, the
    journal goes on, and the swap succeeds once the shortage is over."""


    cfg, opened = journaled
    w2, e, d, twin = await fed_with_another_model(cfg, opened)
    version = e.model_version
    no_new_file(monkeypatch, shortage)
    with pytest.raises(JournalWaitError, match=rf"errno {SHORTAGES[shortage][0]} {shortage}"):
        e.set_weights(w2.copy(), "v2", reset_states=reset)
    monkeypatch.undo()
    assert d.failed is None and e.model_version == version
    assert_same_pool(e, twin)
    await feed([e, twin], [tick("A", T0 + 500)])  # still acknowledged
    e.set_weights(w2.copy(), "v2", reset_states=reset)
    assert e.model_version == "v2"


@pytest.mark.parametrize("how", ["crash", "stop"])
@pytest.mark.parametrize("shortage", ["EMFILE", "ENOSPC"])
async def test_a_crash_or_stop_while_the_journal_waits_for_a_descriptor_or_space_keeps_the_ticks_in_the_reserve(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shortage: str, how: str) -> None:
    """kill -9 while stalled, or a stop whose final save finds the disk still full: the records written into the full
    file's reserve are replayed like any other, and the refused ticks are in no state."""
    from cerebellar_norse.engine import engine as engine_mod


    cfg = engine_config(state_dir=tmp_path / "state", journal_segment_size="1MB", batch_size=4, max_markets=16)
    e = Engine(cfg)
    d = Durability(e, on_fatal=lambda exc: None)
    d.recover()
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(3) for m in "AB"])
    no_new_file(monkeypatch, shortage)
    d._soft = d._pos
    await feed([e, twin], [tick(m, T0 + 10 + k) for k in range(2) for m in "AB"], chunk=4)  # one batch: in the reserve
    assert d.stalled is not None and d._pos > d._soft
    with pytest.raises(JournalWaitError):
        await e.submit(tick("A", T0 + 20))
    if how == "crash":
        crash(d)
    else:
        def full(*_a: object, **_k: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(engine_mod, "save_pool", full)
        with pytest.raises(StorageError, match=r"cannot save market state .*errno 28 ENOSPC"):
            await e.drain(save=True)
        assert list_segments(Path(cfg.paths.state_dir) / JOURNAL_DIR)  # kept: they hold the acknowledged ticks
    monkeypatch.undo()
    e2 = Engine(cfg)
    d2 = Durability(e2)
    d2.recover()
    assert_same_pool(e2, twin)
    crash(d2)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
async def test_a_journal_file_that_cannot_be_flushed_stops_the_service_whatever_the_errno(
        engine_config: ConfigFactory, tmp_path: Path, code: int) -> None:
    """journal_fsync: an msync of the open (reserved) journal file that fails, ENOSPC as EIO, is fatal, not a wait:
    after a failed flush the page cache cannot be trusted to hold what was appended."""
    cfg = engine_config(state_dir=tmp_path / "state", journal_fsync=True, max_markets=16)
    fatal: list[StorageError] = []
    e = Engine(cfg)
    d = Durability(e, on_fatal=fatal.append)
    d.recover()
    twin = Engine(cfg)
    await feed([e, twin], [tick(m, T0 + k) for k in range(3) for m in "AB"])
    assert d._mm is not None

    class Failing:
        def __init__(self, mm: object) -> None:
            self.mm = mm

        def __setitem__(self, key: slice, value: bytes) -> None:
            self.mm[key] = value  # type: ignore[index]

        def flush(self, *_a: object) -> None:
            raise OSError(code, os.strerror(code))

        def close(self) -> None:
            self.mm.close()  # type: ignore[attr-defined]

    d._mm = Failing(d._mm)  # type: ignore[assignment]
    with pytest.raises(StorageError, match=rf"cannot flush the journal .*errno {code} {errno.errorcode[code]}"):
        await e.submit(tick("A", T0 + 50))
    with pytest.raises(StorageError):  # refused, not waited for
        await e.submit(tick("B", T0 + 50))
    assert d.stalled is None and d.failed is not None and len(fatal) == 1
    assert not e.snapshot().accepting
    await e.drain(save=True)  # what the service does once on_fatal has stopped it: the journal is kept
    e2 = Engine(cfg)
    d2 = Durability(e2)
    d2.recover()
    assert e2.pool.last_timestamp("B") == twin.pool.last_timestamp("B") == T0 + 2
    d2.close(save=True)


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.EIO])
async def test_a_next_journal_file_refused_by_a_read_only_disk_permissions_or_an_io_error_stops_the_service(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Only a shortage that passes (WAITABLE) is waited for: a file system remounted read-only (after I/O errors),
    permissions taken away or an I/O error when the next journal file is created fail the journal: on_fatal once,
    nothing more acknowledged, the acknowledged ticks replayed after the restart."""
    from cerebellar_norse.engine import journal as journal_mod

    cfg = engine_config(state_dir=tmp_path / "state", journal_segment_size="1MB", batch_size=4, max_markets=16)
    fatal: list[StorageError] = []
    e, d, twin = await served_with_a_twin(cfg, [], fatal, [tick(m, T0 + k) for k in range(3) for m in "AB"])

    def fail(*_a: object, **_k: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(journal_mod, "create_segment", fail)
    d._soft = d._pos
    with pytest.raises(StorageError, match=rf"cannot create journal file .*errno {code} {errno.errorcode[code]}"):
        await e.submit(tick("A", T0 + 10))
    with pytest.raises(StorageError):
        await e.submit(tick("B", T0 + 10))
    assert d.stalled is None and d.failed is not None and len(fatal) == 1 and d.wait_reason() is None
    assert not await d.checkpoint()
    monkeypatch.undo()
    await e.drain(save=True)
    e2 = Engine(cfg)
    d2 = Durability(e2)
    d2.recover()
    assert_same_pool(e2, twin)
    crash(d2)


@pytest.mark.parametrize("code", [errno.EIO, errno.EACCES])
async def test_a_covered_journal_file_that_cannot_be_deleted_fails_the_journal_in_one_line(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, code: int) -> None:
    """The checkpoint is written but the journal file it covers cannot be deleted (an I/O error, permissions taken
    away): one ERROR naming the file and the errno, the service stops as for any failed state write, and a restart
    has every acknowledged tick. (The error escaped the periodic checkpoint task, which ended without a word: no
    checkpoint was written again while the service served on.)"""
    cfg = engine_config(state_dir=tmp_path / "state", max_markets=16)
    fatal: list[StorageError] = []
    opened: list[Durability] = []
    e, d, twin = await served_with_a_twin(cfg, opened, fatal, [tick(m, T0 + k) for k in range(4) for m in "AB"])
    covered = d._segments[-1][1]
    real_unlink = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self == covered:
            raise OSError(code, os.strerror(code), str(self))
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    with caplog.at_level(logging.WARNING, logger="cerebellar_norse.journal"):
        assert await d.checkpoint()
    monkeypatch.undo()
    assert len(fatal) == 1 and d.failed is not None and covered.exists()
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.levelno == logging.ERROR and f"cannot delete journal file {covered}" in line.getMessage()
    assert f"errno {code} {errno.errorcode[code]}" in line.getMessage()
    with pytest.raises(StorageError):  # nothing more is acknowledged
        await e.submit(tick("A", T0 + 50))
    await e.drain(save=True)
    e2, _ = start(cfg, opened)
    assert_same_pool(e2, twin)
    for d_ in opened:
        crash(d_)


async def test_the_periodic_checkpoints_go_on_after_an_unexpected_error(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """An error the checkpoint does not expect is logged at ERROR with its traceback and tried again at the next
    interval: the task that writes them never ends silently (the journal would only grow, and the replay with it)."""
    cfg = engine_config(state_dir=tmp_path / "state", max_markets=16, checkpoint_interval_s=0.01)
    opened: list[Durability] = []
    e, d = start(cfg, opened)
    await feed([e], [tick("A", T0 + k) for k in range(3)])
    calls: list[int] = []
    real = d.checkpoint

    async def checkpoint() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("unexpected")
        return await real()

    monkeypatch.setattr(d, "checkpoint", checkpoint)
    task = asyncio.ensure_future(d.run())
    with caplog.at_level(logging.ERROR, logger="cerebellar_norse.journal"):
        for _ in range(200):
            await asyncio.sleep(0.01)
            if d.checkpoints:
                break
    assert d.checkpoints >= 1 and not task.done()
    assert "periodic checkpoint failed: unexpected" in caplog.text
    task.cancel()
    crash(d)


async def test_a_periodic_checkpoint_without_a_thread_to_write_it_is_skipped_in_one_warning(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The host cannot start the worker thread that writes market_state.bin (clone EAGAIN at the task limit): the
    checkpoint is skipped like one that finds no descriptor, one WARNING naming the file and what to do, then DEBUG;
    the next one that gets a thread is written. (Each interval logged an ERROR with a traceback.)"""
    cfg = engine_config(state_dir=tmp_path / "state", max_markets=16)
    opened: list[Durability] = []
    e, d = start(cfg, opened)
    loop = asyncio.get_running_loop()

    def no_thread(*_a: object, **_k: object) -> None:
        raise RuntimeError("can't start new thread")

    caplog.clear()  # the start's own lines, captured where another test left INFO on
    with caplog.at_level(logging.DEBUG, logger="cerebellar_norse.journal"):
        for k in range(2):
            await feed([e], [tick("A", T0 + k)])
            monkeypatch.setattr(loop, "run_in_executor", no_thread)
            assert not await d.checkpoint()
            monkeypatch.undo()
        await feed([e], [tick("A", T0 + 5)])
        assert await d.checkpoint()
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert len(said) == 2 and said[0][0] == logging.WARNING and said[1][0] == logging.INFO
    assert f"cannot write checkpoint {e.state_path()}: cannot start a thread" in said[0][1]
    assert "checkpoint skipped" in said[0][1] and "TasksMax=" in said[0][1]
    assert "checkpoint written again after 2 skipped" in said[1][1]
    assert d.failed is None and not any(r.exc_info for r in caplog.records)
    crash(d)


@pytest.mark.parametrize("what", ["directory open EMFILE", "mmap ENOMEM"])
async def test_a_journal_file_whose_creation_fails_late_leaves_no_file_behind(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    """No descriptor to open the journal directory for its flush, or no memory to map the file, once the file had
    been renamed to its name: the periodic checkpoint is skipped (EMFILE) or the journal fails (ENOMEM), and no
    journal file is left under its name (a stray file held the space reserved for it until the next restart)."""
    from cerebellar_norse.engine import segments as segments_mod

    cfg = engine_config(state_dir=tmp_path / "state", max_markets=16)
    fatal: list[StorageError] = []
    opened: list[Durability] = []
    _e, d, twin = await served_with_a_twin(cfg, opened, fatal, [tick(m, T0 + k) for k in range(4) for m in "AB"])
    jdir = Path(cfg.paths.state_dir) / JOURNAL_DIR
    before = sorted(p.name for p in jdir.iterdir())
    if what.startswith("directory"):
        real_open = os.open

        def no_descriptor(path: object, flags: int, *a: object, **k: object) -> int:
            if Path(str(path)) == jdir:
                raise OSError(errno.EMFILE, "Too many open files", str(path))
            return real_open(path, flags, *a, **k)  # type: ignore[arg-type]

        monkeypatch.setattr(segments_mod.os, "open", no_descriptor)
    else:
        def no_memory(*_a: object, **_k: object) -> None:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")

        monkeypatch.setattr(segments_mod.mmap, "mmap", no_memory)
    assert not await d.checkpoint()
    monkeypatch.undo()
    assert sorted(p.name for p in jdir.iterdir()) == before
    assert (len(fatal) == 1) == what.startswith("mmap")
    for d_ in opened:
        crash(d_)
    e2, d2 = start(cfg, [])
    assert_same_pool(e2, twin)
    crash(d2)


async def test_renames_and_deletes_a_signal_interrupts_are_made_again_never_an_error(
        engine_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EINTR from rename or unlink (a network or FUSE file system; Python retries most calls itself, not these):
    the call is made again. (The journal file's rename failed with EINTR and stopped the service, leaving its
    temporary file behind.)"""
    cfg = engine_config(state_dir=tmp_path / "state", max_markets=16)
    fatal: list[StorageError] = []
    opened: list[Durability] = []
    e, d, twin = await served_with_a_twin(cfg, opened, fatal, [tick(m, T0 + k) for k in range(4) for m in "AB"])
    interrupted: list[str] = []

    def interrupting(name: str) -> Any:
        real = getattr(os, name)

        def call(*a: Any, **k: Any) -> Any:
            if len(interrupted) < 20 and interrupted.count(f"{a[0]}") == 0:
                interrupted.append(f"{a[0]}")
                raise InterruptedError(errno.EINTR, "Interrupted system call")
            return real(*a, **k)
        return call

    for name in ("replace", "rename", "unlink"):
        monkeypatch.setattr(os, name, interrupting(name))
    for k in range(3):  # journal files started, checkpoints written, covered files deleted
        await feed([e, twin], [tick(m, T0 + 10 + k) for m in "AB"])
        assert await d.checkpoint()
    monkeypatch.undo()
    assert interrupted and not fatal and d.failed is None
    state_dir = Path(cfg.paths.state_dir)
    assert not list(state_dir.rglob("*.tmp")) and len(list_segments(state_dir / JOURNAL_DIR)) == 1
    crash(d)
    e2, d2 = start(cfg, [])
    assert_same_pool(e2, twin)
    crash(d2)


async def test_no_single_flipped_bit_or_shifted_byte_of_the_newest_file_passes_for_a_crash_cut_append(
        engine_config: ConfigFactory, tmp_path: Path) -> None:
    """A journal file damaged anywhere but in its last record is damage (moved aside, named), never an unfinished
    append: a flipped bit in a record's length made that record's extent cover every record after it, and an inserted
    byte shifted them all; both were dropped as "an unfinished last record" and every acknowledged tick in them lost
    without a word, and a flipped bit in the header's zero padding (outside its checksum) was read as intact."""
    cfg, opened = engine_config(state_dir=tmp_path / "state", journal_segment_size="1MB"), []
    e, d = start(cfg, opened)
    await feed([e], [tick(f"M{k % 3}", T0 + k) for k in range(60)], chunk=1)
    (_, path), = list_segments(Path(cfg.paths.state_dir) / JOURNAL_DIR)
    last_record = d._pos - (REC.size + ONE.size + 2)  # the last append: one tick of a two-letter market id
    crash(d)
    raw = path.read_bytes()
    whole = list(SegmentReader(path).records())
    assert len(whole) == 60
    used = len(raw.rstrip(b"\0"))
    rng = np.random.default_rng(13)
    mutations = [("flip", int(p), int(b)) for p, b in zip(rng.integers(0, used, 300), rng.integers(0, 8, 300), strict=True)]
    mutations += [("flip", HEADER_SIZE + k // 8, k % 8) for k in range(32)]  # every bit of the first record's length
    mutations += [(kind, int(p), 0) for kind in ("insert", "delete") for p in rng.integers(0, used, 40)]
    probe = tmp_path / path.name
    for kind, pos, bit in mutations:
        if kind == "flip":
            data = raw[:pos] + bytes([raw[pos] ^ (1 << bit)]) + raw[pos + 1:]
        else:
            data = raw[:pos] + b"\x07" + raw[pos:] if kind == "insert" else raw[:pos] + raw[pos + 1:] + b"\0"
        probe.write_bytes(data)
        try:
            reader = SegmentReader(probe)
            got = list(reader.records())
        except ValueError:
            continue  # an unreadable header: the whole file is moved aside
        if reader.damage is not None:
            continue
        where = f"{kind} at offset {pos} (bit {bit})"
        assert pos >= last_record, f"{where}: read as intact or cut by a crash: {len(got)} records, {reader.unfinished}"
        assert len(got) >= 59, where  # only the last append may pass for one a crash cut short


async def test_the_journal_keeps_no_encoding_of_market_ids_long_gone(journaled: tuple[Config, list[Durability]]) -> None:
    """The journal kept each market id's packed encoding until 100,000 ids had been seen (about 600 bytes each): a
    churn of new market ids grew the service's memory by some 2 MB an hour, to 60 MB. Now at most twice the pool's
    slots, at least 1024, are kept, and the ticks of ids dropped from it are journaled as before."""
    cfg, opened = journaled  # 16 slots: at most 1024 ids are kept
    e, d = start(cfg, opened)
    twin = Engine(cfg)
    ticks = [tick(f"CHURN{k:05d}", T0 + k) for k in range(1024 + 512)]
    for k in range(0, len(ticks), 256):
        await feed([e, twin], ticks[k:k + 256])
        assert len(d._ids) <= 1024
    crash(d)
    again, _ = start(cfg, opened)
    assert_same_pool(again, twin)
