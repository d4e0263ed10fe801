"""Journal segment files: their names, format, creation and reading (no appends, no recovery).

Layout
    A journal is the directory ``<state_dir>/journal/`` (:data:`JOURNAL_DIR`) of segment
    files ``<base seq, 20 digits>.journal`` (:func:`segment_name`); a segment's first record
    is ``base + 1``.

Format (sizes in bytes, integers little-endian)
    A segment of ``size`` bytes is reserved on disk when it is created
    (:func:`create_segment`). It starts with a header (:data:`MAGIC`, then a record
    ``<u32 length><u32 CRC-32>`` + JSON: the format (:data:`FORMAT`; none in files
    written before it, which are format 1), network fingerprint, base sequence number, size
    reserved, the state dir's identity, the pool's capacity, the largest record its
    writer appends) padded to :data:`HEADER_SIZE`; records follow, each
    ``<u32 length><u32 CRC-32>`` + body, body ``<u64 seq><u8 kind><u32 count>`` + items
    (:data:`KIND_TICKS`: ``<f64 price><f64 volume><i64 timestamp (ms)><u8 id length>`` +
    id; :data:`KIND_RELEASE`: ``<u8 id length>`` + id), the rest zeros.

Reading
    :class:`SegmentReader` yields the records in order. An append is one copy into the
    mapped file; a crash in the middle of it leaves an incomplete last record (zero
    header, or a failing CRC) followed by zeros only: that record was never
    acknowledged and is dropped (a torn tail, at most :func:`record_bound` bytes). Any
    other bad record (bad length or CRC with data after it, an intact record inside its
    extent, a wrong sequence number) is damage (power loss, disk fault), and so is a file
    shorter than the size its header records (truncated: its last records are gone, even
    when the cut falls between two records) and a header whose zero padding is not zeros.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zlib import crc32

from ..errors import CheckpointError, InputError, quoted
from ..storage import retrying, what_is_at
from ..ticks import TS_MAX_MS, Tick, check_market_id, check_price, check_volume
from .persistence import check_format, is_state_id

JOURNAL_DIR = "journal"
SUFFIX = ".journal"
MAGIC = b"CNJRNL1\n"
# The format of a segment (its header's ``format``). Raise it when a change means an older version would misread the
# file: that version then refuses to start on it (NewerFormatError) instead of moving it aside as damaged.
FORMAT = 1
HEADER_SIZE = 4096
KIND_TICKS = 1
KIND_RELEASE = 2

REC = struct.Struct("<II")  # body length, CRC-32 of the body
BODY = struct.Struct("<QBI")  # seq, kind, count
TICK = struct.Struct("<ddqB")  # price, volume, timestamp (ms), market id length
ONE = struct.Struct("<QBIddqB")  # the body of a one-tick record, up to the market id
ID = struct.Struct("<B")


def parse_header(data: bytes, path: Path | str = "") -> dict[str, Any]:
    """The JSON object in a segment's header (``data``: the file, or at least its first HEADER_SIZE bytes; ``path``
    names it in errors).

    Raises:
        ValueError: not a journal file, or its header is damaged.
        NewerFormatError: a newer version of the service wrote it (:data:`FORMAT`).
    """
    if len(data) < HEADER_SIZE or not data.startswith(MAGIC):
        raise ValueError("not a journal file (bad magic or shorter than its header)")
    n, crc = REC.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + REC.size
    meta = data[start:start + n]
    if start + n > HEADER_SIZE or crc32(meta) != crc:
        raise ValueError("journal header checksum mismatch")
    try:
        head = json.loads(meta)
    except ValueError as exc:
        raise ValueError(f"unreadable journal header: {exc}") from None
    if not isinstance(head, dict):
        raise ValueError(f"unreadable journal header: a {type(head).__name__}, not an object")
    try:
        check_format(head.get("format"), FORMAT, str(path), "journal", "move the journal files away on purpose (the ticks "
                     "they hold after market_state.bin are then lost)")
    except CheckpointError as exc:
        raise ValueError(f"unreadable journal header: {exc.reason}") from None
    return head


def _padding_damage(data: bytes) -> str | None:
    """What is wrong with the zeros that pad a segment's header to :data:`HEADER_SIZE` (a file whose header
    :func:`parse_header` read), or None when they are all zeros."""
    start = len(MAGIC) + REC.size + REC.unpack_from(data, len(MAGIC))[0]
    pad = data[start:HEADER_SIZE]
    if pad.count(0) == len(pad):
        return None
    at = start + next(i for i, b in enumerate(pad) if b)
    return f"non-zero bytes in the padding of its header (offset {at}), which is written as zeros only"


def segment_state_id(path: Path) -> tuple[bool, str | None]:
    """(readable, identity) of a segment from its header alone; (False, None) when the header cannot be read."""
    try:
        with open(path, "rb") as f:
            sid = parse_header(f.read(HEADER_SIZE), path).get("state_id")
    except (OSError, ValueError):
        return False, None
    if sid is not None and not is_state_id(sid):
        return False, None  # a garbled identity: the header is no good (read as damaged, never adopted)
    return True, sid


def segment_name(base: int) -> str:
    """File name of the segment whose first record is ``base + 1``."""
    return f"{base:020d}{SUFFIX}"


@dataclass
class Record:
    """One journal record: the ticks of one backend step, or markets whose slots were released."""

    seq: int
    kind: int
    ticks: list[Tick] = field(default_factory=list)
    markets: list[str] = field(default_factory=list)


class SegmentReader:
    """Reads one segment: its header on construction, then :meth:`records`; ``damage`` says why reading stopped early.

    Args:
        path: the segment file.
        max_record: the largest record an append can write (bytes); bounds what a crash
            in the middle of the last append can leave behind. The segment's header has the
            bound its writer used where it was recorded, and that one is taken.
        last: whether this is the newest segment (the only one a crash can cut short).

    Raises:
        ValueError: the header is unreadable (the whole file is unusable).

    ``size`` is the file's size in bytes as reserved when it was created (None for
    segments written before headers recorded it: their length is not checked).
    """

    def __init__(self, path: Path, max_record: int = 1 << 20, last: bool = True) -> None:
        self.path = path
        self.data = path.read_bytes()
        self.max_record = max_record
        self.last = last
        self.damage: str | None = None
        self.unfinished = 0  # bytes of a record whose append a crash cut short (never acknowledged): dropped
        self.bound_recorded = False  # whether the header has its writer's max_record (else the caller's is used)
        self.cut_by_bound = False  # whether ``unfinished`` was told by ``max_record`` (a cut before the record's header)
        self.last_seq: int | None = None
        head = parse_header(self.data, path)
        self.padding_damage = _padding_damage(self.data)
        try:
            self.base = int(head["base_seq"])
            self.fingerprint: dict[str, Any] = dict(head["fingerprint"])
            self.size: int | None = None if head.get("size") is None else int(head["size"])
            sid = head.get("state_id")
            if sid is not None and not is_state_id(sid):
                raise ValueError(f"state_id {quoted(str(sid), 80)} is no state dir identity")
            self.state_id: str | None = sid  # None: written before identities
            cap = head.get("capacity")
            self.capacity: int | None = None if cap is None else int(cap)  # the live pool's slots (None: not recorded)
            if head.get("max_record") is not None:  # the writer's bound, not the reader's config
                self.max_record = int(head["max_record"])
                self.bound_recorded = True
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"unreadable journal header: {exc}") from None

    def _zeros_from(self, pos: int) -> bool:
        return pos >= len(self.data) or self.data.count(0, pos) == len(self.data) - pos

    def records(self) -> Iterator[Record]:
        """The records in order, stopping at the end of the journal or at the first damaged record.

        The journal ends at a zero header followed by zeros. A crash during the last
        append (one copy of header and body into the mapped file) can leave that
        record incomplete: a zero header with bytes of its body after it, or a record
        whose checksum fails, followed by zeros only. Such a tail of the newest segment
        is dropped (``unfinished``); anything else is ``damage``. A file shorter than
        its reserved ``size`` is damage too, wherever the cut falls: appends never
        change a segment's length, so the records after the cut are lost.
        """
        yield from self._records()
        if self.padding_damage is not None:  # outside the header's checksum, never written but as zeros: bit rot
            self.damage = self.padding_damage if self.damage is None else f"{self.padding_damage}; {self.damage}"
        if self.size is not None and len(self.data) < self.size:
            cut = (f"the file is {len(self.data)} bytes, shorter than the {self.size} bytes reserved when it was created "
                   f"(truncated): the records after offset {len(self.data)}")
            cut += f" (from record {self.last_seq + 1 if self.last_seq is not None else self.base + 1} on) are lost"
            self.damage = cut if self.damage is None else f"{cut}; {self.damage}"

    def _records(self) -> Iterator[Record]:
        d, size = self.data, len(self.data)
        pos, expect = HEADER_SIZE, self.base + 1
        while pos + REC.size <= size:
            n, crc = REC.unpack_from(d, pos)
            end = pos + REC.size + n
            if n == 0:
                if not self._zeros_from(pos):  # an append cut short before its header, or damage
                    self._tail(pos, min(size, pos + self.max_record), f"non-zero bytes after the end of the journal (offset {pos})")
                    self.cut_by_bound = self.unfinished > 0
                return
            if end > size:
                self.damage = f"record at offset {pos} runs past the end of the file"
                return
            body = d[pos + REC.size:end]
            if crc32(body) != crc:
                self._tail(pos, end, f"checksum mismatch in the record at offset {pos}")
                return
            try:
                rec = _decode(body)
            except (struct.error, UnicodeDecodeError, ValueError) as exc:
                self.damage = f"undecodable record at offset {pos}: {exc}"
                return
            problem = _unservable(rec)
            if problem is not None:  # its checksum holds, yet it was never written by a service (nothing refused)
                self.damage = f"record {rec.seq} at offset {pos} holds {problem}, which no service journals"
                return
            if rec.seq != expect:
                self.damage = f"record {rec.seq} at offset {pos} where {expect} was due"
                return
            self.last_seq = rec.seq
            yield rec
            expect += 1
            pos = end
        if pos != size:
            self.damage = f"{size - pos} stray bytes at the end of the file"

    def _tail(self, pos: int, extent_end: int, problem: str) -> None:
        """The record at ``pos`` is incomplete: a dropped unfinished append if only zeros follow its extent and no
        intact record lies inside it, else damage.

        An append cut short by a crash is the last thing written: an intact record of the journal after its start
        means the bytes at ``pos`` were damaged (a flipped bit in a length, a byte inserted), and dropping the extent
        as unfinished would silently lose acknowledged records.
        """
        found = self._intact_record_in(pos, extent_end)
        if found is not None:
            seq, at = found
            self.damage = f"{problem}, yet the intact record {seq} follows at offset {at}: not an append a crash cut short"
        elif self.last and self._zeros_from(extent_end):
            self.unfinished = len(self.data[pos:extent_end].rstrip(b"\x00"))
        else:
            self.damage = problem

    def _intact_record_in(self, pos: int, extent_end: int) -> tuple[int, int] | None:
        """(seq, offset) of a record with a valid checksum and the sequence number due at ``pos`` or the next one,
        starting after ``pos`` and before ``extent_end``; None when there is none."""
        d, due = self.data, (self.base + 1 if self.last_seq is None else self.last_seq + 1)
        for seq in (due, due + 1):
            key = seq.to_bytes(8, "little")
            at = d.find(key, pos + 1 + REC.size, extent_end + REC.size)
            while at != -1:
                q = at - REC.size
                n, crc = REC.unpack_from(d, q)
                if BODY.size <= n and q + REC.size + n <= len(d) and crc32(d[at:at + n]) == crc:
                    return seq, q
                at = d.find(key, at + 1, extent_end + REC.size)
        return None


def _decode(body: bytes) -> Record:
    seq, kind, count = BODY.unpack_from(body, 0)
    off = BODY.size
    rec = Record(seq, kind)
    if kind == KIND_TICKS:
        for _ in range(count):
            price, volume, ts, n = TICK.unpack_from(body, off)
            off += TICK.size
            rec.ticks.append(Tick(price, volume, ts, body[off:off + n].decode("utf-8")))
            off += n
    elif kind == KIND_RELEASE:
        for _ in range(count):
            (n,) = ID.unpack_from(body, off)
            off += ID.size
            rec.markets.append(body[off:off + n].decode("utf-8"))
            off += n
    else:
        raise ValueError(f"unknown record kind {kind}")
    if off != len(body):
        raise ValueError(f"{len(body) - off} bytes left after the record's items")
    return rec


def _unservable(rec: Record) -> str | None:
    """What in a decoded record no request could have carried into the journal (a tick's price not finite and > 0,
    a volume not finite and >= 0, a time before 1970 or from 2100 on, a market id no tick can name), or None."""
    for k, t in enumerate(rec.ticks):
        try:
            check_price(t.price, f"ticks.{k}.price")
            check_volume(t.volume, f"ticks.{k}.volume")
            check_market_id(t.market_id, f"ticks.{k}.market_id")
        except InputError as exc:
            return f"a tick no request can carry ({exc})"
        if not 0 <= t.timestamp < TS_MAX_MS:
            return f"a tick no request can carry (ticks.{k}.timestamp: {t.timestamp} is not ms since the epoch before 2100)"
    for k, m in enumerate(rec.markets):
        try:
            check_market_id(m, f"markets.{k}")
        except InputError as exc:
            return f"a market id no tick can name ({exc})"
    return None


_RECORD_TICK_MAX = TICK.size + 255  # a tick in a record, with the longest market id (bytes)


def record_bound(batch_size: int) -> int:
    """The largest record (bytes) a journal of an engine of ``batch_size`` appends: one batch of ticks."""
    return REC.size + BODY.size + max(batch_size, 1) * _RECORD_TICK_MAX


def batch_bound(batch_size: int) -> int:
    """The most bytes one batch of ``batch_size`` ticks appends to a journal: a record per backend step (a batch with
    more markets than the pool has slots is stepped in parts), one tick per part at worst."""
    return max(batch_size, 1) * (REC.size + BODY.size + _RECORD_TICK_MAX)


def batch_size_for_record(size: int) -> int:
    """The smallest ``performance.batch_size`` whose largest record (:func:`record_bound`) is ``size`` bytes or more."""
    return max(1, -(-(size - REC.size - BODY.size) // _RECORD_TICK_MAX))


def _segment_base(name: str) -> int | None:
    """The base seq a segment file called ``name`` has, or None when the name is not a segment's."""
    stem = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else ""
    return int(stem) if stem.isdigit() else None


def misplaced_entries(directory: Path) -> list[tuple[Path, str]]:
    """What stands where the journal's files must be and is not one: ``directory`` itself when it is not a directory,
    each entry named as a segment file that is not a regular file, and a directory where :data:`SPARE` goes; (path,
    what it is instead) each. The service moves them aside at start (it could neither create its journal files nor
    read them)."""
    if not directory.is_dir():
        if directory.exists() or directory.is_symlink():
            return [(directory, f"{what_is_at(directory)}, not the journal's directory")]
        return []
    return sorted((p, f"{what_is_at(p)}, not a journal file") for p in directory.iterdir()
                  if (_segment_base(p.name) is not None and not p.is_file())
                  or (p.name == SPARE and p.is_dir() and not p.is_symlink()))  # (removed at start, unless a directory)


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(base seq, path) of the segment files of a journal directory, oldest first."""
    if not directory.is_dir():
        return []
    out = []
    for p in directory.iterdir():
        base = _segment_base(p.name)
        if base is not None and p.is_file():
            out.append((base, p))
    return sorted(out)


def create_segment(directory: Path, base: int, fingerprint: dict[str, Any], size: int,
                   state_id: str | None = None, capacity: int | None = None,
                   max_record: int | None = None) -> tuple[Path, mmap.mmap]:
    """Create, reserve, fsync and map a new segment of ``size`` bytes (written under a temporary name, then renamed).

    The header records ``size``: a segment found shorter than that at start was truncated;
    and ``state_id``, the identity of the state dir it belongs to (when given); ``capacity``, the state slots of
    the pool its records are stepped in (when given: a replay into fewer slots evicts what the live engine kept);
    ``max_record``, the largest record its writer appends (bytes, when given: every reader, ``--verify-data`` too,
    then bounds a crash-cut tail by it, whatever its own config).

    Raises:
        OSError: the directory is read-only or the disk cannot hold ``size`` bytes.
    """
    path = directory / segment_name(base)
    tmp = directory / f".{path.name}.tmp"
    header = _new_header(base, fingerprint, size, state_id, capacity, max_record)
    # everything that can fail for want of a descriptor, space or memory happens before the rename: a segment whose
    # creation fails is never left under its name (a stray file that holds the space reserved for it)
    with _new_file(directory, tmp, size, header) as new:
        mm = mmap.mmap(new.fd, size)
        try:
            retrying(os.replace, tmp, path)
            new.name = path  # (renamed: a failure from here removes it by its name; it holds no record)
            os.fsync(new.dfd)
        except BaseException:
            mm.close()
            raise
    return path, mm


SPARE = f".next{SUFFIX}.spare"
"""The next segment's file, reserved and flushed ahead of time (:func:`prepare_spare`) by a worker thread, holding no
record: kept while the service runs, removed at shutdown and at start (one a crash left behind)."""


def prepare_spare(directory: Path, size: int) -> Path:
    """Create the journal's next file ahead of time, in a worker thread: :data:`SPARE` of ``size`` bytes reserved on the
    disk (``posix_fallocate``) and flushed with its directory, so that starting a segment on the event loop
    (:func:`adopt_spare`) needs neither disk space nor a flush. A failure removes the file again.

    Raises:
        OSError: no descriptor, no disk space, a read-only file system, an I/O error.
    """
    tmp = directory / SPARE
    with _new_file(directory, tmp, size, b"") as new:
        os.fsync(new.dfd)
    return tmp


@dataclass
class Unsynced:
    """A segment started from the spare whose header and name are not flushed to the disk yet (:func:`sync_segment`)."""

    path: Path
    fd: int
    dfd: int


def adopt_spare(directory: Path, base: int, fingerprint: dict[str, Any], size: int,
                state_id: str | None = None, capacity: int | None = None,
                max_record: int | None = None) -> tuple[Path, mmap.mmap, Unsynced] | None:
    """Start the segment at ``base`` from the file :func:`prepare_spare` made (None when there is none of ``size``
    bytes): its header written, mapped and renamed to its name, without waiting for the disk; the flush of the header
    and of the directory is left to :func:`sync_segment` (in a worker thread, or before the first record the
    segment holds is flushed). The arguments are :func:`create_segment`'s.

    Raises:
        OSError: no file descriptor, no memory for the map, a failed rename (the spare is left as it was).
    """
    spare = directory / SPARE
    try:
        fd = os.open(spare, os.O_RDWR)
    except FileNotFoundError:
        return None
    mm: mmap.mmap | None = None
    dfd = -1
    try:
        if os.fstat(fd).st_size != size:
            os.close(fd)
            fd = -1
            with contextlib.suppress(FileNotFoundError):
                retrying(os.unlink, spare)  # of another size (a larger record, another journal_segment_size)
            return None
        dfd = os.open(directory, os.O_RDONLY)
        path = directory / segment_name(base)
        os.pwrite(fd, _new_header(base, fingerprint, size, state_id, capacity, max_record), 0)
        mm = mmap.mmap(fd, size)
        retrying(os.replace, spare, path)
    except BaseException:
        if mm is not None:
            mm.close()
        for d in (fd, dfd):
            if d >= 0:
                os.close(d)
        raise
    return path, mm, Unsynced(path, fd, dfd)


def sync_segment(unsynced: Unsynced) -> None:
    """Flush a segment started by :func:`adopt_spare` (its header, then the directory holding its name) and close its
    descriptors (any thread, once).

    Raises:
        OSError: the flush failed (an I/O error): what the segment holds cannot be trusted to reach the disk.
    """
    try:
        os.fsync(unsynced.fd)
        os.fsync(unsynced.dfd)
    finally:
        os.close(unsynced.fd)
        os.close(unsynced.dfd)


@dataclass
class _NewFile:
    """A file :func:`_new_file` is making: its descriptor, its directory's, and the name a failure removes (its final
    name once renamed)."""

    fd: int
    dfd: int
    name: Path


@contextlib.contextmanager
def _new_file(directory: Path, tmp: Path, size: int, header: bytes) -> Iterator[_NewFile]:
    """Create ``tmp`` in ``directory`` (made if missing) with ``size`` bytes reserved on the disk and ``header`` at its
    start, flushed, for the body of the ``with`` to finish (the directory is not flushed here). Both descriptors are
    closed at the end; a failure, here or in the body, removes the file by its :attr:`_NewFile.name`.

    Raises:
        OSError: no descriptor, no disk space, a read-only file system, an I/O error.
    """
    directory.mkdir(parents=True, exist_ok=True)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        new = _NewFile(fd, dfd, tmp)
        try:
            os.posix_fallocate(fd, 0, size)  # reserve the blocks now: appends never hit a full disk
            if header:
                os.pwrite(fd, header, 0)
            os.fsync(fd)
            yield new
        except BaseException:
            with contextlib.suppress(OSError):
                retrying(os.unlink, new.name)
            raise
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def _new_header(base: int, fingerprint: dict[str, Any], size: int, state_id: str | None, capacity: int | None,
                max_record: int | None) -> bytes:
    """The header bytes of a new segment (:func:`create_segment`'s arguments; this process, now)."""
    return _header({"format": FORMAT, "base_seq": base, "fingerprint": fingerprint,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "pid": os.getpid(), "size": size,
                    **({} if state_id is None else {"state_id": state_id}),
                    **({} if capacity is None else {"capacity": capacity}),
                    **({} if max_record is None else {"max_record": max_record})})


def _header(head: dict[str, Any]) -> bytes:
    """A segment's header bytes (:data:`MAGIC`, length, CRC-32, JSON), without its padding."""
    meta = json.dumps(head, sort_keys=True).encode()
    header = MAGIC + REC.pack(len(meta), crc32(meta)) + meta
    if len(header) > HEADER_SIZE:
        raise ValueError("journal header too long")
    return header


def set_fingerprint(mm: mmap.mmap, fingerprint: dict[str, Any]) -> None:
    """Give an open segment (mapped as ``mm``, holding no record yet) another fingerprint in its header, in place (no
    new blocks: a full disk does not refuse it), and flush it to the disk.

    For a segment started for a model swap that was then refused: the records appended next are of the model kept.

    Raises:
        OSError: the flush failed (an I/O error).
    """
    head = parse_header(mm[:HEADER_SIZE])
    head["fingerprint"] = fingerprint
    mm[:HEADER_SIZE] = _header(head).ljust(HEADER_SIZE, b"\0")
    mm.flush(0, HEADER_SIZE)
