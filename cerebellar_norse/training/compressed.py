"""Tick files as vendors ship them compressed: gzip, bzip2, xz, a zip archive or a tar archive holding one file.

A file's compression is told by its first bytes (its magic number), never by its name: gzip ``1f 8b``
(Polygon's flat files, Tardis' ``.csv.gz``), bzip2 ``BZh``, xz ``fd 37 7a 58 5a 00``, zip ``PK 03 04`` (or
``PK 05 06``, an empty archive; data.binance.vision's ``.zip``: its one file is read, folders and macOS'
``__MACOSX/`` entries aside). Every other file is read as it is. A zstd file (``28 b5 2f fd``, Databento's
``.zst``) has no decompressor in the standard library and is refused with the command that unpacks it. A tar
archive, plain or compressed with any of gzip, bzip2 or xz (``.tar.gz``, ``.tgz``), is told by its first header (the
``ustar`` mark at offset 257 of its data, and a header checksum that holds); its one file is read (folders, links and
macOS' ``._`` entries aside), and refused when it is compressed itself.

:func:`open_tick_text` opens any of them as text exactly as a plain file is opened (UTF-8, a byte-order mark
dropped, bytes that are not UTF-8 kept as lone surrogates, newlines untranslated; UTF-16 or UTF-32 when the text
starts with that encoding's byte-order mark, in a file not compressed), seekable back to the start.
Data that turns out damaged while it is read (a truncated download) raises :class:`CorruptFileError`, an
``OSError``, whatever the decompressor raised.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TextIO

from ..errors import DataError
from ..textmarks import wide_encoding
from .notcsv import workbook_refusal

# first bytes -> the compression's name, as notes and errors write it
MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"PK\x03\x04", "zip"),
         (b"PK\x05\x06", "zip"), (b"\x28\xb5\x2f\xfd", "zstd"))
MAGIC_BYTES = max(len(m) for m, _ in MAGIC)
# name endings of compressed files, dropped (case ignored) before a market is named after its file
COMPRESSED_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".tbz2", ".txz", ".tar", ".gz", ".gzip", ".bz2", ".xz",
                       ".zip", ".zst", ".zstd")
# the text file's own ending, dropped with the compressed file's (EURUSD.csv.gz is EURUSD, as EURUSD.csv is)
TEXT_SUFFIXES = (".csv", ".txt", ".tsv")
ZIP_MEMBERS_SHOWN = 5  # member names an error lists for an archive of several files
TAR_MARK = (257, b"ustar")  # where a POSIX or GNU tar header has its magic, and its first bytes
_DECOMPRESS_ERRORS = (EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile, tarfile.TarError, OSError)
# compression -> its decompressing file class (each closed with the text stream over it)
_OPENERS: dict[str, Callable[[Path], io.BufferedIOBase]] = {"gzip": gzip.GzipFile, "bzip2": bz2.BZ2File, "xz": lzma.LZMAFile}
LINE_MAX_CHARS = 1 << 20  # longer than any row of ticks (the csv module's fields stop at 131072 characters each)


class CorruptFileError(OSError):
    """Compressed data that cannot be decompressed (truncated or damaged), met while a file is read."""


class _LineBoundedText(io.TextIOWrapper):
    """A text file whose lines are read ``LINE_MAX_CHARS`` characters at most: a file without line breaks (a disk
    image, gigabytes of NUL bytes) fails at its first line instead of being read into memory whole as one line."""

    def __init__(self, raw: _Guarded | io.BufferedReader, path: Path) -> None:
        # (a plain file's mark only: reading ahead in compressed data would meet its damage before its first line)
        wide = wide_encoding(raw.peek(4)[:4]) if isinstance(raw, io.BufferedReader) else None
        # a wide file's undecodable units cannot be kept as lone surrogates (only bytes >= 0x80 can): each becomes
        # U+FFFD, which costs its own row as an unreadable number does
        super().__init__(raw, newline="", encoding=wide or "utf-8-sig", errors="replace" if wide else "surrogateescape")
        self.path = path
        self.wide = wide

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]  # (typeshed: _IOBase's is bytes)
        bound = LINE_MAX_CHARS + 1 if size is None or size < 0 else min(size, LINE_MAX_CHARS + 1)
        line = super().readline(bound)
        if len(line) > LINE_MAX_CHARS:
            msg = (f"{self.path}: a line of more than {LINE_MAX_CHARS} characters without a line break: not a CSV file "
                   "of ticks")
            raise DataError(msg, [msg])
        return line

    def __next__(self) -> str:  # type: ignore[override]
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        # (csv.reader iterates.) The first line, read by readline, is checked, so a file without line breaks fails;
        # a longer line later in a file is one bad row (the csv module's field limit refuses its first piece): the
        # rest of it is skipped, so that the rows after it keep their line numbers
        read = super().readline
        while line := read(LINE_MAX_CHARS + 1):
            yield line
            if len(line) > LINE_MAX_CHARS and line[-1] not in "\r\n":
                while len(rest := read(LINE_MAX_CHARS + 1)) > LINE_MAX_CHARS and rest[-1] not in "\r\n":
                    pass


def compression_of(path: Path) -> str | None:
    """The compression of the file at ``path`` from its first bytes (a name of ``MAGIC``), None for any other file.
    OSError when it cannot be read."""
    with open(path, "rb") as fh:
        return _compression_in(fh.read(MAGIC_BYTES))


def _compression_in(head: bytes) -> str | None:
    """The compression (a name of ``MAGIC``) data starting with ``head`` is in, None for any other data."""
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


def _macos_entry(name: str) -> bool:
    """An archive entry macOS adds beside a file (``__MACOSX/…``, ``._name``: its attributes), not data."""
    return name.startswith("__MACOSX/") or name.rsplit("/", 1)[-1].startswith("._")


def _one_member(names: list[str], kind: str, path: Path) -> int:
    """The index of the one data file among an archive's file ``names`` (macOS' entries aside); DataError naming
    them (up to ``ZIP_MEMBERS_SHOWN``) when the ``kind`` archive (``"zip"``, ``"tar"``) holds several files, or
    none."""
    data = [k for k, name in enumerate(names) if not _macos_entry(name)]
    if len(data) == 1:
        return data[0]
    if not data:
        msg = f"{path}: the {kind} archive holds no file (a {kind} holding one tick file is read); there is nothing to read"
    else:
        shown = ", ".join(repr(names[k]) for k in data[:ZIP_MEMBERS_SHOWN])
        more = f" and {len(data) - ZIP_MEMBERS_SHOWN} more" if len(data) > ZIP_MEMBERS_SHOWN else ""
        msg = (f"{path}: the {kind} archive holds {len(data)} files ({shown}{more}); a {kind} holding one tick file is"
               " read: unpack it and name its files")
    raise DataError(msg, [msg])


def zip_member(archive: zipfile.ZipFile, path: Path) -> zipfile.ZipInfo:
    """The one file of a zip archive (folders and macOS' entries aside); DataError as :func:`_one_member`'s."""
    files = [i for i in archive.infolist() if not i.is_dir()]
    workbook = workbook_refusal(path, [i.filename for i in files])
    if workbook:
        raise DataError(workbook, [workbook])
    return files[_one_member([i.filename for i in files], "zip", path)]


def zip_member_name(path: Path) -> str:
    """The name of the one file a zip archive at ``path`` holds (as :func:`open_tick_file` reads it); "" for a file
    that is no zip archive, or one that cannot be read (its reading says why)."""
    try:
        if compression_of(path) != "zip":
            return ""
        with _zip_archive(path) as archive:
            return zip_member(archive, path).filename
    except (OSError, DataError):
        return ""


def _holds_tar(path: Path, kind: str | None) -> bool:
    """Whether the data of the file at ``path`` (decompressed as ``kind`` says: None, "gzip", "bzip2", "xz") starts
    with a tar header: the ``TAR_MARK`` and a header checksum that holds (a text file may hold ``ustar`` at that
    offset). False when the first block cannot be read (the reading then tells why)."""
    at, mark = TAR_MARK
    try:
        with open(path, "rb") if kind is None else _OPENERS[kind](path) as fh:
            head = fh.read(tarfile.BLOCKSIZE)
    except _DECOMPRESS_ERRORS:
        return False
    if head[at:at + len(mark)] != mark:
        return False
    try:
        tarfile.TarInfo.frombuf(head, tarfile.ENCODING, "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


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
        DataError: a zstd file, a zip or tar archive that cannot be read, does not hold exactly one file, or whose
            one file is compressed itself; while it is read, a line longer than ``LINE_MAX_CHARS``.
    """
    kind = compression_of(path)
    raw: _Guarded | io.BufferedReader
    if kind == "zstd":
        msg = f"{path} is zstd-compressed: decompress it first (zstd -d {path})"
        raise DataError(msg, [msg])
    if kind == "zip":
        raw, member = _open_zip_member(path)
        note = f"{path}: read as zip-compressed (its one file, {member!r})"
    elif _holds_tar(path, kind):
        raw, member = _open_tar_member(path, kind)
        how = f", {kind}-compressed" if kind else ""
        note = f"{path}: read as a tar archive{how} (its one file, {member!r})"
    elif kind is None:
        raw, note = open(path, "rb"), ""  # noqa: SIM115 (closed with the text stream over it)
    else:
        raw, note = _Guarded(_OPENERS[kind](path), kind, path), f"{path}: read as {kind}-compressed"
    text = _LineBoundedText(raw, path)
    return text, f"{path}: read as {text.wide.upper()} text" if text.wide else note


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
        stack.enter_context(stream)
        _refuse_compressed_member(stream, "zip", member.filename, path)
        stack.pop_all()
        return _Guarded(stream, "zip", path, archive), member.filename


def _open_tar_member(path: Path, kind: str | None) -> tuple[_Guarded, str]:
    """The one file of the tar archive at ``path`` (compressed as ``kind`` says), open for reading (bytes), and its
    name in the archive; DataError when the archive cannot be read or does not hold one file."""
    with contextlib.ExitStack() as stack:
        try:
            archive = stack.enter_context(tarfile.open(path, "r:*"))
            files = [m for m in archive.getmembers() if m.isfile()]
        except _DECOMPRESS_ERRORS as exc:
            msg = f"{path}: unreadable tar archive ({exc}): the file is truncated or damaged; download it again"
            raise DataError(msg, [msg]) from None
        member = files[_one_member([m.name for m in files], "tar", path)]
        stream = archive.extractfile(member)
        assert stream is not None  # a regular file's
        stack.enter_context(stream)
        _refuse_compressed_member(stream, "tar", member.name, path)
        stack.pop_all()
        return _Guarded(stream, kind or "tar", path, archive), member.name


def _refuse_compressed_member(stream: Any, archive: str, member: str, path: Path) -> None:
    """DataError when the one file (``stream``, with a ``peek``) of the ``archive`` ("zip", "tar") is itself
    compressed (a ``.csv.gz`` packed in a ``.tar``): it would be read as text, and refused as not UTF-8."""
    try:
        head = stream.peek(MAGIC_BYTES)[:MAGIC_BYTES]
    except _DECOMPRESS_ERRORS:
        return  # damaged: the reading tells why
    inner = _compression_in(head)
    if inner is not None:
        msg = (f"{path}: the {archive} archive's one file, {member!r}, is {inner}-compressed itself: unpack the"
               f" archive and name that file")
        raise DataError(msg, [msg])


class _Guarded(io.BufferedIOBase):
    """A decompressing stream whose decompression errors are :class:`CorruptFileError`, saying which ``kind`` of
    data broke off ("gzip", …, "tar" for a plain tar archive's); closes ``owner`` (the archive of a member) with it."""

    def __init__(self, stream: IO[bytes] | io.BufferedIOBase, kind: str, path: Path, owner: Any = None) -> None:
        super().__init__()
        self._stream, self._path, self._owner = stream, path, owner
        self._data = "tar archive data" if kind == "tar" else f"{kind}-compressed data"
        self._read = 0  # decompressed bytes read so far

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
        except gzip.BadGzipFile as exc:
            if not (self._read and str(exc).startswith("Not a gzipped file")):
                raise self._damaged(exc) from None
            # gzip reads on after a complete member as into a next one: the bytes after the data are not gzip
            raise CorruptFileError(f"{self._data} is followed by bytes that are not gzip data "
                                   f"({type(exc).__name__}: {exc})") from None
        except _DECOMPRESS_ERRORS as exc:
            raise self._damaged(exc) from None

    def _damaged(self, exc: BaseException) -> CorruptFileError:
        return CorruptFileError(f"{self._data} ends early or is damaged ({type(exc).__name__}: {exc})")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._stream.seekable()

    def read(self, size: int | None = -1) -> bytes:
        with self._errors():
            data = self._stream.read(-1 if size is None else size)
        self._read += len(data)
        return data

    def read1(self, size: int = -1) -> bytes:
        with self._errors():
            read1 = getattr(self._stream, "read1", self._stream.read)
            data = bytes(read1(size))
        self._read += len(data)
        return data

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
