"""Journal of applied ticks and periodic checkpoints: a crash loses no acknowledged tick.

Promise
    After a process crash (``kill -9``, OOM kill, watchdog) at any moment, the restarted
    engine's state of every market equals, bit for bit, its state after the last tick
    whose result was returned (and possibly after ticks applied but not yet answered).
    Without ``[performance] journal_fsync`` the journal lives in the operating system's
    page cache until the kernel writes it back (a power loss can lose the last seconds);
    with it, every batch is flushed to the disk before its results are returned.

How
    * Every backend step appends one record (its ticks, in order) to the open journal
      segment before the step's results go back to the callers. Releases of a market's
      slot that replay could not reproduce (idle eviction, a reset, a model swap with
      reset) are journaled too. Warm-up (scratch) ticks are not.
    * A segment is a file ``<state_dir>/journal/<base seq, 20 digits>.journal`` of
      ``journal_segment_size`` bytes, reserved on disk when it is created (so a full disk
      shows when a segment is created, never in the middle of a batch), mapped into
      memory: appending is a copy into the page cache, no system call. Its format, and
      what a crash in the middle of an append leaves (a torn tail, dropped) or damage
      (the records before it are applied and the file is quarantined), are in
      :mod:`.segments`. The next segment's file is made ahead of time by a worker thread
      (:data:`.segments.SPARE`, reserved and flushed, holding no record): starting a segment
      on the event loop (at a checkpoint, or when the open one is full) writes its header and
      renames it, without waiting for the disk; its flushes are left to the next checkpoint's
      worker thread, before that checkpoint is written (with ``journal_fsync``: at once, before
      its first record). Without one (the first segment after a start, a file that could not be
      made ahead) the segment is created on the loop, with the waits and failures below.
    * A checkpoint (every ``checkpoint_interval_s``, when a segment is full, when the
      model changes, when a market's state is imported, and at shutdown) copies the live
      states between two batches, starts a new segment, and writes ``market_state.bin``
      atomically (temporary file, fsync, rename, SHA-256; :mod:`.persistence`) in a
      worker thread with the sequence number it includes; then the segments it covers
      are deleted. Replay at start is therefore bounded by one checkpoint interval (or
      one segment) of ticks. A checkpoint for a change that replay cannot reproduce (a
      model swap, an imported state) is written even when no record was appended since
      the previous one, and its segment carries the new model's fingerprint.
    * Each state dir has an identity: a random id in ``<state_dir>/state-id`` (written
      atomically, checksummed like the checkpoint), created with the state dir, copied
      with it by a backup of the whole dir, and recorded in every checkpoint and every
      segment header. At start, a checkpoint or segment whose id is not this dir's came
      from another service's state dir: it is moved aside as foreign (ERROR), never
      applied (a copied checkpoint's journal position would make this dir's journal look
      "already included" and drop its acknowledged ticks). Files without an id (written
      before identities) are used as before; a state dir without ``state-id`` takes the
      id its checkpoint (else its journal) carries, or a new one.
    * At start (:meth:`Durability.recover`): lock the state dir, restore the checkpoint,
      replay every later record through the engine's own step path (so the state is
      bit-identical), write a fresh checkpoint, open a new segment. Unusable files are
      moved aside (``<name>.corrupt-<UTC time>``, ``<name>.foreign-<UTC time>``) and
      logged, never overwritten or deleted.

Failures
    A journal or checkpoint write that fails (an I/O error, a read-only file system,
    permissions) is fatal: the batch's callers get an error, nothing more is acknowledged
    or stepped (later ticks, queued or new, are refused before they change a state),
    ``on_fatal`` is called (the service stops with exit code 1) and the error is logged
    with the path and errno. No final checkpoint is written then (the pool may hold the
    failed step): the previous checkpoint and the journal, kept, hold exactly the
    acknowledged ticks. Writing to or flushing a segment already open (its blocks
    reserved) fails only on an I/O error, which is fatal whatever its errno: after a
    failed flush the page cache cannot be trusted to hold what was appended.

    The exceptions are what passes once the host frees something: no file descriptor
    (EMFILE, ENFILE) or no disk space (ENOSPC, EDQUOT) for a *new* file
    (:data:`WAITABLE`; the file is removed again, nothing written before is touched).
    A periodic checkpoint that finds none is skipped with one WARNING (:meth:`_skipped`)
    and tried again at the next interval. Every segment keeps room at its end for one
    whole batch (:func:`.segments.batch_bound`): an append that ends past the rest starts
    the next segment first, and when that cannot be created the record goes into the
    room kept, the journal is :attr:`~Durability.stalled` (one WARNING), and nothing more
    is appended until :meth:`~Durability.resume` creates the next segment: each new tick,
    reset, model swap and import tries it (for want of disk space, at most every
    :data:`SPACE_RETRY_S`) and, failing, is refused
    (:class:`~cerebellar_norse.errors.JournalWaitError`, 503 with ``Retry-After``) before
    it changes anything. A segment therefore never grows past the size its header records. A model swap or an import
    whose checkpoint finds no descriptor or space (its segment started, or its ``market_state.bin`` not written) is
    refused the same way and undone; a segment started for it, holding no record yet, takes the kept model's
    fingerprint back in its header (:meth:`Durability._refingerprint`), so the journal goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import mmap
import os
import struct
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zlib import crc32

from ..errors import (
    CerebellarNorseError,
    CheckpointError,
    ForeignStateDirError,
    JournalWaitError,
    StorageError,
    TickOrderError,
)
from ..storage import read_refused, retrying
from ..ticks import Tick, check_order
from .persistence import LEGACY_DIR, check_writable, fingerprint_json, quarantine, write_snapshot
from .segments import (
    BODY,
    HEADER_SIZE,
    ID,
    JOURNAL_DIR,
    KIND_RELEASE,
    KIND_TICKS,
    ONE,
    REC,
    SPARE,
    SUFFIX,
    TICK,
    SegmentReader,
    Unsynced,
    adopt_spare,
    batch_bound,
    create_segment,
    list_segments,
    misplaced_entries,
    prepare_spare,
    record_bound,
    segment_name,
    segment_state_id,
    set_fingerprint,
    sync_segment,
)
from .state_dir import STATE_ID_FILE, StateDirLock, read_state_id, write_state_id

if TYPE_CHECKING:
    from .engine import Engine

OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)  # too many open files: passes once some are closed
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)  # full disk, quota used up: passes once space is freed
# creating a new file (a segment, a checkpoint's temporary file) failed for want of something the host gives back:
# the journal waits (or a periodic checkpoint is skipped) instead of failing. A read-only file system (EROFS: usually
# remounted so after I/O errors), permissions (EACCES, EPERM) and I/O errors (EIO) are fatal: they do not pass by
# themselves, and the start that follows names them in one line.
WAITABLE = OUT_OF_DESCRIPTORS + OUT_OF_SPACE
# while the journal waits for disk space, its next file is tried at most this often (s): a try reserves as much of the
# file's size as the disk has and gives it back, work a refused tick per try would repeat thousands of times a second
# (a missing descriptor costs one failed open: tried with every refused change)
SPACE_RETRY_S = 0.25
# a periodic checkpoint's write (a worker thread: flushes of the segments and market_state.bin, the rename) still under
# way after this long (s) is said at WARNING: a disk that does not answer (a hung network mount, a failing device)
# otherwise showed nowhere while the journal grew, only in DEBUG lines once the checkpoint ended
SLOW_CHECKPOINT_S = 30.0


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path`` (None when there is none or it cannot be read): a rename over it shows."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def waiting_for(exc: StorageError, state_dir: Path) -> tuple[str, str]:
    """(what the journal waits for, what frees it) when a new file failed with ``exc`` (an errno of :data:`WAITABLE`)."""
    if exc.errno == errno.EAGAIN:  # (a periodic checkpoint only: no thread to write it)
        return ("a thread", "raise the service's task limit (TasksMax=, ulimit -u) or free memory")
    if exc.errno in OUT_OF_DESCRIPTORS:
        return ("a file descriptor", "close files or connections of the process, or raise its open-file limit "
                "(LimitNOFILE=)")
    if exc.errno == errno.EDQUOT:
        return ("disk space (disk quota exceeded)", f"free space in the state dir {state_dir} or raise the disk quota "
                "of the service's user")
    return ("disk space (no space left on device)", f"free space on the file system of the state dir {state_dir}")

log = logging.getLogger("cerebellar_norse.journal")

_PAGE = mmap.PAGESIZE


@dataclass
class RecoveryReport:
    """What :meth:`Durability.recover` found and did."""

    markets: int = 0  # markets restored from the checkpoint
    checkpoint_seq: int | None = None  # journal position the checkpoint includes (None: no usable checkpoint)
    records: int = 0  # journal records replayed
    ticks: int = 0  # ticks replayed
    seq: int = 0  # journal position after recovery
    quarantined: list[str] = field(default_factory=list)
    seconds: float = 0.0


ID_CACHE_MIN = 1024  # market ids whose journal encoding is kept at least (the pool's slots x 2 when more)


class Durability:
    """The journal and checkpoints of one engine's market states.

    ``recover()`` once at start (it attaches the journal to the engine), ``run()`` as a
    task for the periodic checkpoints, ``close(save)`` at shutdown (the engine's
    ``drain`` does it). The engine calls :meth:`ticks` after every backend step,
    :meth:`release` when a market's slot is released and :meth:`model_changed` after a
    model swap; all on the event loop's thread.

    Args:
        engine: the engine whose pool is journaled; ``cfg.paths.state_dir`` and
            ``[performance] journal_fsync``, ``journal_segment_size``,
            ``checkpoint_interval_s`` are read from its config.
        on_fatal: called once with the error when a write fails.
        lock: the state dir's lock when the caller already holds it (the service takes
            it before loading models); otherwise :meth:`recover` takes it.
    """

    def __init__(self, engine: Engine, on_fatal: Callable[[StorageError], None] | None = None,
                 lock: StateDirLock | None = None) -> None:
        perf = engine.cfg.performance
        self.engine = engine
        self.state_dir = engine.state_path().parent
        self.dir = self.state_dir / JOURNAL_DIR
        self.fsync = perf.journal_fsync
        self.segment_size = int(perf.journal_segment_size)
        self.interval_s = perf.checkpoint_interval_s
        self.max_record = record_bound(engine.batch_size)
        # what one batch appends at most: kept free at the end of every segment, so that the batch in whose middle
        # the next segment cannot be created (no file descriptor or disk space) still has its place in this one
        self.reserve = batch_bound(engine.batch_size) + REC.size
        self.on_fatal = on_fatal
        self.seq = 0  # last record written
        self.failed: StorageError | None = None
        self.closed = False
        self.checkpoints = 0
        self._mm: mmap.mmap | None = None
        self._pos = HEADER_SIZE
        self._size = 0
        self._soft = 0  # an append ending past this offset starts the next segment first (the rest is the reserve)
        self._base = 0
        # the next segment could not be created for want of a file descriptor or disk space (WAITABLE): the open one
        # is past its size target, and new batches (resets, model swaps, imports) are refused until it can (resume())
        self.stalled: StorageError | None = None
        self._stalled_at = 0.0
        self._retry_at = 0.0  # while stalled for want of disk space: no try before this time (time.monotonic())
        self.stalls = 0  # how often that happened (a counter for /metrics)
        self._skips = 0  # periodic checkpoints skipped in a row (WAITABLE): the first one says so at WARNING
        # called on the loop after each periodic checkpoint written: the state dir took a file again (the service
        # writes the job records a full disk refused then)
        self.on_checkpoint: Callable[[], None] | None = None
        self._seg_fp: dict[str, Any] = {}  # the fingerprint in the open segment's header
        self._segments: list[tuple[int, Path]] = []  # oldest first; the last is the open one
        self._ids: dict[str, tuple[struct.Struct, bytes, int, int]] = {}
        # ids of markets the pool no longer holds stay in _ids until it is cleared: about 600 bytes each, which a
        # churn of new market ids (one a second) piled up to 60 MB over a day under a cap of 100,000
        self._ids_cap = max(ID_CACHE_MIN, 2 * engine.pool.capacity)
        self._lock = lock  # the state dir's lock: taken by recover() unless the caller holds it
        self._owns_lock = False
        self._write_lock = threading.Lock()
        self._written_seq = -1  # journal position of the newest checkpoint on disk
        self._wake: asyncio.Event | None = None
        # the next segment's file, reserved and flushed ahead of time by a worker thread (segments.SPARE): starting a
        # segment on the loop then waits for no disk; _spare_lock is held while it is made, taken or removed
        self._spare = False
        self._spare_lock = threading.Lock()
        self._unsynced: list[Unsynced] = []  # segments started from the spare, not flushed yet (oldest first)
        self._unsynced_lock = threading.Lock()
        self.state_id: str | None = None  # this state dir's identity (set by recover)

    # -- the hot path ------------------------------------------------------------------

    def ticks(self, ticks: Sequence[Tick]) -> None:
        """Append one backend step's ticks (called before their results are returned)."""
        if self.failed is not None:
            raise self.failed
        seq = self.seq + 1
        ids = self._ids
        if len(ticks) == 1:  # one struct call per record: the id is packed by a struct made for its length
            t = ticks[0]
            one, idb, n, idlen = ids.get(t.market_id) or self._id(t.market_id)
            body = one.pack(seq, KIND_TICKS, 1, t.price, t.volume, t.timestamp, idlen, idb)
        else:
            parts = [BODY.pack(seq, KIND_TICKS, len(ticks))]
            pack = TICK.pack
            for t in ticks:
                idb = (ids.get(t.market_id) or self._id(t.market_id))[1]
                parts.append(pack(t.price, t.volume, t.timestamp, len(idb)))
                parts.append(idb)
            body = b"".join(parts)
            n = len(body)
        pos = self._pos  # the append, inlined (the hot path): see _append
        end = pos + REC.size + n
        if end > self._soft:
            self._append(body, seq)
            return
        mm = self._mm
        assert mm is not None
        mm[pos:end] = REC.pack(n, crc32(body)) + body
        self._pos = end
        self.seq = seq
        if self.fsync:
            self._flush(pos, end)

    def release(self, market: str) -> None:
        """Journal that ``market``'s slot was released (its next tick starts from rest)."""
        if self.engine._scratch or self.closed or self.failed is not None:  # warm-up, replay; or stopping
            return
        idb = (self._ids.get(market) or self._id(market))[1]
        with contextlib.suppress(StorageError):  # already logged and fatal: nothing more is acknowledged
            self._append(BODY.pack(self.seq + 1, KIND_RELEASE, 1) + ID.pack(len(idb)) + idb, self.seq + 1)

    def _id(self, market: str) -> tuple[struct.Struct, bytes, int, int]:
        """(struct of a one-tick body with this id, the id's bytes, that body's size, the id's length), per market."""
        if len(self._ids) >= self._ids_cap:
            self._ids.clear()
        b = market.encode("utf-8")
        if len(b) > 255:
            raise ValueError(f"market id of {len(b)} bytes cannot be journaled (at most 255)")
        one = struct.Struct(f"{ONE.format}{len(b)}s")
        entry = self._ids[market] = (one, b, one.size, len(b))
        return entry

    def _append(self, body: bytes, seq: int) -> None:
        pos = self._pos
        end = pos + REC.size + len(body)
        if end > self._soft and self.stalled is None:  # the segment reached its size target: start the next one
            self._roll(len(body), can_wait=True)  # no descriptor for it: stalled, the record goes into the reserve
            pos = self._pos
            end = pos + REC.size + len(body)
        if end + REC.size > self._size:  # the reserve is used up too (stalled): without a new segment, fatal
            self._roll(len(body))
            pos = self._pos
            end = pos + REC.size + len(body)
        mm = self._mm
        assert mm is not None
        mm[pos:end] = REC.pack(len(body), crc32(body)) + body
        self._pos = end
        self.seq = seq
        if self.fsync:
            self._flush(pos, end)

    def _flush(self, pos: int, end: int) -> None:
        """msync the pages of ``[pos, end)`` to the disk (``journal_fsync``)."""
        start = pos - pos % _PAGE
        assert self._mm is not None
        try:
            self._mm.flush(start, end - start)
        except OSError as exc:
            raise self._fail(StorageError.from_os_error("cannot flush the journal", self._segments[-1][1], exc)) from None

    def _roll(self, need: int, can_wait: bool = False) -> None:
        """The open segment is full: start the next one (and wake the checkpointer). ``can_wait``: the open one still
        has its reserve, so a missing file descriptor or disk space stalls the journal (:meth:`_stall`) instead of
        failing it."""
        try:
            self._open_segment(self._segment_bytes(need), can_wait=can_wait)
        except StorageError as exc:
            if exc.reported:  # failed (logged, fatal)
                raise
            self._stall(exc)
            return
        if self._wake is not None:
            self._wake.set()

    def _segment_bytes(self, need: int = 0) -> int:
        """The size of a new segment: ``journal_segment_size``, or more where a record of ``need`` bytes or the
        reserve would not leave room for records."""
        return max(self.segment_size, HEADER_SIZE + 2 * self.reserve, HEADER_SIZE + 2 * (need + 2 * REC.size))

    def _stall(self, exc: StorageError) -> None:
        """The next segment cannot be created for want of a file descriptor or disk space: one WARNING; the open
        segment's reserve takes the rest of the batch, and :meth:`resume` tries again before anything more is
        appended."""
        self.stalled = exc
        self._stalled_at = time.monotonic()
        self._retry_at = self._stalled_at + SPACE_RETRY_S
        self.stalls += 1
        cause, remedy = waiting_for(exc, self.state_dir)
        log.warning("%s; the journal file %s is full: ticks, market resets, model activations and imports are refused "
                    "(503, Retry-After) until its next file can be created, tried again with each (every acknowledged "
                    "tick is in the journal); waiting for %s: %s", exc,
                    self._segments[-1][1] if self._segments else self.dir, cause, remedy,
                    extra={"fields": {"path": exc.path, "errno": exc.errno}})

    def wait_reason(self) -> str | None:
        """Why ticks are refused for now (``/health``'s reason) while :attr:`stalled`, else None."""
        stalled = self.stalled
        if stalled is None:
            return None
        cause, remedy = waiting_for(stalled, self.state_dir)
        return (f"journal waiting for {cause}: {stalled}; {remedy}; ticks are refused (503, Retry-After) until its "
                "next file can be created")

    def wait_error(self) -> JournalWaitError:
        """The error refusing one change of state while the journal is :attr:`stalled` (a new one per call)."""
        assert self.stalled is not None
        remedy = waiting_for(self.stalled, self.state_dir)[1]
        return JournalWaitError(f"{self.stalled}: the journal cannot start its next file, so no tick or other change of "
                                f"state is accepted until it can ({remedy}); nothing was changed, try again",
                                retry_after_s=1.0)

    def resume(self) -> CerebellarNorseError | None:
        """While :attr:`stalled`, try again to start the next segment (call between batches); None when appends can go
        on, else the error refusing the caller's change (:meth:`wait_error`, or the journal's failure when the try
        failed otherwise: read-only disk, permissions, I/O error, as any failed state write). For want of disk space
        the file is tried at most every :data:`SPACE_RETRY_S`; a change in between is refused without a try."""
        if self.stalled is None or self.closed:
            return None
        if self.failed is not None:
            return self.refusal()
        now = time.monotonic()
        if self.stalled.errno in OUT_OF_SPACE and now < self._retry_at:
            return self.wait_error()
        try:
            self._open_segment(self._segment_bytes(), can_wait=True)
        except StorageError as exc:
            if exc.reported:
                return self.refusal()
            self.stalled = exc
            self._retry_at = now + SPACE_RETRY_S
            return self.wait_error()
        if self._wake is not None:
            self._wake.set()  # checkpoint the full segment (and remove it)
        return None

    def _check_in_place(self) -> None:
        """Raise (and fail the journal, see :meth:`_fail`) when the state dir was moved or replaced while held: a
        write by its path would start a new state dir there, without this one's models, identity or lock."""
        why = self._lock.moved() if self._lock is not None else None
        if why is not None:
            raise self._fail(StorageError(
                f"state dir {self.state_dir} {why}: it was moved or replaced while the service ran, and nothing more is "
                "written by its path; its journal and checkpoint are in the directory as moved: put it back (or point "
                "paths.state_dir at it) and start the service again", str(self.state_dir)))

    def _open_segment(self, size: int | None = None, can_wait: bool = False) -> None:
        """Start a new segment at the current position. ``can_wait``: the caller can wait for it (a periodic
        checkpoint's rotation, a full segment with its reserve, a swap or import refused for now), so running out of
        file descriptors or disk space (:data:`WAITABLE`) raises the error unlogged instead of failing the journal."""
        self._check_in_place()
        size = size or self.segment_size
        fp = self.engine.fingerprint()
        try:
            path, mm = self._new_segment(fp, size)
        except OSError as exc:
            err = StorageError.from_os_error("cannot create journal file", self.dir / segment_name(self.seq), exc)
            if can_wait and exc.errno in WAITABLE:
                raise err from None  # not logged, not fatal: the caller says what it does instead
            raise self._fail(err) from None
        if self._mm is not None:
            self._mm.close()
        if self._segments and self._segments[-1][0] == self.seq:
            self._segments.pop()  # the open segment held no record: the new one, of the same name, replaced it
        self._mm, self._pos, self._size, self._base, self._seg_fp = mm, HEADER_SIZE, size, self.seq, fp
        self._soft = size - self.reserve
        self._segments.append((self.seq, path))
        if self.stalled is not None:
            log.info("journal file %s created: ticks are accepted again (refused for %.1f s)", path,
                     time.monotonic() - self._stalled_at, extra={"fields": {"path": str(path)}})
            self.stalled = None

    def _new_segment(self, fp: dict[str, Any], size: int) -> tuple[Path, mmap.mmap]:
        """The file of a new segment at the current position: the spare made ahead of time when there is one of
        ``size`` bytes (no wait for the disk: its flush is left to the checkpoint's worker thread, see
        :meth:`_sync_pending`; with ``journal_fsync`` it is flushed here, before any record of it is), else a new
        file created, reserved and flushed here (:func:`.segments.create_segment`)."""
        if self._spare and self._spare_lock.acquire(blocking=False):
            try:
                self._spare = False
                got = adopt_spare(self.dir, self.seq, fp, size, self.state_id, self.engine.pool.capacity,
                                  self.max_record)
            finally:
                self._spare_lock.release()
            if got is not None:
                path, mm, unsynced = got
                with self._unsynced_lock:
                    self._unsynced.append(unsynced)
                if self.fsync:
                    try:
                        self._sync_pending()
                    except StorageError as exc:
                        mm.close()
                        raise self._fail(exc) from None
                return path, mm
        return create_segment(self.dir, self.seq, fp, size, self.state_id, self.engine.pool.capacity, self.max_record)

    def _sync_pending(self) -> None:
        """Flush the segments started from the spare and not flushed yet (any thread): before the checkpoint that
        covers the segments before them is written, at shutdown, and at once with ``journal_fsync``.

        Raises:
            StorageError: a flush failed (an I/O error): fatal, as a failed flush of the open segment.
        """
        while True:
            with self._unsynced_lock:
                if not self._unsynced:
                    return
                unsynced = self._unsynced.pop(0)
            try:
                sync_segment(unsynced)
            except OSError as exc:
                raise StorageError.from_os_error("cannot flush the journal", unsynced.path, exc) from None

    def _prepare_spare(self) -> None:
        """Make the next segment's file ahead of time (a worker thread), unless there is one. One that cannot be made
        (no descriptor or disk space, a read-only disk) is not: the next segment is then created when it is needed,
        where a failure has its effect (a wait, a skipped checkpoint, or a fatal error)."""
        if self._spare or self.closed or self.failed is not None or self.stalled is not None:
            return
        if not self._spare_lock.acquire(blocking=False):
            return
        try:
            if self.closed:
                return
            prepare_spare(self.dir, self._segment_bytes())
            self._spare = True
        except OSError as exc:
            log.debug("next journal file not made ahead of time: %s", exc,
                      extra={"fields": {"path": str(self.dir), "errno": exc.errno}})
        finally:
            self._spare_lock.release()

    def _background(self, snap: Any, fingerprint: dict[str, Any], seq: int) -> bool:
        """A periodic checkpoint's work in a worker thread: flush the segments started since the last one, write the
        checkpoint (:meth:`_write`), then make the next segment's file ahead of time (:meth:`_prepare_spare`)."""
        self._sync_pending()
        wrote = self._write(snap, fingerprint, seq)
        self._prepare_spare()
        return wrote

    def _drop_spare(self) -> None:
        """Remove the file made ahead of time (at shutdown; a start removes one left behind too)."""
        with self._spare_lock:
            self._spare = False
            with contextlib.suppress(OSError):
                retrying((self.dir / SPARE).unlink)

    def refusal(self) -> StorageError:
        """A new error like :attr:`failed` (logged already) for one more refused call: raising the one failure again
        and again would grow its traceback, and keep every refused request's frames alive, with each raise."""
        failed = self.failed
        assert failed is not None
        exc = StorageError(str(failed), failed.path, failed.errno)
        exc.reported = True
        return exc

    def _skipped(self, exc: StorageError) -> StorageError:
        """A periodic checkpoint that found no file descriptor or disk space (:data:`WAITABLE`, for a while): skipped,
        not fatal; the open segment keeps every acknowledged tick and the next interval tries again. The first skip
        of a run says so at WARNING, the others at DEBUG (a full disk for hours is one line, not one a minute);
        :meth:`_written_again` says when one is written again."""
        if self._skips == 0:
            log.warning("%s; checkpoint skipped, tried again in %g s (every acknowledged tick is in the journal; %s; "
                        "said once until a checkpoint is written again)", exc, self.interval_s,
                        waiting_for(exc, self.state_dir)[1], extra={"fields": {"path": exc.path, "errno": exc.errno}})
        else:
            log.debug("%s; checkpoint skipped again", exc, extra={"fields": {"path": exc.path, "errno": exc.errno}})
        self._skips += 1
        exc.reported = True
        return exc

    def _written_again(self) -> None:
        """A checkpoint was written: after skipped ones, one INFO line says so."""
        if self._skips:
            log.info("checkpoint written again after %d skipped", self._skips,
                     extra={"fields": {"skipped": self._skips, "path": str(self.engine.state_path())}})
            self._skips = 0

    def _fail(self, exc: StorageError) -> StorageError:
        if self.failed is None:
            self.failed = exc
            log.error("%s; no further tick is acknowledged, the service stops (every acknowledged tick is in the journal "
                      "and the last checkpoint)", exc, extra={"fields": {"path": exc.path, "errno": exc.errno}})
            exc.reported = True
            if self.on_fatal is not None:
                self.on_fatal(exc)
        return exc

    # -- checkpoints -------------------------------------------------------------------

    def _rotate(self, fingerprint: dict[str, Any], can_wait: bool = False) -> None:
        """Start a new segment at the current position when the open one holds records; one that holds none but is of
        another model takes the new fingerprint in its header instead (:meth:`_refingerprint`)."""
        if self._pos > HEADER_SIZE:
            self._open_segment(can_wait=can_wait)
        elif self._seg_fp != fingerprint:
            self._refingerprint(fingerprint)

    def _refingerprint(self, fingerprint: dict[str, Any]) -> None:
        """Give the open segment, which holds no record, ``fingerprint`` in its header, in place: no new file (it
        would have the open one's name), so no descriptor or disk space is needed, and the way back for a refused swap
        (:meth:`checkpoint_now`) is the same. A flush that fails is an I/O error: fatal."""
        assert self._mm is not None and self._pos == HEADER_SIZE
        try:
            set_fingerprint(self._mm, fingerprint)
        except OSError as exc:
            raise self._fail(StorageError.from_os_error("cannot write the header of journal file", self._segments[-1][1],
                                                        exc)) from None
        self._seg_fp = fingerprint

    def _write(self, snap: Any, fingerprint: dict[str, Any], seq: int, force: bool = False) -> bool:
        """Write a checkpoint at ``seq`` unless one as new is already on disk (any thread).

        ``force``: the state changed outside the journal (model swap, import), so a
        checkpoint at the same ``seq`` as the one on disk is not the same state: write it.
        """
        with self._write_lock:
            if seq < self._written_seq or (seq == self._written_seq and not force):
                return False
            write_snapshot(snap, self.engine.state_path(), fingerprint, seq, self.state_id)
            self._written_seq = seq
            return True

    def _drop_covered(self) -> None:
        """Delete the segments whose records the newest checkpoint includes (never the open one).

        One that cannot be deleted (an I/O error, a read-only file system, permissions taken away) fails the journal
        as any failed state write does (:meth:`_fail`: one ERROR, the service stops): the checkpoint is written, and
        the file is kept (a restart skips the records it covers).
        """
        keep: list[tuple[int, Path]] = []
        segs = self._segments
        for i, (base, path) in enumerate(segs):
            nxt = segs[i + 1][0] if i + 1 < len(segs) else None
            if nxt is not None and nxt <= self._written_seq and self.failed is None:
                try:
                    retrying(path.unlink)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    self._fail(StorageError.from_os_error("cannot delete journal file", path, exc))
                    keep.append((base, path))
            else:
                keep.append((base, path))
        self._segments = keep

    def checkpoint_now(self) -> int:
        """Write a checkpoint synchronously (between batches), always; returns the markets saved.

        For changes of the states or the model that replaying the journal cannot
        reproduce (a model swap, an imported state): written even when no record was
        appended since the last checkpoint.
        """
        if self.failed is not None:
            raise self.failed
        self._check_in_place()
        snap, fp, seq = self.engine.snapshot_state(), self.engine.fingerprint(), self.seq
        kept_fp = self._seg_fp  # the served model's (before a swap): the journal goes on with it if this is refused
        try:
            self._rotate(fp, can_wait=True)
        except StorageError as exc:
            if exc.reported:  # failed (logged, fatal)
                raise
            raise JournalWaitError(f"{exc}: the journal cannot start the file this change needs, so it is refused and "
                                   f"nothing was changed ({waiting_for(exc, self.state_dir)[1]}); try again",
                                   retry_after_s=1.0) from None
        try:
            self._sync_pending()
        except StorageError as exc:
            raise self._fail(exc) from None
        path = self.engine.state_path()
        on_disk = _file_id(path)
        try:
            self._write(snap, fp, seq, force=True)
        except OSError as exc:
            err = StorageError.from_os_error("cannot write checkpoint", path, exc)
            if exc.errno not in WAITABLE or _file_id(path) != on_disk:  # (renamed, then the directory's flush failed)
                raise self._fail(err) from None
            # no descriptor or space for market_state.bin's temporary file (removed again): the previous checkpoint is
            # whole, and the open segment holds no record yet: it goes on with the model kept (the caller undoes the
            # change), so the journal stays right for a replay; the change is refused for now, not fatal
            if self._seg_fp != kept_fp:
                self._refingerprint(kept_fp)
            log.warning("%s; the change is refused (503, Retry-After) and undone, the service goes on (%s)", err,
                        waiting_for(err, self.state_dir)[1], extra={"fields": {"path": err.path, "errno": err.errno}})
            raise JournalWaitError(f"{err}: the checkpoint this change needs cannot be written, so it is refused and "
                                   f"nothing was changed ({waiting_for(err, self.state_dir)[1]}); try again",
                                   retry_after_s=1.0) from None
        self.checkpoints += 1
        self._written_again()
        self._drop_covered()
        return len(snap.markets)

    async def checkpoint(self) -> bool:
        """Snapshot between batches on the loop, write it in a worker thread; True when one was written."""
        if self.failed is not None or self.closed:
            return False
        if self.seq == self._written_seq:
            if not self._spare and self.stalled is None:  # nothing to checkpoint: make the next segment's file
                with contextlib.suppress(RuntimeError):  # (no thread for it: made at a later interval)
                    await asyncio.get_running_loop().run_in_executor(None, self._prepare_spare)
            return False
        snap, fp, seq = self.engine.snapshot_state(), self.engine.fingerprint(), self.seq
        try:
            self._check_in_place()
            self._rotate(fp, can_wait=True)
        except StorageError as exc:
            if not exc.reported and self.stalled is None:  # (while stalled, its WARNING said it)
                self._skipped(exc)
            return False
        t0 = time.monotonic()
        try:
            wrote = await self._watched(asyncio.get_running_loop().run_in_executor(None, self._background, snap, fp, seq),
                                        t0)
        except StorageError as exc:  # a flush of a segment started from the spare failed: fatal
            self._fail(exc)
            return False
        except RuntimeError as exc:  # no thread for the write ("can't start new thread": the task limit): skipped
            path = self.engine.state_path()
            self._skipped(StorageError(f"cannot write checkpoint {path}: cannot start a thread to write it ({exc})",
                                       str(path), errno.EAGAIN))
            return False
        except OSError as exc:
            err = StorageError.from_os_error("cannot write checkpoint", self.engine.state_path(), exc)
            if exc.errno in WAITABLE:  # market_state.bin's temporary file (removed again): the previous file is whole
                self._skipped(err)
            else:
                self._fail(err)
            return False
        if not wrote:
            return False
        self.checkpoints += 1
        self._written_again()
        self._drop_covered()
        if self.on_checkpoint is not None:
            self.on_checkpoint()
        log.debug("checkpoint written", extra={"fields": {"seq": seq, "markets": len(snap.markets),
                                                          "seconds": round(time.monotonic() - t0, 4)}})
        return True

    async def _watched(self, write: asyncio.Future[bool], t0: float) -> bool:
        """The result of a periodic checkpoint's ``write`` (started at ``t0``, ``time.monotonic()``), saying at WARNING
        once it has taken :data:`SLOW_CHECKPOINT_S` s, and at INFO when such a slow one ends (written or not)."""
        done, _ = await asyncio.wait({write}, timeout=SLOW_CHECKPOINT_S)
        if done:
            return write.result()
        path = self.engine.state_path()
        log.warning("checkpoint of %s still not written after %g s: the disk of the state dir %s is slow or does not "
                    "answer (a flush waits for it); ticks are still served and journaled, and the journal grows until "
                    "a checkpoint is written (a restart after a crash replays it all): look at the disk (iostat -x 1, "
                    "journalctl -k)", path, SLOW_CHECKPOINT_S, self.state_dir,
                    extra={"fields": {"path": str(path), "seconds": SLOW_CHECKPOINT_S}})
        cancelled = False
        try:
            return await write
        except asyncio.CancelledError:  # (the service stops; the write goes on in its thread)
            cancelled = True
            raise
        finally:
            if not cancelled:
                log.info("slow checkpoint of %s ended after %.1f s", path, time.monotonic() - t0,
                         extra={"fields": {"path": str(path), "seconds": round(time.monotonic() - t0, 1)}})

    def model_changed(self) -> None:
        """The served model changed: checkpoint now, so no record is ever replayed under another model."""
        if not self.closed:
            self.checkpoint_now()

    async def run(self) -> None:
        """Checkpoint every ``checkpoint_interval_s``, and as soon as a segment fills up (run as a task)."""
        self._wake = asyncio.Event()
        with contextlib.suppress(RuntimeError):  # the first segment started after the start's waits for no disk either
            await asyncio.get_running_loop().run_in_executor(None, self._prepare_spare)
        while not self.closed and self.failed is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval_s)
            self._wake.clear()
            if not self.closed:
                try:
                    await self.checkpoint()
                except Exception as exc:  # never end the periodic checkpoints silently (the journal would only grow)
                    log.exception("periodic checkpoint failed: %s; tried again in %g s", exc, self.interval_s)

    # -- start and stop ----------------------------------------------------------------

    def _lock_state_dir(self) -> None:
        if self._lock is None:
            self._lock = StateDirLock(self.state_dir).acquire()
            self._owns_lock = True

    def _unlock(self) -> None:
        if self._lock is not None and self._owns_lock:
            self._lock.release()
            self._lock = None

    def recover(self) -> RecoveryReport:
        """Restore the checkpoint, replay the journal after it, write a fresh checkpoint and open the journal.

        Raises:
            StorageError: the state dir cannot be written or locked (nothing was changed on disk then).
        """
        t0 = time.monotonic()
        rep = RecoveryReport()
        check_writable(self.state_dir)
        self._lock_state_dir()
        try:
            return self._recover(rep, t0)
        except BaseException:
            self._unlock()
            raise

    def _recover(self, rep: RecoveryReport, t0: float) -> RecoveryReport:
        eng = self.engine
        for p in self.dir.glob(f".*{SUFFIX}.tmp") if self.dir.is_dir() else ():
            p.unlink()  # a segment whose creation a crash interrupted: never held a record
        with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):  # (a directory: moved aside)
            (self.dir / SPARE).unlink()  # the next segment's file made ahead of time by a service that crashed: no record
        for name in (eng.state_path().name, STATE_ID_FILE):
            for p in self.state_dir.glob(f".{name}.*.tmp"):
                p.unlink()  # a checkpoint (identity) whose writing a crash interrupted (the previous file is whole)
        dir_id = self._read_state_id(rep)  # None: no identity yet (a new state dir, or one written before identities)
        for path, what in misplaced_entries(self.dir):  # holds no record: nothing acknowledged is lost by moving it
            self._quarantine(path, "misplaced", f"it is {what}", rep)
        segments = list_segments(self.dir)
        peeked = [segment_state_id(path) for _, path in segments]
        expect = dir_id
        if dir_id is None and any(ok and sid is None for ok, sid in peeked):
            expect = LEGACY_DIR  # a journal written before identities: a checkpoint that has one came from elsewhere
        had_checkpoint = eng.state_path().exists() or eng.state_path().is_symlink()
        rep.markets = eng.restore_state(state_id=expect)  # an unusable or foreign file is moved aside and logged
        ckpt = eng.restored_journal_seq
        rep.checkpoint_seq = ckpt
        refused = eng.restore_refused
        foreign_ckpt = refused is not None and isinstance(refused[0], ForeignStateDirError)
        if dir_id is None:
            dir_id = eng.restored_state_id or (None if expect == LEGACY_DIR else next((sid for _, sid in peeked if sid), None))
            self._create_state_id(dir_id)
        else:
            self.state_id = dir_id
        eng.state_id = self.state_id
        fp = fingerprint_json(eng.fingerprint())
        seq: int | None = ckpt
        if seq is None and segments and segments[0][0] == 0 and not had_checkpoint:
            seq = 0  # no checkpoint yet: the journal starts from an empty pool
        replayed: list[Path] = []
        bad = ""
        evictions = eng.pool.table.evictions
        fewer_slots = False  # a replayed segment was written by a pool of more slots (max_markets lowered while stopped)
        for _base, path in segments:
            if bad:
                self._quarantine(path, "corrupt", f"it follows a journal part that cannot be applied ({bad})", rep)
                continue
            try:
                reader = SegmentReader(path, self.max_record, last=path == segments[-1][1])
            except (OSError, ValueError) as exc:
                if isinstance(exc, OSError) and read_refused(exc):  # maybe intact (permissions, an I/O error, no
                    # descriptor or memory): moving it aside would drop acknowledged ticks
                    raise StorageError.from_os_error("cannot read journal file", path, exc) from None
                bad = f"{path.name}: {exc}"
                self._quarantine(path, "corrupt", str(exc), rep)
                continue
            if reader.state_id is not None and reader.state_id != self.state_id:  # no gap: the next one's base shows it
                self._quarantine(path, "foreign", f"written by another state dir (its state id is {reader.state_id}; this "
                                 f"state dir's is {self.state_id}, in {self.state_dir / STATE_ID_FILE})", rep)
                continue
            if seq is None:
                foreign = fingerprint_json(reader.fingerprint) != fp
                if foreign_ckpt and not foreign:
                    assert refused is not None
                    bad = (f"the checkpoint it continues is not in this state dir any more: {eng.state_path()} was moved "
                           f"aside to {refused[1]}, it was {refused[0].reason}; put this state dir's own "
                           f"{eng.state_path().name} (from a backup) back with this file to apply it")
                else:
                    bad = ("written for another network or model, after a checkpoint that is missing or unusable" if foreign
                           else "the checkpoint it continues is missing or unusable")
                self._quarantine(path, "foreign" if foreign else "corrupt", bad, rep)
                continue
            if reader.base > seq:
                bad = f"records {seq + 1} to {reader.base} are missing"
                self._quarantine(path, "corrupt", bad, rep)
                continue
            if fingerprint_json(reader.fingerprint) != fp:
                if any(r.seq > seq for r in reader.records()):
                    bad = f"written for another network or model ({reader.fingerprint})"
                    self._quarantine(path, "foreign", bad, rep)
                elif reader.damage is not None:  # a gap it leaves shows in the next segment's base
                    self._quarantine(path, "corrupt", f"{reader.damage}; every record it still holds is in the checkpoint", rep)
                else:
                    replayed.append(path)  # every record is in the checkpoint
                continue
            fewer_slots = fewer_slots or reader.capacity is None or reader.capacity > eng.pool.capacity
            seq = self._replay(reader, seq, rep)
            if reader.unfinished:
                log.warning("dropped the unfinished last record of the journal (%d bytes, cut short by the crash, never "
                            "acknowledged)", reader.unfinished, extra={"fields": {"path": str(path)}})
            if reader.damage is not None:
                bad = f"{path.name}: {reader.damage}"
                self._quarantine(path, "corrupt", f"{reader.damage}; the records before it were applied", rep)
            else:
                replayed.append(path)
        evicted = eng.pool.table.evictions - evictions
        if evicted and not fewer_slots:  # the same evictions as when the ticks were served: nothing lost by replaying
            log.info("replaying the journal evicted %d markets, as the service did when it served those ticks",
                     evicted, extra={"fields": {"evicted": evicted, "capacity": eng.pool.capacity}})
        elif evicted:  # the pool is smaller than the markets the journal holds (max_markets lowered while stopped)
            log.warning("market state: replaying the journal evicted %d markets (least recently used; a market evicted "
                        "this way lost its state and a later tick of it started it from rest): the pool holds "
                        "performance.max_markets = %d; raise it and restore this state dir from a backup to keep them",
                        evicted, eng.pool.capacity, extra={"fields": {"evicted": evicted, "capacity": eng.pool.capacity,
                                                                       "last": eng.pool.table.last_evicted}})
        self.seq = seq or 0
        try:  # the start-up checkpoint: proves the state dir writable; the replayed journal is then covered
            self._write(eng.snapshot_state(), eng.fingerprint(), self.seq)
        except OSError as exc:
            raise StorageError.from_os_error("cannot write checkpoint", eng.state_path(), exc) from None
        for path in replayed:
            with contextlib.suppress(FileNotFoundError):
                retrying(path.unlink)
        self._seg_fp = eng.fingerprint()
        size = self._segment_bytes()
        try:
            path, self._mm = create_segment(self.dir, self.seq, self._seg_fp, size, self.state_id,
                                            eng.pool.capacity, self.max_record)
        except OSError as exc:
            raise StorageError.from_os_error("cannot create journal file", self.dir / segment_name(self.seq), exc) from None
        self._pos, self._size, self._soft, self._base = HEADER_SIZE, size, size - self.reserve, self.seq
        self._segments = [(self.seq, path)]
        eng.journal = self
        eng.pool.table.on_release = self.release
        rep.seq = self.seq
        rep.seconds = round(time.monotonic() - t0, 3)
        log.info("market state recovered", extra={"fields": {
            "markets": eng.pool.used, "from_checkpoint": rep.markets, "checkpoint_seq": rep.checkpoint_seq,
            "replayed_records": rep.records, "replayed_ticks": rep.ticks, "seq": rep.seq,
            "quarantined": rep.quarantined, "seconds": rep.seconds}})
        return rep

    def _read_state_id(self, rep: RecoveryReport) -> str | None:
        """This state dir's identity from ``state-id``; None when there is none, or it is damaged (moved aside, ERROR)."""
        try:
            return read_state_id(self.state_dir)
        except CheckpointError as exc:
            path = self.state_dir / STATE_ID_FILE
            moved = quarantine(path, "corrupt")
            rep.quarantined.append(str(moved))
            log.error("state dir identity not readable: %s; moved aside to %s; the identity of the checkpoint (else of "
                      "the journal) is taken instead", exc, moved, extra={"fields": {"path": str(path), "moved_to": str(moved)}})
            return None

    def _create_state_id(self, state_id: str | None) -> None:
        """Write ``state-id`` (``state_id``, or a new random one) before any file that carries it."""
        self.state_id = state_id or uuid.uuid4().hex
        path = self.state_dir / STATE_ID_FILE
        try:
            write_state_id(self.state_dir, self.state_id)
        except OSError as exc:
            raise StorageError.from_os_error("cannot write the state dir identity", path, exc) from None
        log.info("state dir identity %s", "taken from its files" if state_id else "created",
                 extra={"fields": {"path": str(path), "state_id": self.state_id}})

    def _quarantine(self, path: Path, reason: str, why: str, rep: RecoveryReport) -> None:
        moved = quarantine(path, reason)
        rep.quarantined.append(str(moved))
        log.error("journal file not applied: %s: %s; moved aside to %s", path, why, moved,
                  extra={"fields": {"path": str(path), "moved_to": str(moved)}})

    def _replay(self, reader: SegmentReader, seq: int, rep: RecoveryReport) -> int:
        """Apply a segment's records after ``seq`` through the engine's step path (scratch: not journaled, recorded, learned)."""
        eng = self.engine
        stats = eng.stats
        eng.stats = type(stats)()
        eng._scratch = True
        try:
            for rec in reader.records():
                if rec.seq <= seq:
                    continue
                if rec.kind == KIND_TICKS:
                    problem = self._out_of_order(reader, rec.ticks)
                    if problem is not None:
                        reader.damage = (f"record {rec.seq} holds a tick older than its market's last tick ({problem}), "
                                         "which no service journals")
                        break
                    for k in range(0, len(rec.ticks), eng.batch_size):
                        eng.process_now(rec.ticks[k:k + eng.batch_size])
                    rep.ticks += len(rec.ticks)
                else:
                    for m in rec.markets:
                        eng.pool.table.release(m)
                rep.records += 1
                seq = rec.seq
        finally:
            eng._scratch = False
            eng.stats = stats
        return seq

    def _out_of_order(self, reader: SegmentReader, ticks: list[Tick]) -> str | None:
        """Why a journaled batch cannot have been admitted in order (its first tick older than its market's last), or
        None.

        The engine admitted every journaled batch in order. A market the service evicted to make room (least recently
        used, not journaled) started from rest and may then have taken ticks older than its last one; a pool larger
        than the one the ticks were served with (``performance.max_markets`` raised while stopped, or a file that does
        not record it) still holds such a market, so there it is released before the batch, as the service had it.
        """
        pool = self.engine.pool
        try:
            check_order(ticks, pool.last_timestamp, batch=True)
            return None
        except TickOrderError as exc:
            if reader.capacity is not None and reader.capacity >= pool.capacity:
                return str(exc)  # the same (or fewer) slots: replaying evicts what serving evicted
        for m in {t.market_id for t in ticks if (last := pool.last_timestamp(t.market_id)) is not None
                  and t.timestamp < last}:
            pool.table.release(m)
        try:  # within one batch the order was checked at admission whatever the pool
            check_order(ticks, pool.last_timestamp, batch=True)
            return None
        except TickOrderError as exc:
            return str(exc)

    def close(self, save: bool) -> None:
        """At shutdown, after the last batch: write the final checkpoint (``save``), then remove the journal it covers.

        Raises:
            StorageError: the final checkpoint could not be written; the previous checkpoint
                and the journal are kept (they still hold every acknowledged tick).
        """
        if self.closed:
            return
        if self.failed is None:
            try:
                self._sync_pending()
            except StorageError as exc:
                self._fail(exc)
        if save and self.failed is None:
            with contextlib.suppress(StorageError):  # logged by _fail; then handled as any failed state write below
                self._check_in_place()
        if save and self.failed is not None:
            # The pool may hold the step whose append failed (its callers got an error): a checkpoint of it would keep
            # ticks never acknowledged, at a journal position that does not include them. The previous checkpoint
            # and the journal hold exactly the acknowledged ticks: keep them.
            log.error("final checkpoint not written after the failed state write (%s): the previous checkpoint and the "
                      "journal are kept and hold every acknowledged tick", self.failed,
                      extra={"fields": {"path": self.failed.path, "errno": self.failed.errno}})
            save = False
        try:
            if save:
                try:
                    with self._write_lock:  # after a checkpoint still being written by a worker thread
                        self.engine.save_state()
                except OSError as exc:
                    err = StorageError.from_os_error("cannot save market state", self.engine.state_path(), exc)
                    log.error("%s; the previous checkpoint and the journal are kept and hold every acknowledged tick",
                              err, extra={"fields": {"path": err.path, "errno": err.errno}})
                    raise err from None
                self._written_seq = self.seq
                if self._mm is not None:
                    self._mm.close()
                    self._mm = None
                for _, path in self._segments:
                    with contextlib.suppress(FileNotFoundError):
                        retrying(path.unlink)
                self._segments = []
        finally:
            self.closed = True
            self._drop_spare()
            with self._unsynced_lock:
                unsynced, self._unsynced = self._unsynced, []
            for u in unsynced:  # (a failed flush: the segment is kept, its descriptors closed)
                for fd in (u.fd, u.dfd):
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if self._mm is not None:
                self._mm.close()
                self._mm = None
            if self.engine.journal is self:
                self.engine.journal = None
                self.engine.pool.table.on_release = None
            self._unlock()
            if self._wake is not None:
                self._wake.set()
