"""Recording of served ticks (``[debug] record_requests``) for replay and verification.

Format (version 2; version 1 files are still read)
    ``<state_dir>/recordings/ticks-<UTC date>-<NNNN>.csv``: a CSV file (Python's
    :mod:`csv`, ``QUOTE_MINIMAL``, ``\\n`` line ends, ASCII) whose header is
    :data:`COLUMNS` and whose every following line is one applied tick, in the order
    the engine applied them::

        timestamp,market_id,price,volume,p_down,p_flat,p_up,model_version,request_id,batch,seq,start
        1640995200000,"a,b",100.0,1000.0,0.25,0.5,0.25,seed-42,r-1,7,0,state
        1640995200001,"x""y",100.5,2.0,0.2,0.5,0.3,seed-42,r-2,7,1,rest
        1640995200250,"a,b",100.25,3.0,0.3,0.4,0.3,seed-42,r-3,8,0,

    Market ids holding ``,`` or ``"`` are quoted with ``"`` doubled, so every legal id
    (1–64 printable ASCII characters) reads back unchanged; prices, volumes and
    probabilities are written as Python's shortest exact ``repr``. ``p_down``,
    ``p_flat``, ``p_up`` are the probabilities served for the tick and
    ``request_id`` the caller's request id; they are empty when the caller did not
    hand them over. ``batch`` numbers the engine's backend steps (rising within a
    file) and ``seq`` is the tick's position in its step. ``start`` says where the
    market's state stood just before the tick, when the tick is the market's first in
    the file or the first after the service dropped the market's state (eviction,
    reset): ``rest`` (the market had no state: it started from rest) or ``state`` (its
    full state, captured before the step, is in the file's companion, keyed by this
    line); empty otherwise, and empty for every tick handed over without
    :meth:`TickRecorder.before_step`. Because the first four columns are those of a
    training CSV, a recording can also be trained or evaluated on. Free-text fields
    (model version, request id) have characters outside printable ASCII replaced by
    ``?``, so a record is always exactly one line. Version 1 files (header
    :data:`COLUMNS_V1`, the first nine columns) have no starting states.

Starting states: ``ticks-<UTC date>-<NNNN>.states``
    The companion of a recording file, created with its first ``state`` record:
    the line :data:`STATES_MAGIC`, then per captured market a JSON header line
    (ASCII, every non-ASCII or control character escaped, so any market id fits)::

        {"line":2,"market_id":"a,b","fields":[{"name":"enc","dtype":"<f8","shape":[8]},...],
         "nbytes":5184,"sha256":"<hex of the payload>"}

    followed by ``nbytes`` bytes of payload (the fields' raw little-endian C-order
    arrays, in the header's order) and ``\\n``. ``line`` is the recording line whose
    ``start`` is ``state``. The payload digest guards each record while the file is
    open; a closed companion also gets a ``.sha256`` sidecar.

Off the hot path
    :meth:`TickRecorder.record` only appends the batch to a bounded in-memory buffer
    (``capacity`` ticks) under a short lock; a background thread formats and writes
    the buffer every ``flush_interval_s`` or as soon as a quarter of it is used, and
    flushes the files to the operating system after each write (the companion
    first). When the buffer is full, ticks are dropped and counted
    (:attr:`TickRecorder.dropped`, logged by the writer thread), and the next step
    starts a new file, so a file with a gap is never continued; a request never
    waits for the disk. :meth:`TickRecorder.before_step`, called by the engine just
    before a backend step, copies a market's slot (a few KB) only for the market's
    first tick in the file; for every other tick it costs a dictionary lookup.

Rotation and checksums
    Files are started at step boundaries chosen on the engine's side, because the
    starting states must be captured before the step: a new file begins at the first
    step after the current one reached ``max_bytes`` (64 MiB, CSV and companion
    together; a file may exceed it by the ticks already handed over), after the UTC
    date changed, after ticks were dropped or a write failed, and when the recorder
    closes. A closed file is fsynced and gets a ``<file>.sha256`` sidecar
    (``sha256sum`` format, written atomically), so ``sha256sum -c`` works too; so
    does its companion. The open file is held under an exclusive ``flock``; files
    another recorder left open (a crash) are closed with their checksums when the
    next recorder opens its first file.

Verification
    :func:`verify_recordings` (``cerebellar-norse --verify-data DIR``) checks each
    closed file (and companion) against its checksum and line by line (record by
    record), and the open file (locked by a writer, or the newest of its directory
    without a checksum: left by a crash) line by line. A missing or mismatching
    checksum, a malformed line, a malformed or mismatching state record and a
    ``state`` start without its record are problems naming the file (and line); a
    last line or state record without its end (cut by a crash) is only a warning.
    :func:`read_recording` (``replay``) applies the same checks and refuses a
    malformed recording with ``file:line: reason``.
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

import numpy as np

from ..errors import DataError
from ..storage import atomic_write_bytes, sha256_file
from ..ticks import MARKET_ID_MAX, TS_MAX_MS, TS_MIN_MS, Tick

if TYPE_CHECKING:
    from .pool import StatePool

log = logging.getLogger("cerebellar_norse.engine.recorder")

COLUMNS_V1 = ("timestamp", "market_id", "price", "volume", "p_down", "p_flat", "p_up", "model_version", "request_id")
COLUMNS = (*COLUMNS_V1, "batch", "seq", "start")
HEADER_V1 = ",".join(COLUMNS_V1) + "\n"
HEADER = ",".join(COLUMNS) + "\n"
START_REST = "rest"  # the market had no state before this tick
START_STATE = "state"  # the market's state before this tick is in the companion file
CHECKSUM_SUFFIX = ".sha256"
STATES_SUFFIX = ".states"
STATES_MAGIC = b"cerebellar-norse recording states v1\n"
MAX_BYTES = 64 << 20  # a new file is started at the first step after the current one reached this
CAPACITY = 100_000  # ticks held in memory waiting for the writer thread
FLUSH_INTERVAL_S = 0.1
DROP_LOG_INTERVAL_S = 10.0
MAX_PROBLEMS_PER_FILE = 20
_DAY_S = 86_400

FILE_RE = re.compile(r"ticks-(\d{8})-(\d{4,})\.csv")
STATES_RE = re.compile(r"ticks-(\d{8})-(\d{4,})\.states")
LEGACY_RE = re.compile(r"ticks-\d{8}\.csv")  # one file per day, written before ids were escaped
_SIDECAR_RE = re.compile(r"([0-9a-f]{64})  (\S.*)\n")
_NON_PRINTABLE = re.compile(r"[^ -~]")
_DIGITS = re.compile(r"\d{1,18}")


def checksum_path(path: Path) -> Path:
    """The ``<file>.sha256`` sidecar of a recording (or of its companion)."""
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def states_path(path: Path) -> Path:
    """The companion ``ticks-…-NNNN.states`` of a recording ``ticks-…-NNNN.csv`` (starting states)."""
    name = path.name[:-len(".csv")] if path.name.endswith(".csv") else path.name
    return path.with_name(name + STATES_SUFFIX)


def _printable(text: str) -> str:
    return _NON_PRINTABLE.sub("?", text)


class _Line:
    """A file-like sink whose ``write`` returns its argument: ``csv.writer(_Line()).writerow(row)`` is the line."""

    def write(self, text: str) -> str:
        return text


def _file_sort_key(path: Path) -> tuple[str, int]:
    m = FILE_RE.fullmatch(path.name)
    return (m.group(1), int(m.group(2))) if m else ("", -1)


def _in_use(path: Path) -> bool:
    """True while a recorder holds the file open (an exclusive ``flock``)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError:
        return False
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False


def _write_checksum(path: Path) -> str:
    digest = sha256_file(path)
    atomic_write_bytes(checksum_path(path), f"{digest}  {path.name}\n".encode("ascii"))
    return digest


def state_record(line: int, market_id: str, state: dict[str, np.ndarray]) -> bytes:
    """One record of a companion file: JSON header line, raw payload, ``\\n`` (see the module docstring)."""
    fields, parts = [], []
    for name, arr in state.items():
        a = np.asarray(arr)
        a = np.require(a.astype(a.dtype.newbyteorder("<"), copy=False), requirements="C")  # keeps 0-d arrays 0-d
        fields.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape)})
        parts.append(a.tobytes())
    payload = b"".join(parts)
    head = json.dumps({"line": line, "market_id": market_id, "fields": fields, "nbytes": len(payload),
                       "sha256": hashlib.sha256(payload).hexdigest()}, ensure_ascii=True, separators=(",", ":"))
    return head.encode("ascii") + b"\n" + payload + b"\n"


class _Batch(NamedTuple):
    ticks: Sequence[Tick]
    probs: np.ndarray | None
    model_version: str
    request_ids: Sequence[str | None] | None
    segment: int  # the file the batch belongs to (see TickRecorder._segment)
    day: str  # UTC date of that file (YYYYMMDD)
    number: int  # the batch's number (the ``batch`` column)
    starts: dict[int, dict[str, np.ndarray] | None] | None  # position -> captured state (None: from rest)


class TickRecorder:
    """Writes applied ticks (and what was served for them) to rotating, checksummed CSV files.

    Args:
        directory: where the files go (``<state_dir>/recordings``).
        capacity: ticks buffered in memory for the writer thread; beyond it ticks are dropped.
        max_bytes: size (CSV and companion) after which the next step starts a new file.
        flush_interval_s: longest time a tick waits in memory before it is written.
        clock: seconds since the epoch (UTC date of the file names).

    Attributes:
        dropped: ticks not recorded (buffer full, recorder closed, or a failed write).
        written: ticks written to files.
        write_errors: failed writes (each logged).
        states_captured: market slots copied by :meth:`before_step` (one per market and file).
    """

    def __init__(self, directory: Path, capacity: int = CAPACITY, max_bytes: int = MAX_BYTES,
                 flush_interval_s: float = FLUSH_INTERVAL_S, clock: Callable[[], float] = time.time) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.directory = Path(directory)
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.flush_interval_s = flush_interval_s
        self._clock = clock
        self.dropped = 0
        self.written = 0
        self.write_errors = 0
        self.states_captured = 0
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._pending: list[_Batch] = []
        self._pending_n = 0
        self._submitted = 0  # batches handed over (under _lock)
        self._handled = 0  # batches the writer has finished with (under _lock)
        self._closing = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        # segments (files), decided on the caller's side at step boundaries (under _lock)
        self._segment = 0  # current segment; the writer opens a new file when a batch's segment changes
        self._seg_day = ""
        self._day_end = -math.inf  # the current segment ends at this time (s): the next UTC midnight
        self._new_segment = False  # asked for by the writer (size, failure, idle at midnight) or by a drop
        self._in_flight = False  # before_step ran, record not yet: the writer must not close the segment's file
        self._batches = 0
        # caller side (the engine's loop thread only)
        self._seen: set[str] = set()  # markets whose start is recorded in the current segment
        self._staged: tuple[Sequence[Tick], int, str, dict[int, dict[str, np.ndarray] | None]] | None = None
        # writer-thread state
        self._fmt = csv.writer(_Line(), lineterminator="\n")
        self._fh: BinaryIO | None = None
        self._sfh: BinaryIO | None = None  # the companion (starting states), opened with its first record
        self._path: Path | None = None
        self._file_segment = 0
        self._day = ""
        self._size = 0
        self._records = 0
        self._recovered = False
        self._drops_logged = 0
        self._drop_log_at = 0.0
        self._error_log_at = -math.inf

    # -- caller side (the engine's loop thread): never blocks on I/O ---------------

    def _begin_segment(self) -> None:
        """Start a new file at the next batch (under _lock): markets' starts are recorded afresh."""
        now = self._clock()
        self._segment += 1
        self._seg_day = time.strftime("%Y%m%d", time.gmtime(now))
        self._day_end = (math.floor(now / _DAY_S) + 1) * _DAY_S
        self._new_segment = False
        self._seen = set()

    def before_step(self, pool: StatePool, ticks: Sequence[Tick]) -> None:
        """Capture where each market of the next step starts; call just before the step applies ``ticks``.

        For a market's first tick in the current file, a copy of its slot
        (``pool.arrays.read_slot``, a few KB) or, when it holds no slot, the flag
        "from rest"; the flag also for a market that lost its state since (evicted or
        reset). The captures are handed over by the :meth:`record` call of the same
        step; a step that fails (no :meth:`record`) has its captures taken again.
        Costs one dictionary lookup per tick besides the copies.
        """
        with self._lock:
            if self._closing:
                self._staged = None
                return
            if self._new_segment or self._clock() >= self._day_end:
                self._begin_segment()
            elif self._staged is not None:  # the last step failed: its markets' starts are captured again
                staged_ticks, _, _, lost = self._staged
                for j in lost:
                    self._seen.discard(staged_ticks[j].market_id)
            self._in_flight = True
            segment, day = self._segment, self._seg_day
        seen = self._seen
        get = pool.table.get
        starts: dict[int, dict[str, np.ndarray] | None] = {}
        fresh: set[str] | None = None  # markets starting from rest in this step
        for j, t in enumerate(ticks):
            m = t.market_id
            slot = get(m)
            if slot is None:
                if fresh is None:
                    fresh = set()
                elif m in fresh:
                    continue
                fresh.add(m)
                seen.add(m)
                starts[j] = None
            elif m not in seen:
                seen.add(m)
                starts[j] = pool.arrays.read_slot(slot)
                self.states_captured += 1
        self._staged = (ticks, segment, day, starts)

    def record(self, ticks: Sequence[Tick], probs: np.ndarray | None = None, model_version: str = "",
               request_ids: Sequence[str | None] | None = None) -> int:
        """Hand over applied ticks; returns how many were taken (the rest are counted in :attr:`dropped`).

        ``probs`` (B, 3) are the probabilities served for the ticks,
        ``request_ids`` the callers' request ids (one per tick); either may be None
        (empty fields). After :meth:`before_step` this must be the same step's ticks.
        """
        n = len(ticks)
        with self._lock:
            staged, self._staged = self._staged, None
            self._in_flight = False
            if staged is not None and len(staged[0]) == n and not self._closing:
                _, segment, day, starts = staged
            else:  # handed over without before_step: starts not known
                if staged is not None:  # captured for other ticks: taken again at the next step
                    for j in staged[3]:
                        self._seen.discard(staged[0][j].market_id)
                if self._new_segment or self._clock() >= self._day_end:
                    self._begin_segment()
                segment, day, starts = self._segment, self._seg_day, None
            room = 0 if self._closing else self.capacity - self._pending_n
            if n > room:
                self.dropped += n - max(room, 0)
                self._new_segment = True  # a file with a gap is not continued
                if room <= 0:
                    return 0
                n = room
                ticks, probs = ticks[:n], None if probs is None else probs[:n]
                request_ids = None if request_ids is None else request_ids[:n]
                if starts:
                    starts = {j: s for j, s in starts.items() if j < n}
            if n == 0:
                return 0
            # copies: the caller may reuse its buffers once this returns
            self._pending.append(_Batch(tuple(ticks), None if probs is None else probs.copy(), model_version,
                                        None if request_ids is None else tuple(request_ids), segment, day,
                                        self._batches, starts))
            self._batches += 1
            self._pending_n += n
            self._submitted += 1
            if self._thread is None:
                self._start()
            wake = self._pending_n * 4 >= self.capacity
        if wake:
            self._wake.set()
        return n

    def write(self, ticks: Sequence[Tick]) -> None:
        """Hand over ticks without results (see :meth:`record`)."""
        self.record(ticks)

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until every tick handed over so far is written (flushed to the OS); False on timeout.

        On a closing recorder, wait until its last file is closed and checksummed.
        """
        with self._lock:
            target = self._submitted
            if self._thread is None:
                return True
            self._wake.set()
            return self._done.wait_for(lambda: self._stopped or (self._handled >= target and not self._closing), timeout)

    def close(self, wait: bool = True) -> None:
        """Write what is buffered, close and checksum the current file; later ticks are dropped.

        With ``wait=False`` the writer thread finishes on its own (at the latest when the
        interpreter exits, which waits for it).
        """
        with self._lock:
            self._closing = True
            thread = self._thread
        if thread is not None:
            self._wake.set()
            if not wait:
                return
            thread.join()
        atexit.unregister(self._close_at_exit)

    def _close_at_exit(self) -> None:
        self.close()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cerebellar-norse-recorder", daemon=True)
        self._thread.start()
        atexit.register(self._close_at_exit)

    # -- writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(self.flush_interval_s)
                self._wake.clear()
                with self._lock:
                    batches, self._pending, self._pending_n = self._pending, [], 0
                    closing = self._closing
                if batches:
                    try:
                        self._write_batches(batches)
                    except Exception:  # the writer must outlive any bad batch
                        log.exception("recording failed; %d ticks dropped", sum(len(b.ticks) for b in batches))
                        with self._lock:
                            self.dropped += sum(len(b.ticks) for b in batches)
                            self._new_segment = True
                with self._lock:
                    self._handled += len(batches)
                    self._done.notify_all()
                    done = closing and not self._pending
                self._log_drops()
                if done:
                    break
                if not batches and self._fh is not None and self._today() != self._day:
                    with self._lock:  # no step may be between before_step and record for this file
                        idle = not self._in_flight and not self._pending
                        if idle:
                            self._new_segment = True
                    if idle:
                        self._seal()  # yesterday's file gets its checksum without waiting for the next tick
        finally:
            try:
                self._seal()
                self._log_drops(final=True)
            except Exception:
                log.exception("recording not closed cleanly")
            with self._lock:
                self._stopped = True
                self._done.notify_all()

    def _log_drops(self, final: bool = False) -> None:
        dropped = self.dropped
        now = time.monotonic()
        if dropped > self._drops_logged and (final or now - self._drop_log_at >= DROP_LOG_INTERVAL_S):
            log.warning("recording dropped %d ticks so far (buffer of %d ticks full, or recorder closed)",
                        dropped, self.capacity)
            self._drops_logged, self._drop_log_at = dropped, now

    def _format(self, batch: _Batch, first_line: int) -> tuple[list[bytes], list[bytes]]:
        """The batch's CSV lines (the first at line ``first_line``) and its companion records."""
        probs = batch.probs.tolist() if batch.probs is not None else None
        version = _printable(batch.model_version)
        rids = batch.request_ids
        starts = batch.starts or {}
        fmt = self._fmt
        number = batch.number
        lines: list[bytes] = []
        states: list[bytes] = []
        for j, t in enumerate(batch.ticks):
            p = probs[j] if probs is not None else (None, None, None)
            rid = rids[j] if rids is not None else None
            start = ""
            if j in starts:
                state = starts[j]
                if state is None:
                    start = START_REST
                else:
                    start = START_STATE
                    states.append(state_record(first_line + j, t.market_id, state))
            line = fmt.writerow((t.timestamp, t.market_id, float(t.price), float(t.volume), *p, version,
                                 "" if rid is None else _printable(rid), number, j, start))
            lines.append(line.encode("utf-8", "backslashreplace"))
        return lines, states

    def _today(self) -> str:
        return time.strftime("%Y%m%d", time.gmtime(self._clock()))

    def _ask_new_segment(self) -> None:
        with self._lock:
            self._new_segment = True

    def _write_batches(self, batches: list[_Batch]) -> None:
        lines: list[bytes] = []
        states: list[bytes] = []
        total = sum(len(b.ticks) for b in batches)
        done = 0  # ticks written or counted as dropped
        try:
            for b in batches:
                if b.segment != self._file_segment:
                    done += self._emit(lines, states)
                    lines, states = [], []
                    self._seal()
                    self._file_segment = b.segment
                    self._open(b.day)
                elif self._fh is None:  # this file failed or was closed: a later file starts afresh
                    with self._lock:
                        self.dropped += len(b.ticks)
                        self._new_segment = True
                    done += len(b.ticks)
                    continue
                more, st = self._format(b, self._records + len(lines) + 2)
                lines += more
                states += st
            done += self._emit(lines, states)
        except OSError as exc:
            self._fail(exc, total - done)

    def _emit(self, lines: list[bytes], states: list[bytes]) -> int:
        """Write a file's lines (after their starting states, so no line names a state not yet written)."""
        if not lines:
            return 0
        assert self._fh is not None and self._path is not None
        if states:
            if self._sfh is None:
                self._sfh = open(states_path(self._path), "xb")  # noqa: SIM115 (kept open across writes)
                self._sfh.write(STATES_MAGIC)
                self._size += len(STATES_MAGIC)
            data = b"".join(states)
            self._sfh.write(data)
            self._sfh.flush()
            self._size += len(data)
        data = b"".join(lines)
        self._fh.write(data)
        self._fh.flush()
        self._size += len(data)
        self._records += len(lines)
        self.written += len(lines)
        if self._size >= self.max_bytes:
            self._ask_new_segment()
        return len(lines)

    def _fail(self, exc: OSError, n: int) -> None:
        self.write_errors += 1
        now = time.monotonic()
        if now - self._error_log_at >= DROP_LOG_INTERVAL_S:  # a full or read-only disk fails every write
            self._error_log_at = now
            log.error("recording write failed (%s): %s; %d ticks dropped (%d failed writes so far)",
                      self._path or self.directory, exc, n, self.write_errors)
        with self._lock:
            self.dropped += n
            self._new_segment = True
        fh, sfh, path = self._fh, self._sfh, self._path
        self._fh = self._sfh = self._path = None
        for f in (sfh, fh):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        if path is not None:
            try:
                if sfh is not None:
                    _write_checksum(states_path(path))
                _write_checksum(path)
            except OSError as exc2:
                log.error("recording %s not checksummed: %s", path, exc2)

    def _open(self, day: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self._recovered:
            self._recovered = True
            seal_leftovers(self.directory)
        seq = 1 + max((int(m.group(1)) for p in self.directory.iterdir()
                       if (m := re.fullmatch(rf"ticks-{day}-(\d+)\.(?:csv|states)(?:{re.escape(CHECKSUM_SUFFIX)})?",
                                             p.name))),
                      default=0)
        while True:
            path = self.directory / f"ticks-{day}-{seq:04d}.csv"
            try:
                fh = open(path, "xb")  # noqa: SIM115 (kept open across writes)
            except FileExistsError:
                seq += 1
                continue
            if states_path(path).exists():  # a companion left without its recording: never appended to
                fh.close()
                path.unlink()
                seq += 1
                continue
            break
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        self._fh, self._path, self._day = fh, path, day
        self._size = self._records = 0
        header = HEADER.encode("ascii")
        fh.write(header)
        fh.flush()
        self._size = len(header)

    def _seal(self) -> None:
        """fsync and close the current file and its companion, then write their checksums (holding the lock)."""
        fh, sfh, path = self._fh, self._sfh, self._path
        if fh is None or path is None:
            return
        self._fh = self._sfh = self._path = None
        try:
            if sfh is not None:
                try:
                    sfh.flush()
                    os.fsync(sfh.fileno())
                finally:
                    sfh.close()
                _write_checksum(states_path(path))
            fh.flush()
            os.fsync(fh.fileno())
            _write_checksum(path)
        except OSError as exc:
            self.write_errors += 1
            log.error("recording %s not closed cleanly: %s", path, exc)
        finally:
            with contextlib.suppress(OSError):
                fh.close()


def seal_leftovers(directory: Path) -> list[Path]:
    """Checksum recordings in ``directory`` (and their companions) that no recorder holds and that have no checksum."""
    sealed = []
    for path in sorted(directory.glob("ticks-*.csv"), key=_file_sort_key):
        if not FILE_RE.fullmatch(path.name) or checksum_path(path).exists():
            continue
        try:
            with open(path, "rb") as fh:
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # another recorder's open file
                torn = path.stat().st_size > 0 and _last_byte(fh) != b"\n"
                companion = states_path(path)
                if companion.exists() and not checksum_path(companion).exists():
                    _write_checksum(companion)
                _write_checksum(path)
        except OSError as exc:
            log.error("recording %s left open by a previous run could not be closed: %s", path, exc)
            continue
        log.warning("closed recording %s left open by a previous run%s", path,
                    " (its last line was cut: ignored by replay)" if torn else "")
        sealed.append(path)
    return sealed


def _last_byte(fh: BinaryIO) -> bytes:
    fh.seek(-1, os.SEEK_END)
    return fh.read(1)


# -- reading and verification -------------------------------------------------------------


@dataclass(frozen=True)
class RecordedTick:
    """One record: the tick, what was served for it (None/"" when not recorded) and its line in the file.

    ``batch`` and ``seq`` (the step and the position in it) and ``start`` (``"rest"``,
    ``"state"`` or ``""``) are None in version 1 files.
    """

    tick: Tick
    probabilities: tuple[float, float, float] | None
    model_version: str
    request_id: str
    line: int
    batch: int | None = None
    seq: int | None = None
    start: str | None = None


@dataclass(frozen=True)
class StartState:
    """A market's full state just before the tick on ``line`` (``read_slot`` arrays)."""

    market_id: str
    line: int
    state: dict[str, np.ndarray]


@dataclass
class Scan:
    """What reading a recording found."""

    path: Path
    records: list[RecordedTick] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "file:line: reason"
    warnings: list[str] = field(default_factory=list)
    sha256: str = ""
    checksum: str | None = None  # "ok", "mismatch", "missing", or a problem with the checksum file
    version: int = 0  # format version from the header (1 or 2); 0 when unread
    states: dict[int, StartState] = field(default_factory=dict)  # by line of the tick they precede
    states_checksum: str | None = None  # as ``checksum``, for the companion; None when there is none

    @property
    def ticks(self) -> list[Tick]:
        """The recorded ticks in file (= applied) order."""
        return [r.tick for r in self.records]


def is_recording(path: Path) -> bool:
    """True for a file named like a recording or starting with its header (else it is a plain tick CSV)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(max(len(HEADER), len(HEADER_V1)))
    except OSError:
        return False
    return (head.startswith(HEADER.encode("ascii")) or head.startswith(HEADER_V1.encode("ascii"))
            or FILE_RE.fullmatch(Path(path).name) is not None)


def _float(text: str, name: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{name} {text!r} is not finite")
    return x


def _parse(fields: list[str], version: int, line: int) -> RecordedTick:
    columns = COLUMNS if version == 2 else COLUMNS_V1
    if len(fields) != len(columns):
        raise ValueError(f"expected {len(columns)} fields, got {len(fields)}")
    ts_text, market, price_text, volume_text, pd, pf, pu, version_text, rid = fields[:9]
    if not ts_text.isdigit():
        raise ValueError(f"timestamp {ts_text!r} is not an integer (ms since epoch)")
    ts = int(ts_text)
    if not TS_MIN_MS <= ts < TS_MAX_MS:
        raise ValueError(f"timestamp {ts} is not between 2000-01-01 and 2100-01-01 in ms")
    if not 1 <= len(market) <= MARKET_ID_MAX or _NON_PRINTABLE.search(market):
        raise ValueError(f"market_id {market!r} is not 1-{MARKET_ID_MAX} printable ASCII characters")
    price = _float(price_text, "price")
    if not price > 0:
        raise ValueError(f"price {price_text!r} is not > 0")
    volume = _float(volume_text, "volume")
    if not volume >= 0:
        raise ValueError(f"volume {volume_text!r} is negative")
    probs: tuple[float, float, float] | None = None
    if pd or pf or pu:
        ps = tuple(_float(t, n) for t, n in ((pd, "p_down"), (pf, "p_flat"), (pu, "p_up")))
        if not all(0.0 <= p <= 1.0 for p in ps):
            raise ValueError(f"probabilities {pd}, {pf}, {pu} are not in [0, 1]")
        probs = (ps[0], ps[1], ps[2])
    if _NON_PRINTABLE.search(version_text) or _NON_PRINTABLE.search(rid):
        raise ValueError("model_version or request_id holds characters other than printable ASCII")
    tick = Tick(price, volume, ts, market)
    if version != 2:
        return RecordedTick(tick, probs, version_text, rid, line)
    batch_text, seq_text, start = fields[9:]
    if not _DIGITS.fullmatch(batch_text) or not _DIGITS.fullmatch(seq_text):
        raise ValueError(f"batch {batch_text!r} and seq {seq_text!r} must be integers >= 0")
    if start not in ("", START_REST, START_STATE):
        raise ValueError(f"start {start!r} is not empty, {START_REST!r} or {START_STATE!r}")
    return RecordedTick(tick, probs, version_text, rid, line, int(batch_text), int(seq_text), start)


def _check_sidecar(path: Path, digest: str) -> tuple[str, str | None]:
    """(``ok``/``mismatch``/``missing``/a problem with the sidecar, the mismatch problem or None)."""
    side = checksum_path(path)
    if not side.exists():
        return "missing", None
    try:
        text = side.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        return f"{side}: unreadable checksum file ({exc})", None
    m = _SIDECAR_RE.fullmatch(text)
    if m is None:
        return f"{side}: not a sha256sum line for {path.name}", None
    if m.group(2) != path.name:
        return f"{side}: names {m.group(2)!r}, not {path.name}", None
    if m.group(1) != digest:
        return "mismatch", (f"{path}: checksum mismatch (expected {m.group(1)[:16]}…, file has {digest[:16]}…): "
                            "the file was truncated or edited after it was closed")
    return "ok", None


def _state_header(text: bytes) -> tuple[int, str, list[tuple[str, np.dtype[Any], tuple[int, ...]]], int, str]:
    """A companion record's JSON header, checked: (line, market, fields, nbytes, sha256); ValueError."""
    try:
        head = json.loads(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("record header is not a JSON line") from None
    if not isinstance(head, dict) or set(head) != {"line", "market_id", "fields", "nbytes", "sha256"}:
        raise ValueError("record header must hold exactly line, market_id, fields, nbytes, sha256")
    line, market, fields, nbytes, digest = (head[k] for k in ("line", "market_id", "fields", "nbytes", "sha256"))
    if type(line) is not int or line < 2 or type(nbytes) is not int or nbytes < 0:
        raise ValueError(f"line {line!r} or nbytes {nbytes!r} is not a valid integer")
    if not isinstance(market, str) or not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError("market_id must be a string and sha256 64 hex digits")
    if not isinstance(fields, list) or not fields:
        raise ValueError("fields must be a non-empty list")
    out: list[tuple[str, np.dtype[Any], tuple[int, ...]]] = []
    total = 0
    for f in fields:
        if not (isinstance(f, dict) and set(f) == {"name", "dtype", "shape"} and isinstance(f["name"], str)
                and isinstance(f["dtype"], str) and re.fullmatch(r"<[fiu][1248]|\|[iu]1", f["dtype"])
                and isinstance(f["shape"], list) and all(type(d) is int and d >= 0 for d in f["shape"])):
            raise ValueError(f"field {f!r} is not {{name, dtype (little-endian number), shape}}")
        dt = np.dtype(f["dtype"])
        shape = tuple(f["shape"])
        out.append((f["name"], dt, shape))
        total += dt.itemsize * math.prod(shape)
    if total != nbytes:
        raise ValueError(f"fields hold {total} bytes, nbytes says {nbytes}")
    return line, market, out, nbytes, digest


def scan_states(path: Path, check_sum: bool = True) -> tuple[dict[int, StartState], list[str], list[str], str | None]:
    """Read a companion (starting states): (states by line, problems, warnings, checksum status).

    Problems name the file and the byte offset of the bad record; a last record cut
    short (a crash while it was written) is a warning and is not returned.
    """
    states: dict[int, StartState] = {}
    problems: list[str] = []
    warnings: list[str] = []
    try:
        data = path.read_bytes()
    except OSError as exc:
        return states, [f"{path}: cannot read: {exc.strerror}"], warnings, None
    status: str | None = None
    if check_sum:
        status, problem = _check_sidecar(path, hashlib.sha256(data).hexdigest())
        if problem is not None:
            problems.append(problem)
        elif status not in ("ok", "missing"):
            problems.append(status)
    if not data.startswith(STATES_MAGIC):
        problems.append(f"{path}: not a starting-state file (expected first line {STATES_MAGIC.decode().strip()!r})")
        return states, problems, warnings, status
    pos = len(STATES_MAGIC)
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            warnings.append(f"{path}: last record (byte {pos}) is incomplete (cut by a crash while it was written); ignored")
            break
        record_at = pos
        try:
            line, market, fields, nbytes, digest = _state_header(data[pos:end])
        except ValueError as exc:
            problems.append(f"{path}: record at byte {pos}: {exc}")
            break  # the next record cannot be found
        body = end + 1
        if body + nbytes + 1 > len(data):
            warnings.append(f"{path}: last record (byte {pos}, market {market!r}) is incomplete (cut by a crash while "
                            "it was written); ignored")
            break
        payload = data[body:body + nbytes]
        if data[body + nbytes:body + nbytes + 1] != b"\n":
            problems.append(f"{path}: record at byte {pos} (market {market!r}): payload not followed by a line end")
            break
        pos = body + nbytes + 1
        if hashlib.sha256(payload).hexdigest() != digest:
            problems.append(f"{path}: record at byte {record_at} (market {market!r}, line {line}): payload does not "
                            "match its sha256 (the file was edited or damaged)")
            continue
        if line in states:
            problems.append(f"{path}: two states for line {line}")
            continue
        arrays: dict[str, np.ndarray] = {}
        offset = 0
        for name, dt, shape in fields:
            n = dt.itemsize * math.prod(shape)
            arrays[name] = np.frombuffer(payload, dt, count=math.prod(shape), offset=offset).reshape(shape).copy()
            offset += n
        states[line] = StartState(market, line, arrays)
        if len(problems) >= MAX_PROBLEMS_PER_FILE:
            break
    return states, problems, warnings, status


def scan_recording(path: Path, check_sum: bool = True) -> Scan:
    """Read a recording line by line (and against its checksum file when present and ``check_sum``), with its states.

    Malformed lines, time going backwards within a market, a checksum mismatch, and
    (version 2) a ``state`` start without its record in the companion or a companion
    record without its ``state`` line are problems; a last line without its line end
    (a crash cut it) is a warning and is not returned.
    """
    path = Path(path)
    scan = Scan(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        scan.problems.append(f"{path}: cannot read: {exc.strerror}")
        return scan
    scan.sha256 = hashlib.sha256(data).hexdigest()
    if check_sum:
        scan.checksum, problem = _check_sidecar(path, scan.sha256)
        if problem is not None:
            scan.problems.append(problem.replace("the file was", "the recording was"))
        elif scan.checksum not in ("ok", "missing"):
            scan.problems.append(scan.checksum)
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a line end
    if tail:
        scan.warnings.append(f"{path}:{len(lines) + 1}: last line is incomplete (cut by a crash while it was written); ignored")
    if not lines:
        if not tail:
            scan.warnings.append(f"{path}: empty (created just before a crash?)")
        return scan
    header = lines[0] + b"\n"
    if header == HEADER.encode("ascii"):
        scan.version = 2
    elif header == HEADER_V1.encode("ascii"):
        scan.version = 1
    else:
        scan.problems.append(f"{path}:1: not a recording header (expected {HEADER.strip()!r})")
        return scan
    last_ts: dict[str, tuple[int, int]] = {}
    for no, raw in enumerate(lines[1:], start=2):
        try:
            text = raw.decode("ascii")
            fields = next(csv.reader([text], strict=True))
            rec = _parse(fields, scan.version, no)
            tick = rec.tick
            prev = last_ts.get(tick.market_id)
            if prev is not None and tick.timestamp < prev[0]:
                raise ValueError(f"market {tick.market_id!r} goes back in time: {tick.timestamp} after {prev[0]} "
                                 f"(line {prev[1]})")
        except (UnicodeDecodeError, csv.Error, ValueError) as exc:
            reason = "not ASCII" if isinstance(exc, UnicodeDecodeError) else str(exc)
            scan.problems.append(f"{path}:{no}: {reason}")
            if len(scan.problems) >= MAX_PROBLEMS_PER_FILE:
                scan.problems.append(f"{path}: further lines not checked")
                break
            continue
        last_ts[tick.market_id] = (tick.timestamp, no)
        scan.records.append(rec)
    if scan.version == 2:
        _scan_companion(scan, check_sum, last_line=len(lines))
    return scan


def _scan_companion(scan: Scan, check_sum: bool, last_line: int) -> None:
    """Read the companion of a version 2 recording and match its records with the ``state`` starts."""
    path, companion = scan.path, states_path(scan.path)
    wanted = {r.line: r.tick.market_id for r in scan.records if r.start == START_STATE}
    if not companion.exists():
        if wanted:
            line = min(wanted)
            scan.problems.append(f"{path}:{line}: the starting state of market {wanted[line]!r} is in {companion.name}, "
                                 "which is missing" + (f" ({len(wanted)} states)" if len(wanted) > 1 else ""))
        return
    # the companion is checked against its sidecar whenever the recording is (a closed recording's companion must have one)
    states, problems, warnings, status = scan_states(companion, check_sum)
    scan.states_checksum = status
    if check_sum and scan.checksum == "ok" and status == "missing":
        problems.append(f"{companion}: checksum file {checksum_path(companion).name} missing (the recording is closed)")
    scan.problems += problems
    scan.warnings += warnings
    if problems:
        return
    for line, market in sorted(wanted.items()):
        st = states.get(line)
        if st is None:
            scan.problems.append(f"{path}:{line}: the starting state of market {market!r} is missing from {companion}")
        elif st.market_id != market:
            scan.problems.append(f"{companion}: the state for line {line} is of market {st.market_id!r}, the line is of "
                                 f"{market!r}")
    for line, st in sorted(states.items()):
        if line not in wanted and line <= last_line:
            scan.problems.append(f"{companion}: a state of market {st.market_id!r} for line {line}, which does not start "
                                 "from a recorded state")
    scan.states = {line: st for line, st in states.items() if line in wanted}


def read_recording(path: Path) -> Scan:
    """A recording's records (and starting states) for replay; DataError (``file:line: reason``) on any problem.

    The checksum files, when present, must match. Without one (the open file, or a copy)
    the lines are checked alone and a warning says so.
    """
    scan = scan_recording(path)
    if scan.problems:
        more = len(scan.problems) - 1
        raise DataError(scan.problems[0] + (f" (and {more} more problems)" if more else ""), scan.problems)
    if scan.checksum == "missing":
        scan.warnings.insert(0, f"{path}: no checksum file ({checksum_path(path).name}): lines checked one by one only")
    return scan


@dataclass
class Verification:
    """Lines printed by ``--verify-data``."""

    ok: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def verify_recordings(root: Path) -> Verification:
    """Verify every recording (and companion) under ``root`` (see the module docstring)."""
    out = Verification()
    root = Path(root)
    if not root.is_dir():
        return out
    by_dir: dict[Path, list[Path]] = {}
    for p in root.rglob("ticks-*"):
        if any(part.startswith(".") for part in p.relative_to(root).parts):
            continue
        name = p.name
        if name.endswith(CHECKSUM_SUFFIX):
            target = p.with_name(name[:-len(CHECKSUM_SUFFIX)])
            if (FILE_RE.fullmatch(target.name) or STATES_RE.fullmatch(target.name)) and not target.exists():
                out.problems.append(f"{target}: {'recording' if FILE_RE.fullmatch(target.name) else 'starting-state file'}"
                                    f" missing (its checksum file {p.name} is there)")
        elif FILE_RE.fullmatch(name):
            by_dir.setdefault(p.parent, []).append(p)
        elif STATES_RE.fullmatch(name):
            if not p.with_name(name[:-len(STATES_SUFFIX)] + ".csv").exists():
                out.problems.append(f"{p}: starting states without their recording "
                                    f"{name[:-len(STATES_SUFFIX)]}.csv")
        elif LEGACY_RE.fullmatch(name) and p.parent.name == "recordings":
            out.warnings.append(f"{p}: recording in the old format (market ids not escaped, no checksum): not verified")
    for files in by_dir.values():
        files.sort(key=_file_sort_key)
        newest = files[-1]
        for path in files:
            sealed = checksum_path(path).exists()
            open_now = not sealed and (path == newest or _in_use(path))
            if not sealed and not open_now:
                out.problems.append(f"{path}: checksum file {checksum_path(path).name} missing "
                                    "(a closed recording must have one)")
                continue
            scan = scan_recording(path, check_sum=sealed)
            out.problems += scan.problems
            out.warnings += scan.warnings
            if not scan.problems:
                n = len(scan.records)
                states = f", {len(scan.states)} starting states" if scan.states else ""
                out.ok.append(f"{path}: recording OK ({n} ticks{states}, checksum verified)" if sealed else
                              f"{path}: open recording OK so far ({n} ticks{states} checked line by line; "
                              "checksummed when closed)")
    return out


def summary(scan: Scan) -> dict[str, Any]:
    """Counts of a scan (markets, ticks, model versions, with results, starting states)."""
    return {"ticks": len(scan.records), "markets": len({r.tick.market_id for r in scan.records}),
            "model_versions": sorted({r.model_version for r in scan.records if r.model_version}),
            "with_probabilities": sum(r.probabilities is not None for r in scan.records),
            "starting_states": len(scan.states),
            "starting_from_rest": sum(r.start == START_REST for r in scan.records)}
