"""save_pool / load_pool: the market state file (checksummed .npz with a network fingerprint)."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import ConfigFactory, assert_same_state

from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.persistence import STATE_FILE, STATE_FORMAT, check_writable, load_pool, save_pool
from cerebellar_norse.errors import CheckpointError, StorageError
from cerebellar_norse.neurons.encoder import S_COUNT, S_LAST_PRICE, S_LAST_TS, S_N_TICKS, S_VAR
from cerebellar_norse.neurons.state import STATE_FIELDS
from cerebellar_norse.storage import MAGIC, read_checksummed, sha256_bytes, write_checksummed

T0 = 1_640_995_200_000


def filled(engine: Engine, markets: list[str], seed: int = 0) -> Engine:
    """Give each market a slot with distinct random state (LRU order = list order).

    The encoder is one real ticks can lead to: its tick count, feature counts and last tick time whole numbers in
    range, its last price > 0 and its feature variances >= 0.
    """
    rng = np.random.default_rng(seed)
    for m in markets:
        slot = engine.pool.table.acquire(m)
        for name in STATE_FIELDS:
            arr = getattr(engine.arrays, name)
            arr[slot] = rng.standard_normal(arr.shape[1:]).astype(arr.dtype)
        engine.arrays.enc[slot, S_N_TICKS] = rng.integers(1, 1000)
        engine.arrays.enc[slot, S_LAST_TS] = T0 + rng.integers(0, 10**9)
        engine.arrays.enc[slot, S_LAST_PRICE] = 1.0 + abs(engine.arrays.enc[slot, S_LAST_PRICE])
        engine.arrays.enc[slot, S_VAR:S_VAR + 3] = np.abs(engine.arrays.enc[slot, S_VAR:S_VAR + 3])
        engine.arrays.enc[slot, S_COUNT:S_COUNT + 3] = rng.integers(0, 1000, 3)
    return engine


def states(engine: Engine) -> dict[str, dict[str, np.ndarray]]:
    return {m: engine.arrays.read_slot(s) for m, s in engine.pool.table.items()}


@pytest.fixture
def engine(engine_config: ConfigFactory) -> Engine:
    return Engine(engine_config(max_markets=8))


def test_round_trip_keeps_states_and_lru_order(engine: Engine, engine_config: ConfigFactory, tmp_path: Path) -> None:
    filled(engine, ["A", "B", "C"])
    engine.pool.table.acquire("A")  # order B, C, A
    path = tmp_path / STATE_FILE
    assert save_pool(engine.pool, path, engine.fingerprint()) == 3

    other = Engine(engine_config(max_markets=8))
    assert load_pool(other.pool, path, other.fingerprint()) == 3
    assert other.pool.table.markets() == ["B", "C", "A"]
    want, got = states(engine), states(other)
    for m in want:
        assert_same_state(got[m], want[m])


def test_file_format(engine: Engine, tmp_path: Path) -> None:
    """SHA-256 header, then an .npz with its format, market ids, fingerprint and one array per state field."""
    filled(engine, ["A", "B"])
    path = tmp_path / STATE_FILE
    save_pool(engine.pool, path, engine.fingerprint())
    raw = path.read_bytes()
    assert raw.startswith(MAGIC)
    header, payload = raw.split(b"\n", 1)
    assert header[len(MAGIC):].decode() == sha256_bytes(payload)
    with np.load(io.BytesIO(payload), allow_pickle=False) as z:
        assert set(z.files) == {"format", "markets", "fingerprint", "journal_seq", *STATE_FIELDS}
        assert int(z["format"]) == STATE_FORMAT
        assert int(z["journal_seq"]) == 0  # no journal: nothing after the file to replay
        assert z["markets"].tolist() == ["A", "B"]
        assert json.loads(str(z["fingerprint"])) == json.loads(json.dumps(engine.fingerprint()))
        assert z["v_gr"].shape == (2, *engine.arrays.v_gr.shape[1:])


def test_empty_pool_round_trip(engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / STATE_FILE
    assert save_pool(engine.pool, path, engine.fingerprint()) == 0
    assert load_pool(engine.pool, path, engine.fingerprint()) == 0
    assert engine.pool.used == 0


def test_more_markets_than_slots_keeps_the_most_recent(engine: Engine, engine_config: ConfigFactory, tmp_path: Path) -> None:
    filled(engine, [f"M{k}" for k in range(8)])
    path = tmp_path / STATE_FILE
    save_pool(engine.pool, path, engine.fingerprint())
    small = Engine(engine_config(max_markets=3))
    fp = small.fingerprint()
    assert fp == engine.fingerprint()  # pool size is not part of the network
    assert load_pool(small.pool, path, fp) == 3
    assert small.pool.table.markets() == ["M5", "M6", "M7"]
    want = states(engine)
    for m, st in states(small).items():
        assert_same_state(st, want[m])
    assert small.pool.table.evictions == 0


def test_a_restore_into_fewer_slots_says_how_many_markets_it_left_out(engine: Engine, engine_config: ConfigFactory,
                                                                     tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    filled(engine, [f"M{k}" for k in range(8)])
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    save_pool(engine.pool, state_dir / STATE_FILE, engine.fingerprint())
    small = Engine(engine_config(max_markets=3, state_dir=state_dir))
    with caplog.at_level(logging.WARNING):
        assert small.restore_state() == 3
    (line,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "5 of the 8 saved markets were not restored" in line.getMessage() and "max_markets = 3" in line.getMessage()


def test_other_network_is_refused_and_nothing_loaded(engine: Engine, engine_config: ConfigFactory, tmp_path: Path) -> None:
    filled(engine, ["A"])
    path = tmp_path / STATE_FILE
    save_pool(engine.pool, path, engine.fingerprint())
    other = Engine(engine_config(max_markets=8, neural={"seed": 7}))
    with pytest.raises(CheckpointError, match="another network") as exc:
        load_pool(other.pool, path, other.fingerprint())
    assert exc.value.path == str(path)
    assert other.pool.used == 0


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_file_is_refused_naming_it(engine: Engine, engine_config: ConfigFactory, tmp_path: Path, damage: str) -> None:
    filled(engine, ["A", "B"])
    path = tmp_path / STATE_FILE
    save_pool(engine.pool, path, engine.fingerprint())
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-50] ^= 0x80
    else:
        del data[len(data) // 2:]
    path.write_bytes(bytes(data))
    fresh = Engine(engine_config(max_markets=8))
    with pytest.raises(CheckpointError) as exc:
        load_pool(fresh.pool, path, fresh.fingerprint())
    assert str(path) in str(exc.value) and "checksum" in str(exc.value)
    assert fresh.pool.used == 0


def npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def test_valid_checksum_over_foreign_payload_is_refused(engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / STATE_FILE
    fp = np.array(json.dumps(engine.fingerprint(), sort_keys=True))
    cases = {
        "unreadable": b"not an npz archive",
        "lacks": npz(markets=np.array(["A"])),  # no fingerprint
        "garbles": npz(markets=np.array("A"), fingerprint=fp),  # 0-d market list
        "shape": npz(markets=np.array(["A"]), fingerprint=fp,
                     **{name: np.zeros((1, 2)) for name in STATE_FIELDS}),
    }
    for word, payload in cases.items():
        write_checksummed(path, payload)
        with pytest.raises(CheckpointError, match=word):
            load_pool(engine.pool, path, engine.fingerprint())
        assert engine.pool.used == 0, word


def test_shape_mismatch_loads_nothing(engine: Engine, tmp_path: Path) -> None:
    """A file with a matching fingerprint but one field of the wrong shape: no market is loaded."""
    filled(engine, ["A", "B"])
    path = tmp_path / STATE_FILE
    save_pool(engine.pool, path, engine.fingerprint())
    with np.load(io.BytesIO(read_checksummed(path)), allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    data["i_out"] = data["i_out"][:, :-1]
    write_checksummed(path, npz(**data))
    for m in ["A", "B"]:
        engine.pool.table.release(m)
    with pytest.raises(CheckpointError, match="i_out"):
        load_pool(engine.pool, path, engine.fingerprint())
    assert engine.pool.used == 0


def test_save_is_atomic(engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save that fails before the rename leaves the previous file whole and no temporary file."""
    filled(engine, ["A"])
    path = tmp_path / STATE_FILE
    save_pool(engine.pool, path, engine.fingerprint())
    before = path.read_bytes()
    filled(engine, ["B", "C"], seed=1)

    def fail(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        save_pool(engine.pool, path, engine.fingerprint())
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == [STATE_FILE]
    assert save_pool(engine.pool, path, engine.fingerprint()) == 3
    assert os.listdir(tmp_path) == [STATE_FILE]


def _rewritten(path: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Rewrite a state file's payload through ``change``, with a valid checksum (damage the checksum cannot see)."""
    with np.load(io.BytesIO(read_checksummed(path)), allow_pickle=False) as z:
        data = {k: z[k].copy() for k in z.files}
    change(data)
    write_checksummed(path, npz(**data))


def _set(name: str, index: tuple[int | slice, ...], value: float) -> Callable[[dict[str, np.ndarray]], None]:
    def change(data: dict[str, np.ndarray]) -> None:
        data[name][index] = value
    return change


def _duplicate(data: dict[str, np.ndarray]) -> None:
    data["markets"] = np.array(["A", "A"])


def _renamed(market: str) -> Callable[[dict[str, np.ndarray]], None]:
    def change(data: dict[str, np.ndarray]) -> None:
        data["markets"] = np.array(["A", market])
    return change


@pytest.mark.parametrize(("change", "message"), [
    (_set("v_gr", (0, slice(None)), np.nan), "market 'A': state field 'v_gr' holds non-finite values"),
    (_set("i_out", (1, 0), np.inf), "market 'B': state field 'i_out' holds non-finite values"),
    (_set("enc", (1, S_N_TICKS), -1.0), "market 'B': the state's tick count -1.0 .* out of range"),
    (_set("enc", (0, S_N_TICKS), 6.5), "market 'A': the state's tick count 6.5 .* out of range"),
    (_set("enc", (0, S_LAST_TS), 1e30), "market 'A': .* last timestamp 1e\\+30 is out of range"),
    (_duplicate, "a market id appears more than once"),
    # each stepped into NaN by the market's next tick (and saved so by the next checkpoint)
    (_set("enc", (1, S_LAST_PRICE), 0.0), "market 'B': the state's encoder last price 0.0: out of range"),
    (_set("enc", (0, S_VAR + 1), -1.0), "market 'A': the state's encoder feature variances .* out of range"),
    (_set("enc", (0, S_COUNT), -1.0), "market 'A': the state's encoder feature counts .* out of range"),
    (_renamed(""), "market id '' is no market id"),  # no tick can name it: it held its slot for good
    (_renamed(" B"), "market id ' B' is no market id .must be printable ASCII without leading"),
], ids=["nan", "inf", "negative count", "fractional count", "time out of range", "duplicate id", "price 0",
        "negative variance", "negative feature count", "empty id", "id with a leading space"])
def test_states_no_market_can_reach_are_refused_naming_the_market(
        engine: Engine, engine_config: ConfigFactory, tmp_path: Path,
        change: Callable[[dict[str, np.ndarray]], None], message: str) -> None:
    filled(engine, ["A", "B"])
    path = tmp_path / STATE_FILE
    save_pool(engine.pool, path, engine.fingerprint())
    _rewritten(path, change)
    fresh = Engine(engine_config(max_markets=8))
    with pytest.raises(CheckpointError, match=message) as exc:
        load_pool(fresh.pool, path, fresh.fingerprint())
    assert exc.value.path == str(path)
    assert fresh.pool.used == 0


def test_restore_moves_a_file_with_non_finite_states_aside(engine_config: ConfigFactory, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A checksum-valid file whose states hold inf is corrupt: not loaded, moved aside, one ERROR naming it."""
    cfg = engine_config(state_dir=tmp_path / "state", max_markets=8)
    saver = filled(Engine(cfg), ["A", "B"])
    saver.save_state()
    path = saver.state_path()
    _rewritten(path, _set("i_out", (1, 0), np.inf))
    written = path.read_bytes()
    fresh = Engine(cfg)
    with caplog.at_level(logging.ERROR):
        assert fresh.restore_state() == 0
    assert fresh.pool.used == 0 and not path.exists()
    (moved,) = path.parent.glob(f"{STATE_FILE}.corrupt-*")
    assert moved.read_bytes() == written
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and str(path) in errors[0].getMessage() and str(moved) in errors[0].getMessage()
    assert "market 'B': state field 'i_out' holds non-finite values" in errors[0].getMessage()


def test_a_state_dir_that_is_a_regular_file_is_named_as_not_a_directory(tmp_path: Path) -> None:
    """mkdir on a file says "File exists"; the error says what is wrong with the path instead."""
    state = tmp_path / "state"
    state.write_text("not a directory")
    with pytest.raises(StorageError) as exc:
        check_writable(state)
    assert str(exc.value) == f"state dir is not writable: {state}: Not a directory (errno 20 ENOTDIR)"
    assert exc.value.errno == errno.ENOTDIR
    assert state.read_text() == "not a directory"


def test_a_state_file_without_one_of_the_state_fields_names_it_as_missing(engine: Engine, tmp_path: Path) -> None:
    """A checksummed file of another version (a state field it does not hold): said to be missing, at restore and
    by --verify-data's reading, not "has shape None"."""
    from cerebellar_norse.engine.persistence import check_state_rows, read_state_payload

    path = tmp_path / STATE_FILE
    save_pool(filled(engine, ["A", "B"]).pool, path, engine.fingerprint())
    with np.load(io.BytesIO(read_checksummed(path)), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != STATE_FIELDS[-1]}
    write_checksummed(path, npz(**arrays))
    fresh = Engine(engine.cfg)
    want = f"field {STATE_FIELDS[-1]!r} is missing: the file holds no such state"
    with pytest.raises(CheckpointError, match=want) as exc:
        load_pool(fresh.pool, path, fresh.fingerprint())
    assert "None" not in str(exc.value) and str(path) in str(exc.value)
    assert fresh.pool.used == 0
    with pytest.raises(CheckpointError, match=want):
        check_state_rows(read_state_payload(read_checksummed(path), str(path)), str(path))


def test_a_checkpoint_needs_no_copy_of_the_states_beyond_their_snapshot(tmp_path: Path) -> None:
    """Writing the state file built its payload in memory and copied it behind its checksum header: twice the states'
    size again, on top of the snapshot, at every checkpoint (measured: +250 MB of resident memory each minute for an
    83 MB pool). Now it is written into the file in parts: at most about one part (16 MiB) more, whatever the size."""
    import tracemalloc

    from cerebellar_norse.engine.persistence import PoolSnapshot, read_state_payload, write_snapshot

    rng = np.random.default_rng(3)
    markets = [f"M{i}" for i in range(600)]
    arrays = {name: rng.standard_normal((600, 20_000)).astype(np.float32) for name in ("v_gr", "i_gr")}  # 96 MB
    size = sum(a.nbytes for a in arrays.values())
    path = tmp_path / STATE_FILE
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        write_snapshot(PoolSnapshot(markets, arrays), path, {"net": 1}, journal_seq=9, state_id=None)
        extra = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert extra < size / 4, f"writing {size} bytes of states took {extra} bytes more"
    raw = path.read_bytes()
    header, payload = raw.split(b"\n", 1)
    assert header == MAGIC + sha256_bytes(payload).encode()
    back = read_state_payload(read_checksummed(path), str(path))
    assert back.markets == markets and back.journal_seq == 9
    for name, a in arrays.items():
        assert np.array_equal(back.data[name], a)


def test_a_restore_needs_no_copy_of_the_payload_beyond_the_file_and_its_arrays(engine_config: ConfigFactory,
                                                                                 tmp_path: Path) -> None:
    """A start's restore held the file's bytes, a copy of its payload (sliced from behind the checksum header) and
    the arrays read from it at once: three times the states' size. The payload is read in place now: about two (the
    file, and the arrays before they go into the pool)."""
    import tracemalloc

    cfg = engine_config(max_markets=6000)
    saved, other = filled(Engine(cfg), [f"M{i}" for i in range(6000)]), Engine(cfg)
    path = tmp_path / STATE_FILE
    save_pool(saved.pool, path, saved.fingerprint())
    size = path.stat().st_size
    assert size > 20_000_000  # large enough for the copies to stand out of the interpreter's own allocations
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        raw = path.read_bytes()  # as the engine's start reads it (to tell an unreadable file from a damaged one)
        assert load_pool(other.pool, path, other.fingerprint(), raw=raw) == 6000
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * size, f"restoring {size} bytes took {peak} bytes at the peak"
    got, want = states(other), states(saved)
    assert list(got) == list(want)
    for m in want:
        assert_same_state(got[m], want[m])
