"""Atomic, checksummed files: nothing half-written survives a crash.

:func:`atomic_write_bytes` writes to a temporary file in the same directory, fsyncs
it, renames it over the target and fsyncs the directory. :func:`write_checksummed`
prefixes the payload with a header carrying its SHA-256, which
:func:`read_checksummed` verifies, so truncation or bit rot is detected and the file
refused (``CheckpointError`` naming the file).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from .errors import CheckpointError, StorageError

T = TypeVar("T")

MAGIC = b"CNSUM1 "
HEADER_LEN = len(MAGIC) + 64 + 1


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's contents."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def retrying(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)``, called again while a signal interrupts it (EINTR): Python does that itself for most system
    calls (PEP 475), not for rename and unlink, which a network or FUSE file system can interrupt. An interrupted
    call is never an error."""
    while True:
        try:
            return call(*args)
        except InterruptedError:
            continue


def write_output(path: Path, data: bytes) -> None:
    """Write a command's output file (a report, a picture, a dump): a regular file (or a new one, its missing
    parent directories made) atomically, never half-written on a full disk, with the mode the umask gives; through a
    link to its target; a device, FIFO or pipe (/dev/stdout) written into, not replaced by a file."""
    try:
        target = path.resolve()
    except (OSError, RuntimeError):
        target = path
    if target.exists() and not target.is_file():
        with open(target, "wb") as fh:
            fh.write(data)
        return
    atomic_write_bytes(target, data)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(target, 0o666 & ~mask)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename, fsync dir)."""
    atomic_write(path, lambda fh: fh.write(data))


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` atomically with ``write(file)``, which writes the whole content into the open temporary file
    (temp file, fsync, rename, fsync dir): a file too large to be built in memory first is written in parts."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the directory is opened (for its flush) first: a missing descriptor then always leaves the previous file in
    # place, never shows after the rename, when the new file is already there
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            retrying(os.replace, tmp, path)
        except BaseException as exc:
            with contextlib.suppress(FileNotFoundError):
                retrying(os.unlink, tmp)
            # a failed write names no file, a failed rename the temporary file (gone by now): name the target
            # (a new error: the message of one whose second file name was set to None would end in "-> None")
            if isinstance(exc, OSError) and exc.errno is not None and (exc.filename is None or exc.filename == tmp):
                raise OSError(exc.errno, exc.strerror, str(path)) from None  # OSError picks the errno's subclass
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_checksummed(path: Path, payload: bytes) -> str:
    """Atomically write ``payload`` with a SHA-256 header; returns the digest."""
    return write_checksummed_stream(path, lambda out: out.write(payload))


class _Hashing:
    """A write-only file that hashes what it passes on (no ``seek``: a zip written into it is written in order)."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def write_checksummed_stream(path: Path, write: Callable[[Any], object]) -> str:
    """Atomically write the payload ``write(out)`` writes into ``out`` (a write-only file object, no ``seek``),
    behind the SHA-256 header of :func:`write_checksummed`; returns the digest.

    The payload goes to the file as it is written, its digest computed on the way and the header written over a
    placeholder at the end, so the payload is never held in memory whole: a checkpoint of the market states cost
    twice their size again in memory (the payload built in a buffer, then copied behind its header).
    """
    digest = ""

    def fill(fh: BinaryIO) -> None:
        nonlocal digest
        fh.write(b"\0" * HEADER_LEN)
        out = _Hashing(fh)
        write(out)
        digest = out.sha.hexdigest()
        fh.seek(0)
        fh.write(MAGIC + digest.encode("ascii") + b"\n")
        fh.seek(0, os.SEEK_END)

    atomic_write(path, fill)
    return digest


def seal(payload: bytes) -> bytes:
    """``payload`` behind the SHA-256 header of :func:`write_checksummed` (for bytes sent over the network)."""
    return MAGIC + sha256_bytes(payload).encode("ascii") + b"\n" + payload


def unseal(data: bytes, where: str) -> bytes:
    """The payload of bytes made by :func:`seal`; CheckpointError naming ``where`` if they are corrupt."""
    check_sealed(data, where)
    return data[HEADER_LEN:]


class NotARegularFileError(OSError):
    """What is at a path the service reads a file of its own from is a FIFO, socket or device: reading it would wait
    for a writer that never comes (a FIFO) or never end (``/dev/zero``). Treated as what is at the path being no file
    (:data:`NOT_A_FILE`): damaged."""


def read_file(path: Path | str) -> bytes:
    """The bytes of the regular file at ``path`` (links followed), checked to be one before it is opened: opening a
    FIFO would wait for a writer, reading a device (``/dev/zero``) might never end.

    Raises:
        NotARegularFileError: a FIFO, socket or device is there (its errno EINVAL).
        OSError: it could not be looked at, opened or read (ENOENT, EISDIR, EACCES, EIO, …).
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # (a directory: EISDIR from the read, as before)
        raise NotARegularFileError(errno.EINVAL, "not a regular file (a FIFO, socket or device is there)", str(path))
    return Path(path).read_bytes()


def what_is_at(path: Path | str, follow_links: bool = True) -> str:
    """What stands at ``path``, in words, for messages about one that is not what it should be: "a regular file",
    "a directory", "a FIFO", "a socket", "a device", "nothing"; with ``follow_links`` a link is taken for what it
    points at ("a link to nothing" when that is nothing, or a loop of links), else it is "a symbolic link"."""
    try:
        mode = (os.stat if follow_links else os.lstat)(path).st_mode
    except OSError:
        return "a link to nothing" if os.path.islink(path) else "nothing"
    for test, what in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "a device"


# reading a file failed because of what is at its path (a dangling or looping link, a directory): the file is as
# good as damaged. Any other error (permissions, an I/O error, no file descriptor or memory) says nothing about its
# bytes, which may hold acknowledged ticks: the start stops on it instead of moving the file aside.
NOT_A_FILE = (errno.ENOENT, errno.ELOOP, errno.EISDIR, errno.ENOTDIR)


def read_refused(exc: OSError) -> bool:
    """Whether a failed read of a state file says nothing about its content (see :data:`NOT_A_FILE`)."""
    return exc.errno not in NOT_A_FILE and not isinstance(exc, NotARegularFileError)


def read_state_file(path: Path, what: str) -> bytes | None:
    """The bytes of a file of the state dir; None when what is at its path is no file (a dangling link, a
    directory: the caller treats it as damaged).

    Raises:
        StorageError: ``"cannot read <what> <path>: …"`` when reading it failed otherwise (:func:`read_refused`):
            its permissions forbid it (a restore from backup without ``chown``), an I/O error, no file descriptor
            or memory: the file may be intact; fix that, lose nothing.
    """
    try:
        return read_file(path)
    except OSError as exc:
        if read_refused(exc):
            raise StorageError.from_os_error(f"cannot read {what}", path, exc) from None
        return None


def read_checksummed(path: Path) -> bytes:
    """Read a file written by :func:`write_checksummed`; CheckpointError if corrupt."""
    return read_sealed(path)[HEADER_LEN:]


def read_sealed(path: Path) -> bytes:
    """The whole file written by :func:`write_checksummed`, its header included (the payload starts at
    :data:`HEADER_LEN`), once its checksum is verified: a large file's payload is not copied out of it (a restore of
    the market states held the file, its payload and the arrays read from it at once). CheckpointError if corrupt."""
    try:
        data = read_file(path)
    except OSError as exc:
        raise CheckpointError(f"cannot read: {exc.strerror}", str(path)) from None
    check_sealed(data, str(path))
    return data


def check_sealed(data: bytes, where: str) -> None:
    """CheckpointError naming ``where`` unless ``data``, a whole file of :func:`write_checksummed` (or bytes of
    :func:`seal`), has its header and a payload matching its checksum (hashed in place, no copy)."""
    if len(data) < HEADER_LEN or not data.startswith(MAGIC) or data[HEADER_LEN - 1:HEADER_LEN] != b"\n":
        raise CheckpointError("not a checksummed cerebellar-norse file (bad header)", where)
    expected = data[len(MAGIC):HEADER_LEN - 1].decode("ascii", "replace")
    with memoryview(data) as whole:
        if hashlib.sha256(whole[HEADER_LEN:]).hexdigest() != expected:
            raise CheckpointError("checksum mismatch: the file is corrupt or truncated", where)


JSON_CHECKSUM_KEY = "sha256"


def dump_checksummed_json(obj: dict[str, Any]) -> bytes:
    """``obj`` as a JSON object whose last member, ``"sha256"``, is the hex SHA-256 of the JSON of the others (as
    ``json.dumps`` writes them): a file an operator still reads with ``jq``, whose damage is seen when it is read
    back (:func:`load_checksummed_json`). Values JSON has no type for are written as their ``str``."""
    if JSON_CHECKSUM_KEY in obj:
        raise ValueError(f"{JSON_CHECKSUM_KEY!r} is the checksum's member and cannot be a field")
    body = json.dumps(obj, default=str)
    digest = sha256_bytes(body.encode("utf-8"))
    tail = f', "{JSON_CHECKSUM_KEY}": "{digest}"}}' if obj else f'"{JSON_CHECKSUM_KEY}": "{digest}"}}'
    return (body[:-1] + tail).encode("utf-8")


def load_checksummed_json(data: bytes, where: str) -> tuple[dict[str, Any], bool]:
    """The JSON object of ``data`` without its checksum member, and whether it had one (a file written before
    checksums has none and is taken as it is).

    Raises:
        CheckpointError: naming ``where``: not UTF-8 JSON, not an object, or its checksum does not match (a byte
            changed since it was written: bit rot, an edit by hand, a truncation that left valid JSON).
    """
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"not a JSON file ({type(exc).__name__}: {exc})", where) from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"a JSON object was expected, not {type(obj).__name__}", where)
    if JSON_CHECKSUM_KEY not in obj:
        return obj, False
    expected = obj.pop(JSON_CHECKSUM_KEY)
    if not isinstance(expected, str) or sha256_bytes(json.dumps(obj).encode("utf-8")) != expected:
        raise CheckpointError("checksum mismatch: the file was changed or damaged since it was written", where)
    return obj, True
