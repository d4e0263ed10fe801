"""Recording of served ticks (``[debug] record_requests``) for replay and verification.

Format
    ``<state_dir>/recordings/ticks-<UTC date>-<NNNN>.csv``: a CSV file (Python's
    :mod:`csv`, ``QUOTE_MINIMAL``, ``\\n`` line ends, ASCII) whose header is
    :data:`COLUMNS` and whose every following line is one applied tick, in the order
    the engine applied them::

        timestamp,market_id,price,volume,p_down,p_flat,p_up,model_version,request_id
        1640995200000,"a,b",100.0,1000.0,0.25,0.5,0.25,seed-42,
        1640995200001,"x""y",100.5,2.0,,,,seed-42,

    Market ids holding ``,`` or ``"`` are quoted with ``"`` doubled, so every legal id
    (1–64 printable ASCII characters) reads back unchanged; prices, volumes and
    probabilities are written as Python's shortest exact ``repr``. ``p_down``,
    ``p_flat``, ``p_up`` are the probabilities served for the tick and
    ``request_id`` the caller's request id; they are empty when the caller did not
    hand them over. Because the first four columns are those of a training CSV, a
    recording can also be trained or evaluated on. Free-text fields (model version,
    request id) have characters outside printable ASCII replaced by ``?``, so a record
    is always exactly one line.

Off the hot path
    :meth:`TickRecorder.record` only appends the batch to a bounded in-memory buffer
    (``capacity`` ticks) under a short lock; a background thread formats and writes
    the buffer every ``flush_interval_s`` or as soon as a quarter of it is used, and
    flushes the file to the operating system after each write. When the buffer is
    full, ticks are dropped and counted (:attr:`TickRecorder.dropped`, logged by the
    writer thread); a request never waits for the disk.

Rotation and checksums
    A file is closed when the next record would take it past ``max_bytes`` (64 MiB)
    or when the UTC date changes, and when the recorder closes. A closed file is
    fsynced and gets a ``<file>.sha256`` sidecar (``sha256sum`` format, written
    atomically), so ``sha256sum -c`` works too. The open file is held under an
    exclusive ``flock``; files another recorder left open (a crash) are closed with
    their checksum when the next recorder opens its first file.

Verification
    :func:`verify_recordings` (``cerebellar-norse --verify-data DIR``) checks each
    closed file against its checksum and line by line, and the open file (locked by
    a writer, or the newest of its directory without a checksum: left by a crash)
    line by line. A missing or mismatching checksum and a malformed line are
    problems naming the file (and line); a last line without its line end (cut by a
    crash) is only a warning. :func:`read_recording` (``replay``) applies the same
    checks and refuses a malformed recording with ``file:line: reason``.
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import fcntl
import hashlib
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ..errors import DataError
from ..storage import atomic_write_bytes, sha256_file
from ..ticks import MARKET_ID_MAX, TS_MAX_MS, TS_MIN_MS, Tick

log = logging.getLogger("cerebellar_norse.engine.recorder")

COLUMNS = ("timestamp", "market_id", "price", "volume", "p_down", "p_flat", "p_up", "model_version", "request_id")
HEADER = ",".join(COLUMNS) + "\n"
CHECKSUM_SUFFIX = ".sha256"
MAX_BYTES = 64 << 20  # a file is closed before it grows past this
CAPACITY = 100_000  # ticks held in memory waiting for the writer thread
FLUSH_INTERVAL_S = 0.1
DROP_LOG_INTERVAL_S = 10.0
MAX_PROBLEMS_PER_FILE = 20

FILE_RE = re.compile(r"ticks-(\d{8})-(\d{4,})\.csv")
LEGACY_RE = re.compile(r"ticks-\d{8}\.csv")  # one file per day, written before ids were escaped
_SIDECAR_RE = re.compile(r"([0-9a-f]{64})  (\S.*)\n")
_NON_PRINTABLE = re.compile(r"[^ -~]")


def checksum_path(path: Path) -> Path:
    """The ``<file>.sha256`` sidecar of a recording."""
    return path.with_name(path.name + CHECKSUM_SUFFIX)


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


class _Batch(NamedTuple):
    ticks: Sequence[Tick]
    probs: np.ndarray | None
    model_version: str
    request_ids: Sequence[str | None] | None


class TickRecorder:
    """Writes applied ticks (and what was served for them) to rotating, checksummed CSV files.

    Args:
        directory: where the files go (``<state_dir>/recordings``).
        capacity: ticks buffered in memory for the writer thread; beyond it ticks are dropped.
        max_bytes: size at which a file is closed and the next one started.
        flush_interval_s: longest time a tick waits in memory before it is written.
        clock: seconds since the epoch (UTC date of the file names).

    Attributes:
        dropped: ticks not recorded (buffer full, recorder closed, or a failed write).
        written: ticks written to files.
        write_errors: failed writes (each logged).
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
        # writer-thread state
        self._fmt = csv.writer(_Line(), lineterminator="\n")
        self._fh: BinaryIO | None = None
        self._path: Path | None = None
        self._day = ""
        self._size = 0
        self._records = 0
        self._recovered = False
        self._drops_logged = 0
        self._drop_log_at = 0.0
        self._error_log_at = -math.inf

    # -- caller side (the engine's loop thread): never blocks on I/O ---------------

    def record(self, ticks: Sequence[Tick], probs: np.ndarray | None = None, model_version: str = "",
               request_ids: Sequence[str | None] | None = None) -> int:
        """Hand over applied ticks; returns how many were taken (the rest are counted in :attr:`dropped`).

        ``probs`` (B, 3) are the probabilities down/flat/up served for the ticks,
        ``request_ids`` the callers' request ids; either may be None (empty fields).
        """
        n = len(ticks)
        with self._lock:
            room = 0 if self._closing else self.capacity - self._pending_n
            if n > room:
                self.dropped += n - max(room, 0)
                if room <= 0:
                    return 0
                n = room
                ticks, probs = ticks[:n], None if probs is None else probs[:n]
                request_ids = None if request_ids is None else request_ids[:n]
            if n == 0:
                return 0
            # copies: the caller may reuse its buffers once this returns
            self._pending.append(_Batch(tuple(ticks), None if probs is None else probs.copy(), model_version,
                                        None if request_ids is None else tuple(request_ids)))
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
                with self._lock:
                    self._handled += len(batches)
                    self._done.notify_all()
                    done = closing and not self._pending
                self._log_drops()
                if done:
                    break
                if not batches and self._fh is not None and self._today() != self._day:
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

    def _lines(self, batch: _Batch) -> list[str]:
        probs = batch.probs.tolist() if batch.probs is not None else None
        version = _printable(batch.model_version)
        rids = batch.request_ids
        fmt = self._fmt
        out = []
        for j, t in enumerate(batch.ticks):
            p = probs[j] if probs is not None else (None, None, None)
            rid = rids[j] if rids is not None else None
            out.append(fmt.writerow((t.timestamp, t.market_id, float(t.price), float(t.volume), *p, version,
                                     "" if rid is None else _printable(rid))))
        return out

    def _today(self) -> str:
        return time.strftime("%Y%m%d", time.gmtime(self._clock()))

    def _write_batches(self, batches: list[_Batch]) -> None:
        day = self._today()
        lines = [line for b in batches for line in self._lines(b)]
        emitted = 0
        try:
            if self._fh is not None and day != self._day:
                self._seal()
            chunk: list[bytes] = []
            size = 0
            for line in lines:
                data = line.encode("utf-8", "backslashreplace")
                if self._fh is None:
                    self._open(day)
                elif self._size + size + len(data) > self.max_bytes and self._records + len(chunk) > 0:
                    emitted += self._emit(chunk)
                    chunk, size = [], 0
                    self._seal()
                    self._open(day)
                chunk.append(data)
                size += len(data)
            emitted += self._emit(chunk)
        except OSError as exc:
            self._fail(exc, len(lines) - emitted)

    def _emit(self, chunk: list[bytes]) -> int:
        if not chunk:
            return 0
        assert self._fh is not None
        data = b"".join(chunk)
        self._fh.write(data)
        self._fh.flush()
        self._size += len(data)
        self._records += len(chunk)
        self.written += len(chunk)
        return len(chunk)

    def _fail(self, exc: OSError, n: int) -> None:
        self.write_errors += 1
        now = time.monotonic()
        if now - self._error_log_at >= DROP_LOG_INTERVAL_S:  # a full or read-only disk fails every write
            self._error_log_at = now
            log.error("recording write failed (%s): %s; %d ticks dropped (%d failed writes so far)",
                      self._path or self.directory, exc, n, self.write_errors)
        with self._lock:
            self.dropped += n
        fh, path = self._fh, self._path
        self._fh = self._path = None
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()
        if path is not None:
            try:
                _write_checksum(path)
            except OSError as exc2:
                log.error("recording %s not checksummed: %s", path, exc2)

    def _open(self, day: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self._recovered:
            self._recovered = True
            seal_leftovers(self.directory)
        seq = 1 + max((int(m.group(1)) for p in self.directory.iterdir()
                       if (m := re.fullmatch(rf"ticks-{day}-(\d+)\.csv(?:{re.escape(CHECKSUM_SUFFIX)})?", p.name))),
                      default=0)
        while True:
            path = self.directory / f"ticks-{day}-{seq:04d}.csv"
            try:
                fh = open(path, "xb")  # noqa: SIM115 (kept open across writes)
            except FileExistsError:
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
        """fsync and close the current file, then write its checksum (while still holding its lock)."""
        fh, path = self._fh, self._path
        if fh is None or path is None:
            return
        self._fh = self._path = None
        try:
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
    """Checksum recordings in ``directory`` that no recorder holds and that have no checksum (left by a crash)."""
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
    """One record: the tick, what was served for it (None/"" when not recorded) and its line in the file."""

    tick: Tick
    probabilities: tuple[float, float, float] | None
    model_version: str
    request_id: str
    line: int


@dataclass
class Scan:
    """What reading a recording found."""

    path: Path
    records: list[RecordedTick] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "file:line: reason"
    warnings: list[str] = field(default_factory=list)
    sha256: str = ""
    checksum: str | None = None  # "ok", "mismatch", "missing", or a problem with the checksum file

    @property
    def ticks(self) -> list[Tick]:
        """The recorded ticks in file (= applied) order."""
        return [r.tick for r in self.records]


def is_recording(path: Path) -> bool:
    """True for a file named like a recording or starting with its header (else it is a plain tick CSV)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(HEADER))
    except OSError:
        return False
    return head == HEADER.encode("ascii") or FILE_RE.fullmatch(Path(path).name) is not None


def _float(text: str, name: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{name} {text!r} is not finite")
    return x


def _parse(fields: list[str]) -> tuple[Tick, tuple[float, float, float] | None, str, str]:
    if len(fields) != len(COLUMNS):
        raise ValueError(f"expected {len(COLUMNS)} fields, got {len(fields)}")
    ts_text, market, price_text, volume_text, pd, pf, pu, version, rid = fields
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
    if _NON_PRINTABLE.search(version) or _NON_PRINTABLE.search(rid):
        raise ValueError("model_version or request_id holds characters other than printable ASCII")
    return Tick(price, volume, ts, market), probs, version, rid


def scan_recording(path: Path, check_sum: bool = True) -> Scan:
    """Read a recording line by line (and against its checksum file when present and ``check_sum``).

    Malformed lines, time going backwards within a market and a checksum mismatch are
    problems; a last line without its line end (a crash cut it) is a warning and is
    not returned.
    """
    path = Path(path)
    scan = Scan(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        scan.problems.append(f"{path}: cannot read: {exc.strerror}")
        return scan
    scan.sha256 = hashlib.sha256(data).hexdigest()
    side = checksum_path(path)
    if check_sum:
        if not side.exists():
            scan.checksum = "missing"
        else:
            try:
                text = side.read_text(encoding="ascii")
            except (OSError, UnicodeDecodeError) as exc:
                scan.checksum = f"{side}: unreadable checksum file ({exc})"
            else:
                m = _SIDECAR_RE.fullmatch(text)
                if m is None:
                    scan.checksum = f"{side}: not a sha256sum line for {path.name}"
                elif m.group(2) != path.name:
                    scan.checksum = f"{side}: names {m.group(2)!r}, not {path.name}"
                elif m.group(1) != scan.sha256:
                    scan.checksum = "mismatch"
                    scan.problems.append(f"{path}: checksum mismatch (expected {m.group(1)[:16]}…, file has "
                                         f"{scan.sha256[:16]}…): the recording was truncated or edited after it was closed")
                else:
                    scan.checksum = "ok"
            if scan.checksum not in ("ok", "mismatch"):
                scan.problems.append(str(scan.checksum))
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a line end
    if tail:
        scan.warnings.append(f"{path}:{len(lines) + 1}: last line is incomplete (cut by a crash while it was written); ignored")
    if not lines:
        if not tail:
            scan.warnings.append(f"{path}: empty (created just before a crash?)")
        return scan
    if lines[0] + b"\n" != HEADER.encode("ascii"):
        scan.problems.append(f"{path}:1: not a recording header (expected {HEADER.strip()!r})")
        return scan
    last_ts: dict[str, tuple[int, int]] = {}
    for no, raw in enumerate(lines[1:], start=2):
        try:
            text = raw.decode("ascii")
            fields = next(csv.reader([text], strict=True))
            tick, probs, version, rid = _parse(fields)
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
        scan.records.append(RecordedTick(tick, probs, version, rid, no))
    return scan


def read_recording(path: Path) -> Scan:
    """A recording's records for replay; DataError (``file:line: reason``) on any problem.

    The checksum file, when present, must match. Without one (the open file, or a copy)
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
    """Verify every recording under ``root`` (see the module docstring)."""
    out = Verification()
    root = Path(root)
    if not root.is_dir():
        return out
    by_dir: dict[Path, list[Path]] = {}
    for p in root.rglob("ticks-*.csv*"):
        if any(part.startswith(".") for part in p.relative_to(root).parts):
            continue
        name = p.name
        if name.endswith(CHECKSUM_SUFFIX):
            target = p.with_name(name[:-len(CHECKSUM_SUFFIX)])
            if FILE_RE.fullmatch(target.name) and not target.exists():
                out.problems.append(f"{target}: recording missing (its checksum file {p.name} is there)")
        elif FILE_RE.fullmatch(name):
            by_dir.setdefault(p.parent, []).append(p)
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
                out.ok.append(f"{path}: recording OK ({n} ticks, checksum verified)" if sealed else
                              f"{path}: open recording OK so far ({n} ticks checked line by line; "
                              "checksummed when closed)")
    return out


def summary(scan: Scan) -> dict[str, Any]:
    """Counts of a scan (markets, ticks, model versions, with results)."""
    return {"ticks": len(scan.records), "markets": len({r.tick.market_id for r in scan.records}),
            "model_versions": sorted({r.model_version for r in scan.records if r.model_version}),
            "with_probabilities": sum(r.probabilities is not None for r in scan.records)}
