"""Writing of served ticks (``[debug] record_requests``) to rotating, checksummed recordings.

The file format is in :mod:`~cerebellar_norse.engine.recording_format`; reading and
verifying recordings is :mod:`~cerebellar_norse.engine.recording`. Sizes are bytes,
intervals seconds, capacities ticks.

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
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

import numpy as np

from ..storage import atomic_write_bytes, sha256_file
from ..ticks import Tick
from .recording_format import (
    CHECKSUM_SUFFIX,
    FILE_RE,
    HEADER,
    NON_PRINTABLE,
    START_REST,
    START_STATE,
    STATES_MAGIC,
    checksum_path,
    file_sort_key,
    states_path,
)

if TYPE_CHECKING:
    from .pool import StatePool

log = logging.getLogger("cerebellar_norse.engine.recorder")

MAX_BYTES = 64 << 20  # a new file is started at the first step after the current one reached this
CAPACITY = 100_000  # ticks held in memory waiting for the writer thread
FLUSH_INTERVAL_S = 0.1
DROP_LOG_INTERVAL_S = 10.0
_DAY_S = 86_400


def _printable(text: str) -> str:
    return NON_PRINTABLE.sub("?", text)


class _Line:
    """A file-like sink whose ``write`` returns its argument: ``csv.writer(_Line()).writerow(row)`` is the line."""

    def write(self, text: str) -> str:
        return text


def _write_checksum(path: Path) -> str:
    digest = sha256_file(path)
    atomic_write_bytes(checksum_path(path), f"{digest}  {path.name}\n".encode("ascii"))
    return digest


def _checksum_closed(path: Path) -> None:
    """Write the checksums of a closed recording and of its companion, if it has one without."""
    companion = states_path(path)
    if companion.exists() and not checksum_path(companion).exists():
        _write_checksum(companion)
    _write_checksum(path)


def state_record(line: int, market_id: str, state: dict[str, np.ndarray]) -> bytes:
    """One record of a companion file: JSON header line, raw payload, ``\\n`` (see :mod:`.recording_format`)."""
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
        self._unsealed: list[Path] = []  # files closed by a failure whose checksum could not be written yet
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
        if path is None:
            return
        if not self._records:  # no tick in it (a full disk fails its header): not left as an empty recording
            for p in (states_path(path), path):
                with contextlib.suppress(OSError):
                    p.unlink(missing_ok=True)
            return
        try:
            _checksum_closed(path)
        except OSError as exc2:
            log.error("recording %s not checksummed: %s; retried when a write succeeds again", path, exc2)
            self._unsealed.append(path)

    def _checksum_pending(self) -> None:
        """Checksum the files a failure closed without one (a write has just succeeded again)."""
        for path in list(self._unsealed):
            with contextlib.suppress(OSError):  # still failing: tried again with the next file
                _checksum_closed(path)
                self._unsealed.remove(path)
                log.info("recording %s checksummed after its failed write", path)

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
        if self._unsealed:  # a write works again: close what a failure left without its checksum
            self._checksum_pending()

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
            if not checksum_path(path).exists():
                self._unsealed.append(path)
        finally:
            with contextlib.suppress(OSError):
                fh.close()


def seal_leftovers(directory: Path) -> list[Path]:
    """Checksum recordings in ``directory`` (and their companions) that no recorder holds and that have no checksum."""
    sealed = []
    for path in sorted(directory.glob("ticks-*.csv"), key=file_sort_key):
        if not FILE_RE.fullmatch(path.name) or checksum_path(path).exists():
            continue
        try:
            with open(path, "rb") as fh:
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # another recorder's open file
                torn = path.stat().st_size > 0 and _last_byte(fh) != b"\n"
                _checksum_closed(path)
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
