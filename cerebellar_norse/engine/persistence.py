"""Saving and restoring the live market states of a pool (atomic, checksummed).

The file ``<state_dir>/market_state.bin`` holds an ``.npz`` payload behind a SHA-256
header (see :mod:`cerebellar_norse.storage`): the market ids, their states (one
array per state variable, rows in least-recently-used order), a fingerprint of
the network (shape, seed, precision, model version) and ``journal_seq``, the number
of the last journal record the states include (see :mod:`.journal`; 0 without a
journal). A file whose fingerprint does not match the running network is not
loaded: those states belong to another model. Nor is one whose states hold values no
market can reach (non-finite numbers, a negative or fractional tick count, a last tick
time out of range): a checksum proves the file is as written, not that what was written
was sound.

A file that cannot be restored is never overwritten: :func:`quarantine` moves it
aside to ``<name>.corrupt-<UTC time>`` (unreadable) or ``<name>.foreign-<UTC time>``
(of another network or model), where it stays until an operator deletes it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    CheckpointError,
    ForeignStateDirError,
    ForeignStateError,
    InputError,
    NewerFormatError,
    StorageError,
    quoted,
)
from ..neurons.encoder import N_ENC_STATE, S_COUNT, S_LAST_PRICE, S_LAST_TS, S_MEAN, S_N_TICKS, S_VAR
from ..neurons.state import STATE_FIELDS
from ..storage import (
    HEADER_LEN,
    check_sealed,
    fsync_dir,
    read_sealed,
    retrying,
    write_checksummed_stream,
)
from ..ticks import TS_MAX_MS, check_market_id
from .pool import StatePool

STATE_FILE = "market_state.bin"
# The format of market_state.bin's payload (its ``format`` entry; a file without one, written before the entry, is 1).
# Raise it when a change means an older version would misread the file: that version then refuses it (NewerFormatError)
# instead of loading it, and moves nothing aside.
STATE_FORMAT = 1


def fingerprint_json(fingerprint: dict[str, Any]) -> Any:
    """A fingerprint as files hold it (JSON, keys sorted: tuples become lists), for comparing with a saved one."""
    return json.loads(json.dumps(fingerprint, sort_keys=True))


def network_of(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The network part of a fingerprint, in its JSON form: all but the model version."""
    return {k: v for k, v in fingerprint_json(fingerprint).items() if k != "model_version"}


LEGACY_DIR = ""  # the identity a state dir written before identities is expected to have (see load_pool)
STATE_ID_MAX = 64  # characters of a state dir identity (one is 32: a UUID's hex); each journal file's header holds it


def is_state_id(sid: object) -> bool:
    """Whether ``sid`` can be a state dir identity: 1 to ``STATE_ID_MAX`` ASCII letters and digits."""
    return isinstance(sid, str) and 0 < len(sid) <= STATE_ID_MAX and sid.isascii() and sid.isalnum()


def check_format(value: object, supported: int, path: str, what: str, remedy: str) -> None:
    """Raise unless ``value``, a file's format marker (None: written before markers, format 1), is one this version
    reads.

    Raises:
        CheckpointError: the marker is garbled (the file is damaged).
        NewerFormatError: a newer version wrote the file; nothing is to be moved aside.
    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{what} format {quoted(str(value), 40)} is no format number", path)
    if value > supported:
        raise NewerFormatError(path, what, value, supported, remedy)


@dataclass(frozen=True)
class PoolSnapshot:
    """A copy of every live market's state (taken between batches, written later)."""

    markets: list[str]
    arrays: dict[str, np.ndarray]


def snapshot_pool(pool: StatePool) -> PoolSnapshot:
    """Copy the live markets' states, least recently used first."""
    items = pool.table.items()
    slots = np.array([s for _, s in items], dtype=np.int64)
    arrays = {name: np.ascontiguousarray(getattr(pool.arrays, name)[slots]) for name in STATE_FIELDS}
    return PoolSnapshot([m for m, _ in items], arrays)


# The largest |feature| of a tick (its log return, between two positive finite float64 prices: below 710 - (-745)).
FEATURE_BOUND = 1500.0


def check_states(arrays: Mapping[str, np.ndarray], where: str, markets: Sequence[str] | None = None) -> None:
    """Raise unless market states hold only values a market can reach (nothing is changed).

    Every state field must be finite; the encoder's tick count a whole number >= 0, its
    last tick time whole milliseconds since the epoch, >= 0 and before ``TS_MAX_MS``.

    Args:
        arrays: one array per state field (:data:`STATE_FIELDS`): one market's state, or
            with ``markets`` one row per market.
        where: the file or request the states come from (the error's path).
        markets: the market of each row, named in the error.

    Raises:
        CheckpointError: naming the field (and the market) that is out of range.
    """
    def whose(ok: np.ndarray) -> str:
        """``"market '<id>': "`` for the first row with a False in ``ok`` (an array of the rows' shape)."""
        return "" if markets is None else f"market {markets[int(np.argmin(ok.reshape(len(markets), -1).all(axis=1)))]!r}: "

    for name in STATE_FIELDS:
        arr = arrays[name]
        if arr.dtype.kind not in "fiu":
            raise CheckpointError(f"state field {name!r} holds {arr.dtype} values, not numbers", where)
        finite = np.isfinite(arr)
        if not finite.all():
            raise CheckpointError(f"{whose(finite)}state field {name!r} holds non-finite values", where)
    enc = arrays["enc"].astype(np.float64)
    ticks, last_ts = enc[..., S_N_TICKS], enc[..., S_LAST_TS]
    ok = (ticks >= 0) & (ticks == np.floor(ticks)) & (last_ts >= 0) & (last_ts < TS_MAX_MS) & (last_ts == np.floor(last_ts))
    if not ok.all():
        k = np.unravel_index(int(np.argmin(ok)), ok.shape)
        raise CheckpointError(f"{whose(ok)}the state's tick count {float(ticks[k])!r} or last timestamp {float(last_ts[k])!r} "
                              f"is out of range (a count >= 0; ms since the epoch before {TS_MAX_MS})", where)
    # The running normaliser: a market that has seen a tick holds its price (> 0); each feature's mean lies among the
    # values it averaged (|x| <= FEATURE_BOUND) and its variance in [0, (2 FEATURE_BOUND)^2]; its count is whole, >= 0.
    # Any other state is stepped into non-finite numbers by the next tick (log of a price <= 0, the square root of a
    # negative variance), answered with plausible probabilities, then checkpointed: the next start would refuse the
    # whole market_state.bin.
    price = enc[..., S_LAST_PRICE]
    mean, var, count = (enc[..., at:at + 3] for at in (S_MEAN, S_VAR, S_COUNT))
    checks = (("last price", price, (ticks == 0) | (price > 0), "> 0 once a tick was seen"),
              ("feature means", mean, (np.abs(mean) <= FEATURE_BOUND).all(axis=-1), f"within +/-{FEATURE_BOUND:g}"),
              ("feature variances", var, ((var >= 0) & (var <= (2 * FEATURE_BOUND) ** 2)).all(axis=-1),
               f"in [0, {(2 * FEATURE_BOUND) ** 2:g}]"),
              ("feature counts", count, ((count >= 0) & (count == np.floor(count))).all(axis=-1), "whole numbers >= 0"))
    for what, values, rows_ok, rule in checks:
        ok = np.asarray(rows_ok)
        if not ok.all():
            k = np.unravel_index(int(np.argmin(ok)), ok.shape)
            shown = values[k].tolist()
            raise CheckpointError(f"{whose(ok)}the state's encoder {what} {shown!r}: out of range ({rule}): no "
                                  "market's ticks lead to it", where)


def write_snapshot(snap: PoolSnapshot, path: Path, fingerprint: dict[str, Any], journal_seq: int = 0,
                   state_id: str | None = None) -> int:
    """Atomically write a snapshot to ``path``; returns the number of markets.

    ``state_id``: the identity of the state dir it is written for (see :mod:`.journal`);
    None writes the file as before identities existed.

    Raises:
        OSError: the file could not be written (the previous file is left as it was).
    """
    extra = {} if state_id is None else {"state_id": np.array(state_id, dtype=np.str_)}
    arrays = {"format": np.array(STATE_FORMAT, dtype=np.int64), "markets": np.array(snap.markets, dtype=np.str_),
              "fingerprint": np.array(json.dumps(fingerprint, sort_keys=True)),
              "journal_seq": np.array(journal_seq, dtype=np.int64), **extra, **snap.arrays}
    write_checksummed_stream(path, lambda out: write_npz(out, arrays))
    return len(snap.markets)


def write_npz(out: Any, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` as an uncompressed ``.npz`` (what ``np.savez`` writes, read back by ``np.load``) into ``out``, a
    write-only file object, each array in parts of at most 16 MiB.

    A checkpoint built its payload in memory (``np.savez`` into a buffer) and copied it behind its checksum header:
    twice the market states' size on top of their snapshot, every ``checkpoint_interval_s`` (+250 MB for an 83 MB
    pool). ``np.savez`` itself cannot be given such a file (it wants a readable one).
    """
    with zipfile.ZipFile(out, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fid:
                np.lib.format.write_array(fid, np.asanyarray(value), allow_pickle=False)


def save_pool(pool: StatePool, path: Path, fingerprint: dict[str, Any], journal_seq: int = 0,
              state_id: str | None = None) -> int:
    """Write every live market's state to ``path``; returns the number of markets saved."""
    return write_snapshot(snapshot_pool(pool), path, fingerprint, journal_seq, state_id)


@dataclass(frozen=True)
class StateFile:
    """What a checkpoint's payload holds: its network's fingerprint (as saved), its markets (least recently used
    first), the journal position it covers, the state dir identity it was written in (None: written before
    identities) and every array it holds by name (the state fields among them)."""

    fingerprint: Any
    markets: list[str]
    journal_seq: int
    state_id: str | None
    data: dict[str, np.ndarray]


def read_state_payload(payload: bytes, where: str, offset: int = 0) -> StateFile:
    """The checkpoint in a verified ``payload`` (the npz :func:`save_pool` seals), from byte ``offset`` on (the
    whole sealed file with ``HEADER_LEN``: read in place, no copy of it); ``where`` names it in errors.

    Raises:
        CheckpointError: no npz, or its format, fingerprint, markets, journal position or identity cannot be read.
        NewerFormatError: a newer version wrote it (checked first: its other entries may mean something else).
    """
    try:
        src = io.BytesIO(payload)
        src.seek(offset)  # (a zip read after bytes that precede it, as a self-extracting archive is)
        with np.load(src, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except Exception as exc:  # a valid checksum over an unreadable npz: written by something else
        raise CheckpointError(f"unreadable state payload: {exc}", where) from None
    fmt = data.get("format")
    check_format(None if fmt is None else (fmt.item() if fmt.ndim == 0 and fmt.dtype.kind in "iu" else str(fmt)),
                 STATE_FORMAT, where, "market state", "move the file away to start every market from rest")
    try:
        saved_fp = json.loads(str(data["fingerprint"]))
        markets = [str(m) for m in data["markets"]]
        seq = int(data["journal_seq"]) if "journal_seq" in data else 0
        saved_id = str(data["state_id"]) if "state_id" in data else None
    except (KeyError, ValueError, TypeError) as exc:  # TypeError: a 0-d markets array
        raise CheckpointError(f"state file lacks or garbles {exc}", where) from None
    if saved_id is not None and not is_state_id(saved_id):  # it would be adopted, and go into every journal header
        raise CheckpointError(f"state file garbles its state id ({quoted(saved_id, 80)})", where)
    return StateFile(saved_fp, markets, seq, saved_id, data)


def missing_field(name: str) -> str:
    """Why a state file without the state field ``name`` cannot be restored."""
    return (f"field {name!r} is missing: the file holds no such state (written by another version of the service, or "
            "not a market state file)")


def fingerprint_rows(fingerprint: Any) -> dict[str, tuple[int, ...]] | None:
    """One market's shape of each state field in the network a fingerprint names (its ``shape``: mossy, granule,
    Purkinje, DCN, classes, ...), or None when the fingerprint names none."""
    shape = fingerprint.get("shape") if isinstance(fingerprint, dict) else None
    if not (isinstance(shape, list) and len(shape) >= 5
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape)):
        return None
    g, p, n, k = shape[1:5]
    return {"enc": (N_ENC_STATE,), "v_gr": (g,), "i_gr": (g,), "golgi": (), "v_pc": (p,), "i_pc": (p,), "v_dcn": (n,),
            "i_dcn": (n,), "v_out": (k,), "i_out": (k,)}


def check_state_rows(sf: StateFile, where: str) -> None:
    """Raise unless every state field of ``sf`` has one row per market, no market appears twice and every state is
    one a market can reach (:func:`check_states`); what can be told without the network's config.

    Raises:
        CheckpointError: naming the field or market.
    """
    n = len(sf.markets)
    for name in STATE_FIELDS:
        arr = sf.data.get(name)
        if arr is None:
            raise CheckpointError(missing_field(name), where)
        if arr.ndim < 1 or arr.shape[0] != n:
            raise CheckpointError(f"field {name!r} has shape {arr.shape}, expected one row per market ({n})", where)
    rows = fingerprint_rows(sf.fingerprint)  # the network the file says it holds: its rows must have that shape
    for name, want in (rows or {}).items():
        arr = sf.data[name]
        if arr.shape[1:] != want:
            raise CheckpointError(f"field {name!r} has shape {arr.shape}, expected {(n, *want)} (the network its "
                                  "fingerprint names)", where)
    if len(set(sf.markets)) != n:
        raise CheckpointError("a market id appears more than once", where)
    for market in sf.markets:  # one no tick can name would hold its slot, and be saved again, for good
        try:
            check_market_id(market)
        except InputError as exc:
            raise CheckpointError(f"market id {quoted(market, 80)} is no market id ({exc.message})", where) from None
    check_states(sf.data, where, sf.markets)


def load_pool(pool: StatePool, path: Path, fingerprint: dict[str, Any], meta: dict[str, Any] | None = None,
              state_id: str | None = None, raw: bytes | None = None) -> int:
    """Restore markets saved by :func:`save_pool` into an empty pool; returns how many.

    ``meta``, when given, receives ``journal_seq`` (0 for files written before journals),
    ``state_id`` (None for files written before state dir identities) and ``not_restored``:
    the markets left out because the file holds more than the pool's ``capacity`` (the
    least recently used, as if evicted).
    ``state_id``: the identity of the state dir being restored; a file that carries
    another one is refused (:class:`ForeignStateDirError`), checked before anything
    else. None accepts any file; :data:`LEGACY_DIR` (a state dir written before
    identities) refuses every file that carries one. A file without one is accepted.
    ``raw``: the file's bytes when the caller has read them already (``path`` then only names it).

    Raises:
        CheckpointError: the file is corrupt, of another network, of the wrong shape, or
            holds states no market can reach (:func:`check_states`). Nothing is loaded in
            that case.
    """
    if raw is None:
        raw = read_sealed(path)
    else:
        check_sealed(raw, str(path))
    sf = read_state_payload(raw, str(path), HEADER_LEN)
    data, markets, seq, saved_id, saved_fp = sf.data, sf.markets, sf.journal_seq, sf.state_id, sf.fingerprint
    if state_id is not None and saved_id is not None and saved_id != state_id:
        this = ("this state dir was written before state dir identities" if state_id == LEGACY_DIR
                else f"this state dir's is {state_id}")
        raise ForeignStateDirError(f"written by another state dir (its state id is {saved_id}; {this})", str(path),
                                   saved_id, state_id or None)
    if saved_fp != fingerprint_json(fingerprint):
        raise ForeignStateError(f"saved for another network ({saved_fp}), not this one ({fingerprint})", str(path),
                                saved_fp if isinstance(saved_fp, dict) else {})
    n = len(markets)
    for name in STATE_FIELDS:
        arr = data.get(name)
        want = (n, *getattr(pool.arrays, name).shape[1:])
        if arr is None:
            raise CheckpointError(missing_field(name), str(path))
        if arr.shape != want:
            raise CheckpointError(f"field {name!r} has shape {arr.shape}, expected {want}", str(path))
    check_state_rows(sf, str(path))
    if n > pool.capacity:
        markets = markets[n - pool.capacity:]  # keep the most recently used
    keep = len(markets)
    for j, market in enumerate(markets):
        row = n - keep + j
        slot = pool.table.acquire(market)
        pool.arrays.write_slot(slot, {name: data[name][row] for name in STATE_FIELDS})
    if meta is not None:
        meta["journal_seq"] = seq
        meta["state_id"] = saved_id
        meta["not_restored"] = n - keep
    return keep


def quarantine(path: Path, reason: str = "corrupt") -> Path:
    """Move ``path`` aside to ``<name>.<reason>-<UTC time>`` (never over an existing file); returns the new path.

    Raises:
        StorageError: the file could not be renamed (read-only state dir).
    """
    path = Path(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.{reason}-{stamp}")
    k = 1
    while target.exists():
        target = path.with_name(f"{path.name}.{reason}-{stamp}-{k}")
        k += 1
    try:
        retrying(os.rename, path, target)
        fsync_dir(path.parent)
    except OSError as exc:
        raise StorageError.from_os_error("cannot move aside", path, exc) from None
    return target


def check_writable(state_dir: Path) -> None:
    """Create ``state_dir`` if needed and prove a file can be written, fsynced and removed in it.

    Raises:
        StorageError: naming the directory and the operating system's reason (read-only,
            full, not a directory, permissions).
    """
    state_dir = Path(state_dir)
    probe = state_dir / f".write-test-{os.getpid()}"
    try:
        if state_dir.exists() and not state_dir.is_dir():  # mkdir would say "File exists"
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(state_dir))
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"cerebellar-norse write test\n" * 148)  # 4 KiB: a full disk shows here
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(probe)
        raise StorageError.from_os_error("state dir is not writable:", state_dir, exc) from None
