"""Where a tick file's columns are, and reading the fields that every reader of a row shares.

The column-role types (:class:`Columns`, a Databento mbo file's :class:`MboColumns`, and :class:`FileFormat`, how a
file was read for people), finding a column by its header name (:func:`find_column`), a file's data rows as its
:class:`Columns` read them (:func:`data_rows`), and a price field (in quote currency, of any sign:
:func:`signed_price`; the mid of two: :func:`mid_price`) or a volume field (in traded units: :func:`read_volume`).
Which columns a file has is :mod:`.csvformat`'s to decide, and a Databento file's :mod:`.databento`'s.
"""

from __future__ import annotations

import contextlib
import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, tzinfo
from pathlib import Path

from ..errors import DataError
from .compressed import open_tick_text
from .csvnumbers import is_number, quoted_number
from .csvtime import time_any
from .orderbook import OrderBooks, Sides, Top

_INF = math.inf

HEADER_SHOWN = 500  # characters of a header line that a refusal shows
LOOKS_LIKE_DATA_SAMPLE = 1000  # header names read to tell a first line of data


@dataclass(slots=True)
class MboColumns:
    """Where a Databento mbo file's order-event columns are, and the books rebuilt from its rows so far."""

    action: int
    side: int
    order_id: int
    publisher: int
    instrument: int | None  # instrument_id (each its own book); None: the market column keys the books
    flags: int | None  # None: no flags column, every row is an event of its own
    names: dict[int, str]  # column index -> header name, for errors
    # the books, previous tops and pending trades of every instrument: shared by the mbo files of one load
    books: OrderBooks = field(default_factory=OrderBooks)
    carried: int = 0  # orders resting in ``books`` when this file began (left by the load's earlier files)
    unknown_cancels: int = 0  # this file's cancels of orders not in the book (ignored)

    def notes(self, path: Path) -> list[str]:
        """What the file's books started with and could not follow, for ``TickData.notes``."""
        notes = []
        if self.carried:
            n = self.carried
            notes.append(f"{path}: books carried over from the previous file: {n} {'order' if n == 1 else 'orders'}"
                         " resting (a clear, action R, as a snapshot starts with, empties its instrument's book)")
        n = self.unknown_cancels
        if n:
            notes.append(f"{path}: {n} {'cancel' if n == 1 else 'cancels'} (action C) of orders not in the book"
                         " ignored: the book was incomplete at the start (the file starts after those orders were"
                         " placed, without a snapshot)")
        return notes


DATE_ORDER = {True: "day/month/year", False: "month/day/year"}  # a file's slash dates' order (day first?), in words


@dataclass(slots=True)
class Columns:
    """Where one file's columns are (indexes into a row) and how its header spells them."""

    fields: int
    time: int
    time_name: str
    price: int
    price_name: str
    volume: int | None
    volume_name: str
    market: int | None
    market_name: str
    default_market: str
    iso: bool | None = None  # time format, from the first time value: ISO 8601 (True) or ms numbers (False)
    day_first: bool | None = None  # dates with slashes or dots: D/M/YYYY (True), M/D/YYYY (False); None: neither
    known_markets: dict[str, str] = field(default_factory=dict)  # raw field -> validated market id
    blank_volumes: int = 0  # rows whose volume field is empty or "-" (read as 0)
    header_rows: int = 1  # lines before the first data row (3 in yfinance's Price/Ticker/Date header)
    delimiter: str = ","  # field separator (see DELIMITERS)
    decimal_comma: bool = False  # a file separated by ';' whose numbers have decimal commas ('.' groups digits)
    clock: int | None = None  # a column of times of day that completes the date column (MetaTrader's <TIME>)
    clock_name: str = ""
    hour_ending: bool | None = None  # the clock is an hour column (see hour_column): hours ending 1..24 (True) or
    # beginning 0..23 (False); None: the clock holds times of day
    day: str = ""  # YYYY-MM-DD of a QuantConnect Lean minute, second or tick file: its times are ms after that midnight
    flag: int | None = None  # Lean's suspicious flag of a tick: a row with 1 there is skipped (as Lean's algorithms do)
    zero_sides: bool = False  # Lean's quotes: a side written 0 or empty is not quoted in that row (the other side is)
    newest_first: bool = False  # rows run newest first (see runs_newest_first)
    fixed_point: bool = False  # prices are Databento's integers in units of 1e-9 (see databento.databento_fixed_point)
    time_unit: str = "ms"  # unit of numeric times (a key of UNIT_WORDS), from the first time (see time_unit_of)
    time_floor: int = 0  # a numeric time before this (ms) is of another unit than the file's (see time_unit_of)
    ask: int | None = None  # with ``price`` the bid: the price is their mid
    ask_name: str = ""
    ask_volume: int | None = None  # with ``volume`` the bid side's: the volume is their sum
    ask_volume_name: str = ""
    quotes: dict[str, list[float]] = field(default_factory=dict)  # market -> its latest bid and ask (empty: unchanged)
    action: int | None = None  # Databento's action column of an order-book file (see databento.databento_book_events): the
    # price is the mid of the row's own top of book, the volume a trade's size only
    action_name: str = ""
    mbo: MboColumns | None = None  # a Databento mbo file (see databento.databento_mbo): price the mid of its rebuilt book
    # an order-book file's markets -> their bid_px_00 and ask_px_00 in their previous row (None: a side lacked), to
    # tell whether a row moved them (see databento.databento_book_events; shared by the files of one load)
    tops: dict[str, Top | None] = field(default_factory=dict)
    publisher: int | None = None  # an order-book file's publisher_id: a market's top is the best over its venues'
    # an order-book file's markets -> publisher -> its bid_px_00 and ask_px_00 in its latest row (None: no order there)
    venues: dict[str, dict[str, Sides]] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # why -> rows skipped so (neither ticks nor bad rows)
    zone: tzinfo = UTC  # the zone of times written without an offset or zone (training.data_timezone)
    zone_used: bool = False  # a row's time was read in ``zone`` (not UTC) for want of an offset of its own
    # a table of several series as columns beside the time (Date,AAPL,MSFT): their columns, each read as its own market
    # in a pass over the file of its own, ``price`` the one this pass reads; empty for any other file
    series: tuple[int, ...] = ()

    def used_fields(self, row: list[str]) -> list[str]:
        """The fields of a row that are read (none when the row has the wrong field count)."""
        if len(row) != self.fields:
            return []
        used = (self.time, self.clock, self.flag, self.price, self.ask, self.volume, self.ask_volume, self.market,
                self.action,
                self.publisher, *(self.mbo.names if self.mbo is not None else ()))
        return [row[i] for i in used if i is not None]

    def describe(self, path: Path) -> FileFormat:
        """How the file at ``path`` was read, for people (``cerebellar-norse inspect-data``)."""
        return FileFormat(
            path=str(path), separator={",": ",", ";": ";", "\t": "tab", "|": "|", " ": "blank"}[self.delimiter],
            header_lines=self.header_rows,
            time=self.time_name + (f" + {self.clock_name}" if self.clock is not None else "")
            + (f" (ms after {self.day} 00:00)" if self.day else ""),
            time_unit=None if self.iso and self.time_unit == "ms" else self.time_unit,
            dates=None if self.day_first is None else DATE_ORDER[self.day_first],
            price=self.price_name, ask=self.ask_name or None, volume=self.volume_name if self.volume is not None else None,
            ask_volume=self.ask_volume_name or None,
            market=self.market_name if self.market is not None else None,
            default_market=self.default_market or None, newest_first=self.newest_first, decimal_comma=self.decimal_comma)


@dataclass(frozen=True)
class FileFormat:
    """How one file was read: its separator, header lines and the header names of the columns used.

    ``time`` is the time column's name (``"<DATE> + <TIME>"`` when a time-of-day column
    completes it); ``time_unit`` the unit of its numbers (``s``, ``ms``, ``µs``, ``ns``; None
    for dates); ``dates`` the order of dates written with slashes or dots, if any; ``price``
    the price column, or with ``ask`` the bid column (the price is their mid); ``volume``
    None when the file has no volume column (volume 0), with ``ask_volume`` the bid side's
    (the volume is their sum); ``market`` None when the market is ``default_market`` (the
    file's name, or yfinance's Ticker line).
    """

    path: str
    separator: str
    header_lines: int
    time: str
    time_unit: str | None
    dates: str | None
    price: str
    ask: str | None
    volume: str | None
    ask_volume: str | None
    market: str | None
    default_market: str | None
    newest_first: bool
    decimal_comma: bool


@contextlib.contextmanager
def data_rows(path: Path, cols: Columns) -> Iterator[Iterator[list[str]]]:
    """A file's rows after its header lines, read as ``cols`` reads them: each format probe's own pass."""
    with open_tick_text(path) as fh:
        reader = csv.reader(fh, delimiter=cols.delimiter)
        for _ in range(cols.header_rows):
            next(reader, None)
        yield (without_trailing_separator(row, cols.fields) for row in reader)


def without_trailing_separator(row: list[str], fields: int) -> list[str]:
    """``row`` without the empty last field of a line that ends with a separator (``1,2,3,`` under a header of three
    names, as some spreadsheet and broker exports write every line); any other row as it is."""
    return row[:-1] if len(row) == fields + 1 and not row[-1].strip() else row


def header_name(name: str) -> str:
    return " ".join(name.replace("\ufeff", "").split())


def match_name(shown: str) -> str:
    """A header name as the column lists hold it: lower case, without angle brackets (MetaTrader writes ``<DATE>``)."""
    return shown.lower().removeprefix("<").removesuffix(">")


def find_column(path: Path, names: list[str], shown: list[str], aliases: tuple[str, ...], what: str,
                 required: bool, otherwise: str = "") -> int | None:
    """Index of the first alias present in the header; DataError when required and absent (the message ends the
    list of aliases with ``otherwise``), or named twice."""
    for alias in aliases:
        where = [i for i, n in enumerate(names) if n == alias]
        if len(where) > 1:
            cols = ", ".join(str(i + 1) for i in where)
            msg = (f"{path}:1: {what} column {alias!r} appears {len(where)} times in the header"
                   f" (columns {cols}); keep one")
            raise DataError(msg, [msg])
        if where:
            return where[0]
    if required:
        msg = (f"{path}:1: no {what} column (expected one of {', '.join(aliases)}{otherwise}); header is"
               f" {_header_shown(shown)}")
        sample = shown[:LOOKS_LIKE_DATA_SAMPLE]  # a line of a million fields is told by its first ones
        if sample and sum(_looks_like_data(n) for n in sample) * 2 > len(sample):
            msg += " (the first line looks like data: add a header line naming the columns)"
        raise DataError(msg, [msg])
    return None


def _header_shown(shown: list[str]) -> str:
    """A header line as a message shows it: whole up to :data:`HEADER_SHOWN` characters, else its start and how many
    names it has (a header of a million names is not echoed back whole)."""
    text = ",".join(shown)
    if len(text) <= HEADER_SHOWN:
        return _printable(text)
    return f"{_printable(text[:HEADER_SHOWN])}… ({len(shown)} names, {len(text)} characters)"


def _printable(text: str) -> str:
    """``text`` with each character that is not printable (a NUL, an escape sequence's ESC, a carriage return)
    written as its escape (``\\x00``): a header is echoed to a terminal and the journal, which must not take the file's
    bytes as control codes, nor hide them."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _looks_like_data(name: str) -> bool:
    """Whether a header name is a number or a time (``20230102 00:00:00.123``), as in a first line of data."""
    if is_number(name):
        return True
    try:
        time_any(name, "")
    except ValueError:
        return False
    return True


def mid_price(bid: float, ask: float) -> float:
    """The mid of two finite prices, itself finite: halved before they are added, so that two sides near the largest
    float (``1.7e308``) do not add up to infinity (the same number as ``0.5 * (bid + ask)`` wherever that is finite)."""
    return 0.5 * bid + 0.5 * ask


def signed_price(text: str, name: str, decimal_comma: bool) -> float:
    """A price field as a finite number of any sign; ValueError naming the column otherwise."""
    try:
        if decimal_comma:  # "1.000" is a thousand here: float() would read it as one
            raise ValueError
        price = float(text)
    except ValueError:
        price = quoted_number(text, name, False, decimal_comma)
    if not -_INF < price < _INF:
        raise ValueError(f"{name} {text.strip()!r} is not finite")
    return price


def read_volume(text: str, name: str, cols: Columns) -> float:
    """A volume field (>= 0, finite; empty or ``-`` is 0, counted in ``cols.blank_volumes``); ValueError naming the
    column otherwise."""
    try:
        if cols.decimal_comma:
            raise ValueError
        volume = float(text)
    except ValueError:
        if text.strip() in ("", "-"):  # a quote site's "no volume"
            cols.blank_volumes += 1
            return 0.0
        volume = quoted_number(text, name, True, cols.decimal_comma)
    if not 0.0 <= volume < _INF:
        if not math.isfinite(volume):
            raise ValueError(f"{name} {text.strip()!r} is not finite")
        raise ValueError(f"{name} {volume} is negative")
    return volume
