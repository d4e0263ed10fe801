"""Compressed tick files (gzip, bzip2, xz, a zip of one file) read as their plain CSV; zstd, zips of several files
and damaged data refused with a DataError; markets named after compressed files."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import re
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from cerebellar_norse.cli import main
from cerebellar_norse.errors import DataError
from cerebellar_norse.training.csvformat import binance_symbol
from cerebellar_norse.training.data import DATA_FILE_PATTERN, TickData, load_csv_files, resolve_data_file

BN_MS = 1_704_067_200_000  # 2024-01-01 00:00 UTC


def _zip(data: bytes, member: str = "ticks.csv") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(member, data)
    return buf.getvalue()


COMPRESSORS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": (".csv.gz", gzip.compress),
    "bzip2": (".csv.bz2", bz2.compress),
    "xz": (".csv.xz", lzma.compress),
    "zip": (".zip", _zip),
}

# Dates with slashes (their order is found by a probe over the rows), CRLF line ends, a byte-order mark, a bad row
# and a byte that is not UTF-8: read from the compressed file exactly as from the plain one.
PLAIN = ("\ufeffDate,Price,Volume\r\n"
         + "".join(f"{d:02d}/01/2020,{100 + d * 0.25},{d}\r\n" for d in range(1, 29))
         + "29/01/2020,abc,1\r\n30/01/2020,\xe9,1\r\n31/01/2020,107.75,31\r\n").encode("utf-8")
PLAIN = PLAIN.replace("\xe9".encode(), b"\xe9")


def kline(open_ms: int, close: str) -> str:
    return (f"{open_ms},42283.58000000,42300.00000000,42270.00000000,{close},1.5,{open_ms + 59_999},"
            "1000.0,12,0.5,500.0,0")


def _same(data: TickData, plain: TickData, path: Path, plain_path: Path) -> None:
    """``data`` (read from ``path``) holds what ``plain`` (read from ``plain_path``) holds."""
    assert [(m.market_id, m.timestamp.tolist(), m.price.tolist(), m.volume.tolist()) for m in data.markets] == \
        [(m.market_id, m.timestamp.tolist(), m.price.tolist(), m.volume.tolist()) for m in plain.markets]
    assert (data.rows, data.bad_rows) == (plain.rows, plain.bad_rows)
    assert data.report == [r.replace(str(plain_path), str(path)) for r in plain.report]
    assert [replace(f, path="") for f in data.formats] == [replace(f, path="") for f in plain.formats]
    assert data.notes[1:] == [n.replace(str(plain_path), str(path)) for n in plain.notes]


@pytest.mark.parametrize("kind", list(COMPRESSORS))
def test_a_compressed_file_reads_as_its_plain_csv(tmp_path: Path, kind: str) -> None:
    suffix, compress = COMPRESSORS[kind]
    plain_path = tmp_path / "EURUSD.csv"
    plain_path.write_bytes(PLAIN)
    path = tmp_path / f"EURUSD{suffix}"
    path.write_bytes(compress(PLAIN))
    plain = load_csv_files([plain_path], max_bad_fraction=0.5)
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert plain.ticks == 29 and plain.formats[0].dates == "day/month/year"
    assert plain.report == [f"{plain_path}:30: Price 'abc' is not a number",
                            f"{plain_path}:31: unreadable row: not UTF-8 text (byte 0xe9)"]
    _same(data, plain, path, plain_path)
    member = " (its one file, 'ticks.csv')" if kind == "zip" else ""
    assert data.notes[0] == f"{path}: read as {kind}-compressed{member}"
    assert data.markets[0].market_id == "EURUSD"


@pytest.mark.parametrize("kind", list(COMPRESSORS))
def test_a_compressed_binance_file_is_read_by_its_layout_and_named_without_its_date(tmp_path: Path, kind: str) -> None:
    """A headerless file is read again from its start once its layout is known: that works on decompressed data."""
    text = "".join(kline(BN_MS + k * 60_000, f"{42290 + k}.5") + "\n" for k in range(60)).encode()
    plain_path = tmp_path / "BTCUSDT-1m-2024-01-01.csv"
    plain_path.write_bytes(text)
    path = tmp_path / f"BTCUSDT-1m-2024-01-02{COMPRESSORS[kind][0]}"
    path.write_bytes(COMPRESSORS[kind][1](text))
    plain = load_csv_files([plain_path])
    data = load_csv_files([path])
    assert [m.market_id for m in data.markets] == ["BTCUSDT-1m"] and data.ticks == 60
    _same(data, plain, path, plain_path)


def test_a_compressed_yfinance_file_is_read_with_its_ticker(tmp_path: Path) -> None:
    text = (b"Price,Close,High,Low,Open,Volume\nTicker,AAPL,AAPL,AAPL,AAPL,AAPL\nDate,,,,,\n"
            b"2020-01-02,72.5,72.6,71.3,71.6,135480400\n2020-01-03,71.8,72.6,71.5,71.8,146322800\n")
    path = tmp_path / "download.csv.gz"
    path.write_bytes(gzip.compress(text))
    data = load_csv_files([path])
    assert [(m.market_id, m.price.tolist()) for m in data.markets] == [("AAPL", [72.5, 71.8])]
    assert data.formats[0].header_lines == 3


@pytest.mark.parametrize(("name", "market"), [
    ("EURUSD.csv.gz", "EURUSD"), ("EURUSD.CSV.GZ", "EURUSD"), ("EURUSD.csv.bz2", "EURUSD"),
    ("EURUSD.txt.xz", "EURUSD"), ("EURUSD.zip", "EURUSD"), ("EURUSD.gz", "EURUSD"), ("prices.v2.csv.gz", "prices.v2"),
    ("EURUSD.tar.gz", "EURUSD"), ("EURUSD.csv.tgz", "EURUSD"),
])
def test_a_market_named_after_a_compressed_file_drops_both_suffixes(tmp_path: Path, name: str, market: str) -> None:
    path = tmp_path / name
    path.write_bytes(gzip.compress(b"timestamp,price\n1700000000000,1.5\n"))
    assert [m.market_id for m in load_csv_files([path]).markets] == [market]


@pytest.mark.parametrize("name", ["BTCUSDT-1m-2024-01-01.zip", "BTCUSDT-1m-2024-01-01.csv.gz",
                                  "BTCUSDT-1m-2024-01-01.csv.zip", "BTCUSDT-1m-2024-01-01.csv"])
def test_binance_symbol_of_compressed_file_names(name: str) -> None:
    assert binance_symbol(Path(name)) == "BTCUSDT-1m"


def test_compressed_file_names_are_accepted_as_data_files(tmp_path: Path) -> None:
    (tmp_path / "poly").mkdir()
    for name in ("EURUSD.csv.gz", "poly/2024-01-02.csv.gz", "BTCUSDT-1m-2024-01-01.zip", "ES.csv.bz2", "x.csv.xz"):
        (tmp_path / name).write_bytes(b"")
        assert re.match(DATA_FILE_PATTERN, name)
        assert resolve_data_file(tmp_path, name) == (tmp_path / name).resolve()


def _archive(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_a_zip_of_several_files_is_refused_naming_five(tmp_path: Path) -> None:
    path = _archive(tmp_path / "month.zip", {f"day{k}.csv": b"timestamp,price\n" for k in range(1, 8)})
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    assert str(err.value) == (f"{path}: the zip archive holds 7 files ('day1.csv', 'day2.csv', 'day3.csv', 'day4.csv',"
                              " 'day5.csv' and 2 more); a zip holding one tick file is read: unpack it and name its"
                              " files")


def test_a_zip_of_one_file_beside_folders_and_macos_entries_is_read(tmp_path: Path) -> None:
    text = b"timestamp,price\n1700000000000,1.5\n1700000001000,1.75\n"
    path = _archive(tmp_path / "A.zip", {"data/": b"", "data/A.csv": text, "__MACOSX/data/._A.csv": b"\x00\x05"})
    data = load_csv_files([path])
    assert [(m.market_id, m.price.tolist()) for m in data.markets] == [("A", [1.5, 1.75])]
    assert data.notes[0] == f"{path}: read as zip-compressed (its one file, 'data/A.csv')"


def test_an_empty_zip_is_refused(tmp_path: Path) -> None:
    path = _archive(tmp_path / "empty.zip", {})
    with pytest.raises(DataError, match=re.escape(f"{path}: the zip archive holds no file")):
        load_csv_files([path])


def test_a_zstd_file_is_refused_with_the_command_that_decompresses_it(tmp_path: Path) -> None:
    path = tmp_path / "ES.trades.csv.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(range(40)))
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    assert str(err.value) == f"{path} is zstd-compressed: decompress it first (zstd -d {path})"


def _rows(n: int) -> bytes:
    return ("timestamp,price\n" + "".join(f"{1_700_000_000_000 + k * 1000},{100 + k % 7}\n" for k in range(n))).encode()


@pytest.mark.parametrize(("kind", "compress"), [("gzip", gzip.compress), ("bzip2", bz2.compress),
                                                ("xz", lzma.compress)])
def test_a_truncated_file_is_a_data_error_naming_the_line_reached(tmp_path: Path, kind: str,
                                                                   compress: Callable[[bytes], bytes]) -> None:
    data = compress(_rows(50_000))
    path = tmp_path / f"EURUSD.csv.{kind}"
    path.write_bytes(data[:len(data) * 2 // 3])
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    m = re.fullmatch(rf"{re.escape(str(path))}:(\d+): unreadable (?:after line (\d+)|before its first line): {kind}-"
                     r"compressed data ends early or is damaged \(EOFError: .*\); the file is truncated or damaged,"
                     " download it again", str(err.value))
    assert m is not None, str(err.value)
    assert m[2] is None or int(m[1]) == int(m[2]) + 1


@pytest.mark.parametrize("cut", range(2, 10))
def test_a_gzip_cut_inside_its_header_is_a_truncated_file_not_an_empty_one(tmp_path: Path, cut: int) -> None:
    """A download cut within gzip's 10-byte header: gzip raises EOFError on the first read and reads nothing on the
    next, so the first line's probe must not swallow the error (it was then "empty file")."""
    path = tmp_path / "EURUSD.csv.gz"
    path.write_bytes(gzip.compress(_rows(100))[:cut])
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:1: unreadable before its first line: gzip-compressed"
                                        r" data ends early or is damaged \(EOFError: .*\); the file is truncated"):
        load_csv_files([path])


def test_a_damaged_gzip_is_a_data_error(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(_rows(20_000)))
    data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
    path = tmp_path / "EURUSD.csv.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:\d+: unreadable after line \d+: gzip-compressed"
                                        " data ends early or is damaged"):
        load_csv_files([path])


def test_a_truncated_zip_is_a_data_error(tmp_path: Path) -> None:
    whole = _zip(_rows(1000), "A.csv")
    path = tmp_path / "A.zip"
    path.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: unreadable zip archive \(.*\): the file is"
                                        " truncated or damaged; download it again$"):
        load_csv_files([path])


def test_inspect_data_reads_a_gzip_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__DATA_DIR", str(tmp_path))
    (tmp_path / "EURUSD.csv.gz").write_bytes(gzip.compress(b"timestamp,price,volume\n1700000000000,1.0825,3\n"
                                                           b"1700000060000,1.0827,5\n"))
    assert main(["inspect-data", "EURUSD.csv.gz"]) == 0
    out = capsys.readouterr().out.splitlines()
    path = tmp_path / "EURUSD.csv.gz"
    assert out[:3] == [f"{path}: separator ',', 1 header line, rows oldest first",
                       "  time 'timestamp', price 'price', volume 'volume', market 'EURUSD' for every row",
                       "rows 2, bad 0, ticks 2 in 1 market"]
    assert f"  {path}: read as gzip-compressed" in out
    assert main(["inspect-data", "EURUSD.csv.gz", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [(m["market_id"], m["ticks"]) for m in d["markets"]] == [("EURUSD", 2)]


def _tar(path: Path, members: dict[str, bytes], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                t.addfile(info)
                continue
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(("mode", "suffix", "how"), [("w:gz", ".tar.gz", ", gzip-compressed"),
                                                     ("w:gz", ".tgz", ", gzip-compressed"),
                                                     ("w:bz2", ".tar.bz2", ", bzip2-compressed"),
                                                     ("w:xz", ".tar.xz", ", xz-compressed"), ("w", ".tar", "")])
def test_a_tar_archive_of_one_file_reads_as_its_plain_csv(tmp_path: Path, mode: str, suffix: str, how: str) -> None:
    """A .tar.gz was read as gzip and its tar headers then taken for the CSV's header (refused as unreadable)."""
    plain_path = tmp_path / "EURUSD.csv"
    plain_path.write_bytes(PLAIN)
    path = _tar(tmp_path / f"EURUSD{suffix}", {"data/": b"", "data/EURUSD.csv": PLAIN, "data/._EURUSD.csv": b"\x00\x05"},
                mode)
    plain = load_csv_files([plain_path], max_bad_fraction=0.5)
    data = load_csv_files([path], max_bad_fraction=0.5)
    _same(data, plain, path, plain_path)
    assert data.notes[0] == f"{path}: read as a tar archive{how} (its one file, 'data/EURUSD.csv')"
    assert data.markets[0].market_id == "EURUSD"


def test_a_tar_archive_of_several_files_is_refused_naming_them(tmp_path: Path) -> None:
    path = _tar(tmp_path / "month.tar.gz", {"a.csv": b"timestamp,price\n", "b.csv": b"timestamp,price\n"})
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    assert str(err.value) == (f"{path}: the tar archive holds 2 files ('a.csv', 'b.csv'); a tar holding one tick file"
                              " is read: unpack it and name its files")


def test_a_truncated_tar_gz_is_a_data_error(tmp_path: Path) -> None:
    path = _tar(tmp_path / "A.tar.gz", {"A.csv": _rows(50_000)})
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) * 2 // 3])
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: unreadable tar archive \(.*\): the file is"
                                        " truncated or damaged; download it again$"):
        load_csv_files([path])


def test_bytes_after_a_whole_gzip_stream_are_named_as_such(tmp_path: Path) -> None:
    """Every row of the data was read; the bytes after it were called a truncated download ("ends early")."""
    path = tmp_path / "EURUSD.csv.gz"
    path.write_bytes(gzip.compress(_rows(100)) + b"<html>not found</html>\n")
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    assert re.fullmatch(rf"{re.escape(str(path))}:\d+: unreadable after line \d+: gzip-compressed data is followed by"
                        r" bytes that are not gzip data \(BadGzipFile: Not a gzipped file \(b'<h'\)\); the file is"
                        " truncated or damaged, download it again", str(err.value)), str(err.value)


def test_a_plain_csv_with_ustar_at_the_tar_mark_offset_reads_as_csv(tmp_path: Path) -> None:
    """Bytes 257-261 of a plain CSV that spell "ustar" by chance: no tar header checksum holds there, so the file
    is read as the CSV it is (it was refused as an unreadable tar archive)."""
    body = b"Date,Price,Volume,Note\n" + b"".join(f"2020-01-{d:02d},{100 + d},{d},x\n".encode() for d in range(1, 10))
    lead = b"2020-01-12,112,12,"
    body += lead + b"y" * (257 - len(body) - len(lead)) + b"ustar\n2020-01-13,113,13,z\n"
    assert body[257:262] == b"ustar"
    path = tmp_path / "EURUSD.csv"
    path.write_bytes(body)
    data = load_csv_files([path])
    assert data.ticks == 11 and data.bad_rows == 0
    assert not any("read as a tar archive" in n for n in data.notes)


@pytest.mark.parametrize("archive", ["tar", "zip"])
def test_an_archive_whose_one_file_is_compressed_itself_is_refused_saying_so(tmp_path: Path, archive: str) -> None:
    """A .csv.gz packed in a .tar (or .zip): its gzip bytes were read as text and refused as a header that is
    not UTF-8 text."""
    inner = gzip.compress(PLAIN)
    if archive == "tar":
        path = _tar(tmp_path / "EURUSD.tar", {"EURUSD.csv.gz": inner}, "w")
    else:
        path = tmp_path / "EURUSD.zip"
        path.write_bytes(_zip(inner, "EURUSD.csv.gz"))
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    assert str(err.value) == (f"{path}: the {archive} archive's one file, 'EURUSD.csv.gz', is gzip-compressed itself:"
                              " unpack the archive and name that file")


def test_links_in_a_tar_archive_are_not_taken_for_more_files(tmp_path: Path) -> None:
    """A hard link and a symbolic link to the tar's one file: the file is read, the links aside."""
    path = tmp_path / "EURUSD.tar"
    with tarfile.open(path, "w") as t:
        info = tarfile.TarInfo("EURUSD.csv")
        info.size = len(PLAIN)
        t.addfile(info, io.BytesIO(PLAIN))
        for name, kind in (("copy.csv", tarfile.LNKTYPE), ("latest.csv", tarfile.SYMTYPE)):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = kind, "EURUSD.csv"
            t.addfile(link)
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.notes[0] == f"{path}: read as a tar archive (its one file, 'EURUSD.csv')"
    assert data.ticks == 29


WIDE_TEXT = ("Date\tPrice\tVolume\r\n" + "".join(f"{d:02d}/01/2020\t{100 + d * 0.25}\t{d}\r\n" for d in range(1, 29))
             + "29/01/2020\tabc\t1\r\n31/01/2020\t107.75\t31\r\n")


@pytest.mark.parametrize(("codec", "name"), [("utf-16", "UTF-16"), ("utf-32", "UTF-32")])
def test_a_wide_unicode_file_with_its_mark_reads_as_its_utf8_twin(tmp_path: Path, codec: str, name: str) -> None:
    """Excel's "Unicode Text" saves tab-separated UTF-16 with a byte-order mark: it was refused at its header as
    not UTF-8 (byte 0xff). (Compressed, it still is: its mark is not looked for.)"""
    plain_path = tmp_path / "EURUSD.txt"
    plain_path.write_bytes(WIDE_TEXT.encode("utf-8"))
    wide = WIDE_TEXT.encode(codec)  # (Python's codec writes the mark)
    path = tmp_path / "EURUSD.csv"
    path.write_bytes(wide)
    plain = load_csv_files([plain_path], max_bad_fraction=0.5)
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert plain.ticks == 29 and plain.bad_rows == 1
    _same(data, plain, path, plain_path)
    note = next(n for n in data.notes if n.startswith(str(path)))
    assert note == f"{path}: read as {name} text"


def test_a_unit_that_does_not_decode_in_a_utf16_file_costs_its_row(tmp_path: Path) -> None:
    raw = bytearray(WIDE_TEXT.encode("utf-16-le"))
    at = raw.index("107.75".encode("utf-16-le"))
    raw[at:at + 2] = b"\x00\xd8"  # a high surrogate followed by a digit: no character
    path = tmp_path / "EURUSD.csv"
    path.write_bytes(b"\xff\xfe" + bytes(raw))
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.ticks == 28 and data.bad_rows == 2
    assert f"{path}:31: Price" in "\n".join(data.report)
