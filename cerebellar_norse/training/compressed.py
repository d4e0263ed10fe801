"""Tick files as vendors ship them compressed: gzip, bzip2, xz, or a zip archive holding one file.

A file's compression is told by its first bytes (its magic number), never by its name: gzip ``1f 8b``
(Polygon's flat files, Tardis' ``.csv.gz``), bzip2 ``BZh``, xz ``fd 37 7a 58 5a 00``, zip ``PK 03 04`` (or
``PK 05 06``, an empty archive; data.binance.vision's ``.zip``: its one file is read, folders and macOS'
``__MACOSX/`` entries aside). Every other file is read as it is. A zstd file (``28 b5 2f fd``, Databento's
``.zst``) has no decompressor in the standard library and is refused with the command that unpacks it.

:func:`open_tick_text` opens any of them as text exactly as a plain file is opened (UTF-8, a byte-order mark
dropped, bytes that are not UTF-8 kept as lone surrogates, newlines untranslated), seekable back to the start.
Data that turns out damaged while it is read (a truncated download) raises :class:`CorruptFileError`, an
``OSError``, whatever the decompressor raised.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TextIO

from ..errors import DataError

# first bytes -> the compression's name, as notes and errors write it
MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"PK\x03\x04", "zip"),
         (b"PK\x05\x06", "zip"), (b"\x28\xb5\x2f\xfd", "zstd"))
MAGIC_BYTES = max(len(m) for m, _ in MAGIC)
# name endings of compressed files, dropped (case ignored) before a market is named after its file
COMPRESSED_SUFFIXES = (".gz", ".gzip", ".bz2", ".xz", ".zip", ".zst", ".zstd")
# the text file's own ending, dropped with the compressed file's (EURUSD.csv.gz is EURUSD, as EURUSD.csv is)
TEXT_SUFFIXES = (".csv", ".txt", ".tsv")
ZIP_MEMBERS_SHOWN = 5  # member names an error lists for a zip of several files
_DECOMPRESS_ERRORS = (EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile, OSError)
# compression -> its decompressing file class (each closed with the text stream over it)
_OPENERS: dict[str, Callable[[Path], io.BufferedIOBase]] = {"gzip": gzip.GzipFile, "bzip2": bz2.BZ2File, "xz": lzma.LZMAFile}


class CorruptFileError(OSError):
    """Compressed data that cannot be decompressed (truncated or damaged), met while a file is read."""


def compression_of(path: Path) -> str | None:
    """The compression of the file at ``path`` from its first bytes (a name of ``MAGIC``), None for any other file.
    OSError when it cannot be read."""
    with open(path, "rb") as fh:
        head = fh.read(MAGIC_BYTES)
    return next((name for magic, name in MAGIC if head.startswith(magic)), None)


def without_compressed_suffix(name: str) -> str:
    """A file name without a compression ending and the text ending before it (``EURUSD.csv.gz`` -> ``EURUSD``,
    ``BTCUSDT-1m-2024-01-01.zip`` -> ``BTCUSDT-1m-2024-01-01``); the name as it is when it has no such ending."""
    lower = name.lower()
    cut = next((s for s in COMPRESSED_SUFFIXES if lower.endswith(s) and len(name) > len(s)), None)
    if cut is None:
        return name
    rest = name[:-len(cut)]
    text = next((s for s in TEXT_SUFFIXES if rest.lower().endswith(s) and len(rest) > len(s)), None)
    return rest[:-len(text)] if text else rest


def zip_member(archive: zipfile.ZipFile, path: Path) -> zipfile.ZipInfo:
    """The one file of a zip archive (folders and ``__MACOSX/`` entries aside); DataError naming its members (up
    to ``ZIP_MEMBERS_SHOWN``) when it holds several files, or none."""
    members = [i for i in archive.infolist() if not i.is_dir() and not i.filename.startswith("__MACOSX/")]
    if len(members) == 1:
        return members[0]
    if not members:
        msg = f"{path}: the zip archive holds no file (a zip holding one tick file is read); there is nothing to read"
    else:
        shown = ", ".join(repr(i.filename) for i in members[:ZIP_MEMBERS_SHOWN])
        more = f" and {len(members) - ZIP_MEMBERS_SHOWN} more" if len(members) > ZIP_MEMBERS_SHOWN else ""
        msg = (f"{path}: the zip archive holds {len(members)} files ({shown}{more}); a zip holding one tick file is read:"
               " unpack it and name its files")
    raise DataError(msg, [msg])


def open_tick_text(path: Path) -> TextIO:
    """The file at ``path`` as text, decompressed as its first bytes tell (see :func:`open_tick_file`)."""
    return open_tick_file(path)[0]


def open_tick_file(path: Path) -> tuple[TextIO, str]:
    """The file at ``path`` as text, decompressed as its first bytes tell (see the module docstring), opened as
    ``open(path, newline="", encoding="utf-8-sig", errors="surrogateescape")`` opens a plain file; and the note that
    says how it was read (``"FILE: read as gzip-compressed"``, for a zip with its member's name; ``""`` for a plain
    file).

    Raises:
        OSError: the file cannot be opened (:class:`CorruptFileError` while reading damaged compressed data).
        DataError: a zstd file, a zip archive that cannot be read or does not hold exactly one file.
    """
    kind = compression_of(path)
    if kind is None:
        return open(path, newline="", encoding="utf-8-sig", errors="surrogateescape"), ""
    if kind == "zstd":
        msg = f"{path} is zstd-compressed: decompress it first (zstd -d {path})"
        raise DataError(msg, [msg])
    if kind == "zip":
        raw, member = _open_zip_member(path)
        note = f"{path}: read as zip-compressed (its one file, {member!r})"
    else:
        raw, note = _Guarded(_OPENERS[kind](path), kind, path), f"{path}: read as {kind}-compressed"
    return io.TextIOWrapper(raw, newline="", encoding="utf-8-sig", errors="surrogateescape"), note


@contextlib.contextmanager
def _zip_archive(path: Path) -> Iterator[zipfile.ZipFile]:
    """The zip archive at ``path``, open; DataError when it is no readable archive (truncated, damaged)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, EOFError) as exc:
        msg = f"{path}: unreadable zip archive ({exc}): the file is truncated or damaged; download it again"
        raise DataError(msg, [msg]) from None
    with archive:
        yield archive


def _open_zip_member(path: Path) -> tuple[_Guarded, str]:
    """The one file of the zip archive at ``path``, open for reading (bytes), and its name in the archive."""
    with contextlib.ExitStack() as stack:
        archive = stack.enter_context(_zip_archive(path))
        member = zip_member(archive, path)
        try:
            stream = archive.open(member)
        except (RuntimeError, NotImplementedError, zipfile.BadZipFile) as exc:  # encrypted, an unknown method
            msg = f"{path}: cannot read {member.filename!r} in the zip archive ({exc}); unpack it first"
            raise DataError(msg, [msg]) from None
        stack.pop_all()
        return _Guarded(stream, "zip", path, archive), member.filename


class _Guarded(io.BufferedIOBase):
    """A decompressing stream whose decompression errors are :class:`CorruptFileError`; closes ``owner`` (the zip
    archive of a member) with it."""

    def __init__(self, stream: IO[bytes] | io.BufferedIOBase, kind: str, path: Path, owner: Any = None) -> None:
        super().__init__()
        self._stream, self._kind, self._path, self._owner = stream, kind, path, owner

    @property
    def name(self) -> str:
        """The compressed file's path."""
        return str(self._path)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except CorruptFileError:
            raise
        except _DECOMPRESS_ERRORS as exc:
            raise CorruptFileError(f"{self._kind}-compressed data ends early or is damaged"
                                   f" ({type(exc).__name__}: {exc})") from None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._stream.seekable()

    def read(self, size: int | None = -1) -> bytes:
        with self._errors():
            return self._stream.read(-1 if size is None else size)

    def read1(self, size: int = -1) -> bytes:
        with self._errors():
            read1 = getattr(self._stream, "read1", self._stream.read)
            return bytes(read1(size))

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with self._errors():
            return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._stream.close()
            if self._owner is not None:
                self._owner.close()
        finally:
            super().close()
