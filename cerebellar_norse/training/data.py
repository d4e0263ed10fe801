"""Training data: CSV files of ticks and the labels computed from them.

A file is a header naming the columns, then one tick per line (Binance's, TrueFX's, MetaTrader 4's, NinjaTrader's
and HistData's headerless files are read by their layout; a table of several series as columns is read a series at a
time, each a market); how a file may be written (separators, column names, time and number formats, yfinance's,
MetaTrader's, Databento's and Binance's layouts) is in :mod:`cerebellar_norse.training.csvformat`. A file compressed with gzip,
bzip2 or xz, or a zip of one file, is read decompressed, noted (:mod:`cerebellar_norse.training.compressed`); a
truncated or damaged one fails with ``file:line: unreadable after line N: …``.

A missing optional column, a time unit other than ms, quotes read as their mid, ms
times within 1970-01-01 that might be seconds, or times without an offset read in a zone
other than UTC (``load_csv_files``' ``zone``), is recorded in ``TickData.notes`` as
``file: …``. Rows that are neither ticks nor bad (a Databento order book without a bid or an
ask, or with a mid not above 0, or an event of it that moves neither best price and trades nothing; a Databento mbo
record before its event's last) are skipped, counted per reason in a note and in ``TickData.skipped_rows``. The
Databento order books of one load carry from each file to the next, in the order given. A header without a time or a
price column, or naming a used column twice, fails at once with ``file:1: …``.

A file's rows may run oldest first or newest first (as some downloads write them): a
file is read as newest first (a note says so) when, in its first 10,000 rows, more of
the times that change from one row of a market to its next go back than forward; every
market's series is kept oldest first. Within a file, a row out of the file's direction
is a bad row.

Bad rows (a field count other than the header's, non-numbers, non-finite or
out-of-range values, time going backwards within a market) are skipped and reported
as ``file:line: reason``, the reason naming the column as the header spells it (a time in a
named zone, ``20241103 01:10:00 US/Eastern``, or without an offset in a file read in such a zone,
that would go back into the hour its zone repeats when the clocks go back is that hour's second
occurrence, noted, not a bad row); a
load with more than ``max_bad_row_fraction`` bad rows fails with that report.

Labels are computed by :mod:`cerebellar_norse.training.labels`; this module counts
them (:func:`class_counts`) and warns about rare classes (:func:`class_warnings`).
"""

from __future__ import annotations

import csv
import os
import stat
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DataError, DataFileNotFoundError, InputError
from ..timezones import zone_name
from .compressed import CorruptFileError, open_tick_file
from .csvcolumns import FileFormat, without_trailing_separator
from .csvformat import (
    FOOTER_LINES_MAX,
    clocks_back_hint,
    file_format,
    footer_text,
    leading_lines,
    not_utf8,
    parse_row,
    repeated_hour_time,
    split_number_hint,
)
from .csvtime import SECONDS_HINT_MS, parse_time_ms, serial_date_hint
from .notcsv import binary_refusal, json_refusal, json_start
from .orderbook import OrderBooks

if TYPE_CHECKING:
    from ..config import TrainingConfig

__all__ = ["CLASS_NAMES", "COLUMNS", "DATA_FILE_PATTERN", "MIN_SAMPLES_PER_CLASS", "DataFileNotFoundError", "MarketSeries",
           "TickData", "class_counts", "class_warnings", "csv_bytes", "iso_ms", "load_csv_files", "load_training_files", "parse_time_ms", "resolve_data_file",
           "write_csv"]

COLUMNS = ("timestamp", "market_id", "price", "volume")  # the header write_csv writes
CLASS_NAMES = ("down", "flat", "up")
MIN_SAMPLES_PER_CLASS = 10_000
MAX_REPORTED = 50


@dataclass
class MarketSeries:
    """One market's ticks in time order (float64 arrays; timestamps in ms)."""

    market_id: str
    timestamp: np.ndarray
    price: np.ndarray
    volume: np.ndarray

    def __len__(self) -> int:
        return int(self.price.shape[0])


@dataclass
class TickData:
    """Ticks loaded from CSV files, per market, with the bad-row report and notes on the files."""

    markets: list[MarketSeries]
    rows: int
    bad_rows: int
    report: list[str] = field(default_factory=list)
    # "file: …" where a default stood in for a missing column (volume, market); times that look like seconds
    notes: list[str] = field(default_factory=list)
    formats: list[FileFormat] = field(default_factory=list)  # how each file was read, in the order given
    skipped_rows: int = 0  # rows that are neither ticks nor bad rows (an order book without one side), noted
    # the moves taken for stock splits and taken out of the prices (adjust_splits), each also a note
    stock_splits: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ticks(self) -> int:
        """Good ticks across markets."""
        return sum(len(m) for m in self.markets)


# resolve_data_file's rule for names as a regular expression (for schemas): relative (no leading / or \\),
# no NUL, no ".." component.
_COMPONENT = r"(?:[^/\x00.][^/\x00]*|\.[^/\x00.][^/\x00]*|\.\.[^/\x00]+|\.)"
DATA_FILE_PATTERN = r"^(?:[^/\x00.\\][^/\x00]*|\.[^/\x00.][^/\x00]*|\.\.[^/\x00]+|\.)(?:/" + _COMPONENT + "?)*$"


def unclosed_quote(breaks: int, last_line: int) -> str:
    """Why a row whose fields hold ``breaks`` line breaks, ending at line ``last_line``, is refused: a quote that opens a
    field and is not closed made the reader take every line up to the next quote (or the end of the file) into it."""
    return (f"a quote (\") opens a field that is not closed before the end of the line: the next {breaks} "
            f"{'line' if breaks == 1 else 'lines'} (to line {last_line}) were read into that field, not as rows; "
            "remove the quote, or close it in its field")


def resolve_data_file(data_dir: Path, name: str) -> Path:
    """A file name relative to the data dir; absolute paths and ``..`` are refused, a missing file is not found."""
    if not name or "\x00" in name:
        raise InputError("file name is empty or contains NUL", "files")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate (a JSON "\ud800" escape): no file system name can hold it
        raise InputError(f"{name!r}: file names must be valid Unicode text (unpaired surrogate at character "
                         f"{exc.start})", "files") from None
    pure = PurePosixPath(name)
    if pure.is_absolute() or name.startswith(("/", "\\")) or any(p == ".." for p in pure.parts):
        raise InputError(f"{name!r}: file names must be relative to the data dir, without '..'", "files")
    try:
        path = (Path(data_dir) / pure).resolve()
        base = Path(data_dir).resolve()
        if base not in path.parents and path != base:
            raise InputError(f"{name!r} resolves outside the data dir", "files")
        exists = path.exists()
    except (OSError, RuntimeError) as exc:  # a name or path too long, a loop of links (RuntimeError before Python 3.13)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "a loop of symbolic links" \
            if isinstance(exc, RuntimeError) else str(exc)
        raise DataFileNotFoundError(f"{name[:80]!r}{'…' if len(name) > 80 else ''}: no such file can exist in the data"
                                    f" dir ({why})", "files") from None
    if not exists:
        raise DataFileNotFoundError(f"{name!r} does not exist in the data dir {base}", "files")
    if not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file (a FIFO, socket or device)"
        raise DataFileNotFoundError(f"{name!r} in the data dir {base} is {kind}: training reads regular files", "files")
    return path


def _reverse_from(column: array[Any], start: int) -> None:
    """Reverse ``column[start:]`` in place."""
    tail = column[start:]
    tail.reverse()
    column[start:] = tail


def iso_ms(ms: float) -> str:
    """ms since the epoch as ISO 8601 UTC (``2020-01-02T15:30:00Z``; milliseconds only when not whole seconds)."""
    dt = datetime.fromtimestamp(ms / 1000.0, UTC)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{int(ms) % 1000:03d}Z" if int(ms) % 1000 else "Z")


def _corrupt(path: Path, lines_read: int, exc: CorruptFileError) -> DataError:
    """The error for a compressed file whose data ends or breaks after ``lines_read`` lines were read whole."""
    where = f"after line {lines_read}" if lines_read else "before its first line"
    msg = f"{path}:{lines_read + 1}: unreadable {where}: {exc}; the file is truncated or damaged, download it again"
    return DataError(msg, [msg])


def load_training_files(paths: list[Path], training: TrainingConfig) -> TickData:
    """:func:`load_csv_files` as the config's ``[training]`` section says: its bad-row fraction, data time zone, date
    order and stock split adjustment (``train``, ``evaluate``, ``inspect-data`` and jobs read files this way)."""
    return load_csv_files(paths, training.max_bad_row_fraction, training.data_zone, training.adjust_splits,
                          training.day_first)


def load_csv_files(paths: list[Path], max_bad_fraction: float = 0.01, zone: tzinfo = UTC,
                   adjust_splits: bool = False, day_first: bool | None = None) -> TickData:
    """Read tick CSV files (in the given order) into per-market series (format in the module docstring); dates and
    date-times written without an offset or zone are wall-clock times in ``zone`` (``training.data_timezone``); with
    ``adjust_splits`` (``training.adjust_splits``), a move that is a stock split is taken out of its market's prices,
    noted (:mod:`cerebellar_norse.training.splits`); dates with slashes or dots are read day first (True) or month
    first (False) as ``day_first`` says (``training.date_order``), or as each column shows (None).

    Raises:
        DataError: a file cannot be opened or is not a regular file (a FIFO would block the reader), is empty, has no time or price column, or
            names a used column twice (``file:1: …``); no good rows; or too many bad rows
            (the report lists ``file:line: reason`` for each, the first 50 in the message).
    """
    code_of: dict[str, int] = {}  # market -> index into last_ts
    last_ts: list[int] = []
    # the good rows' fields, 8 bytes each (a list held a Python object and a pointer per field: ~110 bytes a row)
    ts_all = array("d")  # ms below 2100 are exact in float64, as the series keep them
    price_all = array("d")
    volume_all = array("d")
    code_all = array("q")
    report: list[str] = []
    notes: list[str] = []
    formats: list[FileFormat] = []
    rows = bad = 0
    skips: dict[str, int] = {}  # why -> rows that are neither ticks nor bad rows, over all files (see Columns.skipped)
    books = OrderBooks()  # Databento order books, carried from each file to the next (a request split into files)
    # (file, the series column to read of a table of several series as columns; None: as its header says), in order
    pending: list[tuple[Path, int | None]] = [(path, None) for path in reversed(paths)]
    tables: list[str] = []  # a refusal's hint for each file read as a table of series: its columns may be no prices
    while pending:
        path, series = pending.pop()
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # (checked when the job was asked for, then replaced):
                raise DataError(f"{path} is not a regular file (a FIFO, socket, device or directory): training reads "
                                "regular files", [f"{path}: not a regular file"])  # opening a FIFO would wait forever
            # bytes that are not UTF-8 become lone surrogates, so a bad byte costs its own row only
            fh, compressed = open_tick_file(path)  # compressed: "file: read as gzip-compressed"; "" for a plain file
        except OSError as exc:
            raise DataError(f"{path}: cannot open: {exc.strerror or exc}", [f"{path}: cannot open"]) from None
        if compressed:
            notes.append(compressed)
        with fh:
            head = refusal = ""
            try:
                head = fh.read(64)
                refusal = binary_refusal(path, head)
                if not refusal and json_start(head):  # enough of it to hold the first row of an array of arrays
                    refusal = json_refusal(path, head + fh.read(4032))
                fh.seek(0)
                skipped, delimiter = leading_lines(fh)
            except CorruptFileError as exc:  # not retried: gzip reads a file cut inside its header as empty the 2nd time
                raise _corrupt(path, 0, exc) from None
            except (OSError, ValueError):
                skipped, delimiter = 0, ","
            if refusal:
                raise DataError(refusal, [refusal])
            fh.seek(0)
            reader = csv.reader(fh, delimiter=delimiter)
            try:
                for _ in range(skipped):
                    next(reader)
                header = next(reader)
            except StopIteration:
                raise DataError(f"{path}: empty file (a header naming at least a time and a price column is required)",
                                [f"{path}:1: empty file"]) from None
            except csv.Error as exc:
                raise DataError(f"{path}:1: unreadable header: {exc}", [f"{path}:1: unreadable header"]) from None
            except CorruptFileError as exc:
                raise _corrupt(path, reader.line_num, exc) from None
            bad_bytes = not_utf8(header)
            if bad_bytes:
                raise DataError(f"{path}:1: unreadable header: {bad_bytes}; save the file as UTF-8",
                                [f"{path}:1: unreadable header"])
            cols = file_format(path, header, delimiter, notes if series is None else [], skipped, zone, books, series,
                               day_first)
            if series is None and len(cols.series) > 1:  # each further series in a pass of its own, right after
                pending.extend((path, k) for k in reversed(cols.series[1:]))
                tables.append(f"{path} was read as a table of {len(cols.series)} series as columns, each a market's"
                              " prices: if its columns hold no prices (returns, factors, weather, …), it is no file"
                              " of prices to train on")
            if cols.header_rows == skipped:  # no header line (a Binance file): the line read as one is the first row
                fh.seek(0)
                reader = csv.reader(fh, delimiter=delimiter)
                for _ in range(skipped):
                    next(reader, None)
            for _ in range(cols.header_rows - skipped - 1):
                next(reader, None)  # yfinance's Ticker and Date lines
            formats.append(cols.describe(path))
            seconds_noted = False
            file_start = len(ts_all)
            file_rows = rows
            widths: dict[int, int] = {}  # field count -> rows of that count, other than the header's
            split_hint = ""  # the first row's hint that unquoted digit groups split its numbers
            trailing = 0  # rows that end with a separator (an empty field the header does not name)
            here: dict[int, int] = {}  # market code -> its time in the file's latest good row
            repeated = 0  # rows read in the second run of an hour that their time zone repeats (clocks set back)
            before: dict[int, int] = {}  # market code -> its last time in earlier files
            # the bad rows since the file's latest good row, while none holds a time: (line, fields, text); None once
            # one does (a file's footer, a total or a disclaimer, is skipped when it is all that follows its ticks)
            footer: list[tuple[int, int, str]] | None = []
            while True:
                try:
                    for row in reader:
                        if not row:
                            continue
                        rows += 1
                        trimmed = without_trailing_separator(row, cols.fields)
                        if trimmed is not row:
                            row = trimmed
                            trailing += 1
                        try:
                            parsed = parse_row(row, cols)
                            if parsed is None:  # no tick, no bad row: counted in cols.skipped, noted below
                                continue
                            ts, market, price, volume = parsed
                            code = code_of.get(market)
                            if code is None:
                                code = code_of[market] = len(last_ts)
                                last_ts.append(ts)
                                here[code] = ts
                            else:
                                prev = here.get(code)
                                first_here = prev is None
                                if prev is None:  # the market's first row in this file: compared with earlier files
                                    prev = before[code] = last_ts[code]
                                if first_here or not cols.newest_first:  # not before its previous row (or file)
                                    if ts < prev:  # 01:10 US/Eastern after 01:50: the repeated hour's second run
                                        later = repeated_hour_time(row, cols)
                                        if later is None or later < prev:
                                            raise ValueError(f"time goes backwards for market {market!r} ({iso_ms(ts)}"
                                                             f" < {iso_ms(prev)}; ms {ts} < {prev})"
                                                             + clocks_back_hint(row, cols, prev - ts))
                                        ts, repeated = later, repeated + 1
                                    last_ts[code] = ts
                                else:
                                    # newest first, a repeated hour's second run comes first: read so unless forwards
                                    later = repeated_hour_time(row, cols)
                                    second = later is not None and later <= prev
                                    if later is not None and second:
                                        ts = later
                                    if ts > prev:
                                        raise ValueError(f"time goes forwards for market {market!r} in rows that run"
                                                         f" newest first ({iso_ms(ts)} > {iso_ms(prev)}; ms {ts} > {prev})")
                                    if ts < before.get(code, 0):
                                        raise ValueError(f"time goes backwards for market {market!r} ({iso_ms(ts)} < its"
                                                         f" last time {iso_ms(before[code])} in an earlier file;"
                                                         f" ms {ts} < {before[code]})")
                                    repeated += second
                                here[code] = ts
                        except ValueError as exc:
                            if all(not c.strip() for c in row):  # a blank line (of separators only)
                                rows -= 1
                                continue
                            bad += 1
                            breaks = sum(c.count("\n") for c in row)
                            if breaks:  # one field read over line breaks: a quote that opens it and is never closed
                                # (run to the end of the file, the field holds the last line's break too)
                                start = reader.line_num - breaks + row[-1].endswith("\n")
                                rows, bad = rows + reader.line_num - start, bad + reader.line_num - start  # each line lost
                                report.append(f"{path}:{start}: {unclosed_quote(reader.line_num - start, reader.line_num)}")
                                footer = None
                                continue
                            if len(row) != cols.fields:
                                widths[len(row)] = widths.get(len(row), 0) + 1
                                split_hint = split_hint or split_number_hint(row, cols)
                            bad_bytes = not_utf8(cols.used_fields(row))
                            reason = f"unreadable row: {bad_bytes}" if bad_bytes else str(exc)
                            report.append(f"{path}:{reader.line_num}: {reason}")
                            if footer is not None:
                                text = footer_text(row, cols)
                                footer = None if text is None else [*footer, (reader.line_num, len(row), text)]
                            continue
                        footer = []
                        ts_all.append(ts)
                        price_all.append(price)
                        volume_all.append(volume)
                        code_all.append(code)
                        if ts < SECONDS_HINT_MS and not seconds_noted and not cols.iso and cols.time_unit == "ms":
                            seconds_noted = True
                            day = datetime.fromtimestamp(ts / 1000, UTC).date()
                            notes.append(f"{path}:{reader.line_num}: {cols.time_name} {ts} read as ms since epoch is"
                                         f" {day}" + (serial_date_hint(ts) or "; if the file's times are seconds,"
                                                      " multiply them by 1000"))
                    break
                except csv.Error as exc:  # e.g. a field over the csv module's size limit
                    rows += 1
                    bad += 1
                    report.append(f"{path}:{reader.line_num}: unreadable row: {exc}")
                    footer = None
                except CorruptFileError as exc:  # a truncated or damaged download
                    raise _corrupt(path, reader.line_num, exc) from None
            if footer and len(footer) <= FOOTER_LINES_MAX and len(ts_all) > file_start:
                del report[-len(footer):]
                rows -= len(footer)
                bad -= len(footer)
                for _, width, _ in footer:
                    if width != cols.fields:
                        widths[width] -= 1
                        if not widths[width]:
                            del widths[width]
                shown_lines = ", ".join(f"{line} {text!r}" for line, _, text in footer)
                notes.append(f"{path}: {len(footer)} {'line' if len(footer) == 1 else 'lines'} after the last tick,"
                             " without a time, skipped as the file's footer (a total, a disclaimer): line"
                             f"{'' if len(footer) == 1 else 's'} {shown_lines}")
            if len(widths) == 1 and sum(widths.values()) == rows - file_rows:  # every row: the header is off
                (width,) = widths
                msg = (f"{path}:1: the header names {cols.fields} columns but every row has {width} fields: a column"
                       f" name is {'missing from' if width > cols.fields else 'one too many in'} the header"
                       + (f", or {split_hint.strip()[1:-1]}" if split_hint else ""))
                raise DataError(msg, [msg])
            if cols.zone_used:
                notes.append(f"{path}: times without an offset read in {zone_name(zone)}")
            if repeated:
                notes.append(f"{path}: {repeated} {'row' if repeated == 1 else 'rows'} in the hour that the time zone"
                             " repeats when the clocks go back read as its second occurrence,"
                             " where the first would put them out of order")
            if trailing:
                notes.append(f"{path}: {trailing} {'row ends' if trailing == 1 else 'rows end'} with a separator; the"
                             " empty last field is ignored")
            for why, count in cols.skipped.items():
                skips[why] = skips.get(why, 0) + count
                notes.append(f"{path}: {count} {'row' if count == 1 else 'rows'} skipped: {why}")
            if cols.mbo is not None:
                notes += cols.mbo.notes(path)
            if cols.blank_volumes:
                rows_word = "row" if cols.blank_volumes == 1 else "rows"
                named = cols.volume_name + (f" or {cols.ask_volume_name}" if cols.ask_volume is not None else "")
                notes.append(f"{path}: {cols.blank_volumes} {rows_word} without a volume ({named} empty or '-');"
                             " volume 0 used")
            if cols.newest_first:  # oldest first, as every market's series is kept (last_ts already holds the newest)
                for column in (ts_all, price_all, volume_all, code_all):
                    _reverse_from(column, file_start)
                notes.append(f"{path}: rows run newest first; read in reverse")
    shown = "\n".join(report[:MAX_REPORTED])
    more = f"\n… and {len(report) - MAX_REPORTED} more" if len(report) > MAX_REPORTED else ""
    more += "".join(f"\n{hint}" for hint in tables) if bad else ""
    if rows == 0 or not code_of:
        files = ", ".join(str(p) for p in paths)
        if rows == 0:
            raise DataError(f"no valid tick rows in {files}: no data rows after the header", report[:MAX_REPORTED])
        if skips:
            why = "; ".join(f"{count} because {why}" for why, count in skips.items())
            raise DataError(f"no valid tick rows in {files}: of {rows} rows {bad} are bad and"
                            f" {sum(skips.values())} skipped ({why})"
                            + (f":\n{shown}{more}" if report else ""), report[:MAX_REPORTED])
        raise DataError(f"no valid tick rows in {files}: all {rows} rows are bad:\n{shown}{more}", report[:MAX_REPORTED])
    if bad > max_bad_fraction * rows:
        not_above_0 = sum(r.endswith(" is not > 0") for r in report)
        hint = (f"\n{not_above_0} of the bad rows have a price of 0 or below: returns are log returns, which no price"
                " of 0 or below has; a series that goes there (a spread, power prices, a contract that traded below"
                " 0) cannot be read as it is: give its legs, or add a constant you choose to every price"
                if not_above_0 * 2 > bad else "")
        raise DataError(f"{bad} of {rows} rows are bad ({bad / rows:.2%} > max_bad_row_fraction {max_bad_fraction:.2%}):\n{shown}{more}{hint}", report)
    notes = list(dict.fromkeys(notes))  # a table of several series: each pass notes what they share once
    codes = np.frombuffer(code_all, dtype=np.int64)
    ts_arr = np.frombuffer(ts_all, dtype=np.float64)
    price_arr = np.frombuffer(price_all, dtype=np.float64)
    volume_arr = np.frombuffer(volume_all, dtype=np.float64)
    del ts_all, price_all, volume_all, code_all
    order = np.argsort(codes, kind="stable")  # file order within each market
    ends = np.cumsum(np.bincount(codes, minlength=len(last_ts)))
    markets = []
    stock_splits: list[dict[str, Any]] = []
    for market in sorted(code_of):
        c = code_of[market]
        sel = order[(ends[c - 1] if c else 0):ends[c]]
        one = MarketSeries(market, ts_arr[sel], price_arr[sel], volume_arr[sel])
        if adjust_splits:
            from .splits import adjust_splits as adjusted

            one, found = adjusted(one)
            stock_splits += found
            notes += [s["note"] for s in found]
        markets.append(one)
    return TickData(markets, rows, bad, report, notes, formats, sum(skips.values()), stock_splits)


def class_counts(labels: list[np.ndarray]) -> np.ndarray:
    """Samples per class (down, flat, up) over labelled ticks."""
    allv = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
    return np.bincount(allv[allv >= 0], minlength=3)


def class_warnings(counts: np.ndarray, minimum: int = MIN_SAMPLES_PER_CLASS) -> list[str]:
    """Warnings for classes with fewer than ``minimum`` samples (the operations guide's minimum)."""
    return [f"class {CLASS_NAMES[k]} has {int(c)} samples, fewer than the recommended {minimum}"
            for k, c in enumerate(counts) if c < minimum]


def csv_bytes(ticks: Iterable[dict[str, object]]) -> bytes:
    """Ticks as CSV text with the standard header."""
    lines = [",".join(COLUMNS)]
    lines.extend(f"{t['timestamp']},{t['market_id']},{t['price']!r},{t['volume']!r}" for t in ticks)
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_csv(path: Path, ticks: list[dict[str, object]]) -> None:
    """Write ticks as a CSV with the standard header, atomically."""
    from ..storage import atomic_write_bytes

    atomic_write_bytes(path, csv_bytes(ticks))
