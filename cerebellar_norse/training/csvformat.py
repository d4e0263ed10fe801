"""How a tick file is written, and reading its rows: separator, header lines, column roles, date and number forms.

Columns are found by header name (case, blanks around a name, angle brackets and a
UTF-8 byte-order mark ignored); the first name present of each list is used and every
other column is ignored:

* time (required): ``timestamp``, ``unix``, ``time``, ``date``, ``datetime``, ``date_time``,
  ``gmt time``, ``utc time``, ``local time``, ``open time``, ``open_time``, … (``TIME_COLUMNS``: also
  Databento's ``ts_recv`` before ``ts_event``, Polygon's ``sip_timestamp``, CoinAPI's ``time_exchange``). A value is a
  number since the epoch, in ms (an integer, or an integral number with all its digits such
  as ``1.577836800123e12``) or in the unit of ``TIME_UNITS`` (seconds, µs, ns) whose span
  holds the file's first time (a later row before 1973-03-03 is of another unit: bad), or
  a date written ``YYYYMMDD`` (or ``YYYYMMDD.0``, as a float column is written) when the first time is one,
  a date-time written ``YYYYMMDDHHMM[SS]`` when the first time is one, a date and hour written ``YYYYMMDDHH``
  when every time of the first rows is one and the first read as seconds would be still to come,
  or an ISO 8601 date or date-time (``2020-01-02``, ``2020-01-02 15:30``,
  ``2020-01-02T15:30:00.123Z``, ``…+01:00``, ``… GMT+0100``; without an offset it is a wall-clock time in the
  file's zone, :attr:`Columns.zone`: UTC unless ``training.data_timezone`` or ``--timezone`` names another),
  from 1970-01-01 up to 2100-01-01; digits below 1 ms are dropped. Dates may
  also be written year first with dots or slashes (``2020.01.02``), or day and month
  with slashes or dots (``1/4/1999``, ``04.01.1999 15:30``), read month first or day
  first as the whole column shows (a day above 12 in one place, never in the other; a
  column that shows both, or dates with slashes that show neither, fails with ``file:
  …``; dates with dots that show neither are day first). A ``time``
  column of times of day (``00:00:00``) beside a ``date`` column completes that date, and so does an hour
  column (``HOUR_COLUMNS``: ``Date,Hour,Price``) beside dates without a time of day, read as hours ending
  1..24 or beginning 0..23 as its name or its values tell (:func:`hour_column`). Every time written without an
  offset (dates, date-times, ``YYYYMMDD…`` numbers, date and time or hour columns) is read in the file's zone; numbers
  since the epoch and times with an offset or zone name are exact. A time in a named zone
  (``20241103 01:30:00 US/Eastern``, or without an offset in a file zone with daylight saving time) that the zone
  repeats when the clocks go back is read as its first occurrence, unless its market's rows then go back
  (:func:`repeated_hour_time`); one that the zone skips when the clocks go forward is a bad row (:func:`~cerebellar_norse.training.csvtime._skipped_time`).
* price (required, > 0): ``price``, ``close``, ``last``, ``mid``, ``close/last``, ``adj close``,
  ``adj_close`` (so ``close`` is used, not ``adj close``, when a file has both); without
  any, the mid of a bid and an ask column (``BID_COLUMNS``, ``ASK_COLUMNS``). In a Databento file written
  without pretty_px, prices are integers in units of 1e-9, scaled (:func:`databento_fixed_point`). A Databento
  order book (mbp-1, mbp-10: book events, actions A, C, M, R, beside trades) is read at the mid of ``bid_px_00``
  and ``ask_px_00``, the top of book after each event (over a market's publishers, the highest bid and lowest ask
  of their latest rows), whatever its ``price``; a row whose book lacks a side is skipped, counted in
  ``Columns.skipped`` (:func:`databento_book_events`). A Databento market-by-order file (mbo: order events keyed
  by ``order_id``, no top of book) has each instrument's book rebuilt from its events (:mod:`.orderbook`) and is
  read at the mid of its best bid and best ask after each event's last record (flags F_LAST); its other records,
  and events that leave the book without a side, are skipped (:func:`databento_mbo`). In both, a book event is a
  tick only when it moves the best bid or ask price or trades, a book price may be any finite number (a calendar
  spread's can be 0 or below) and an event whose mid is not above 0 is skipped (:func:`_book_skip`); the files of one
  load carry their books on to the next (``file_format``'s ``books``).
* volume (optional, >= 0): ``volume``, ``tickvol``, ``tick_volume``, ``vol``, ``vol.``,
  ``size``, ``qty``, ``quantity`` (in a Databento order book, a trade's ``size``, 0 for a book event; in an mbo file
  the ``size`` of an event's trades, T); for quotes
  without one, the sum of a bid and an ask volume column;
  then the first column whose name starts with ``volume``; without one every tick has
  volume 0, and an empty or ``-`` field is 0 (noted). A volume may end in K, M or B
  (``1.23M``).
* market (optional): ``market_id``, ``market``, ``symbol``, ``sym``, ``ticker``,
  ``instrument``, ``pair``, ``instrument_id``
  (1–64 printable ASCII characters); without one the market is the file's name
  without its suffix (``EURUSD.csv`` → ``EURUSD``; a compressed file's without both, ``EURUSD.csv.gz`` → ``EURUSD``,
  :func:`file_stem`; a Binance file's name without its date, :func:`binance_symbol`), other characters replaced by
  ``_``.

Prices and volumes may be written with digit groups (``"3,289.29"``); a comma anywhere
else (a decimal comma) makes a bad row. Digits grouped by blanks or apostrophes (``43 000,00``,
``1'234.5``) are read with the point or comma after them as the decimal mark, and a price may have
a currency sign or a three-letter code before or after it (``$184.25``, ``1.50 EUR``). Fields are separated by commas, or, in a file
whose header line has none, by ``;``, tabs or ``|``; in a ``;`` file whose price or
volume column holds a comma, numbers have decimal commas (``1.234,50``).

Up to ``TITLE_LINES_MAX`` lines without a separator before the header (a download
site's name) are skipped. A file written by yfinance (``yf.download(ticker).to_csv()``: header lines ``Price,…``,
``Ticker,…`` and ``Date,,…``) is read with its first column as the time and the Ticker
line's ticker as the market. A pandas index written without a name (an empty first
header name) is the time column. A file without a header line is read only when it is one of
Binance's (klines, aggTrades, trades: :func:`binance_layout`).

:func:`file_format` works out how a file is written from its header line and, where the
header cannot tell, from the file itself (each probe, :func:`yfinance_header`,
:func:`clock_column`, :func:`has_decimal_commas`, :func:`slash_order`,
:func:`runs_newest_first`, reads what it needs); :mod:`cerebellar_norse.training.data`
reads the rows (:func:`parse_row`). A time field is read by :mod:`.csvtime`, a price or volume written with digit
groups, a currency or a suffix by :mod:`.csvnumbers`. Every pass opens the file with
:func:`~cerebellar_norse.training.compressed.open_tick_text`, so a gzip, bzip2, xz or one-file zip file reads as its
plain text.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from decimal import Decimal
from pathlib import Path
from typing import TextIO
from zoneinfo import ZoneInfo

from ..errors import DataError
from ..ticks import MARKET_ID_MAX, TS_MAX_MS
from ..timezones import zone_name
from .compressed import open_tick_text, without_compressed_suffix
from .csvnumbers import is_number, quoted_number
from .csvtime import (
    EPOCH,
    EPOCH_NAIVE,
    ONE_MS,
    SECONDS_HINT_MS,
    SLASH_DATE,
    TIME_UNITS,
    UNIT_WORDS,
    datetime_ms,
    from_slash,
    read_time,
    time_any,
    unit_time,
    yyyymmdd,
    yyyymmddhh,
    yyyymmddhhmm,
)
from .orderbook import F_LAST, F_TOB, OrderBooks, Sides, Top, best_of

# Header names per column, in order of preference (compared in lower case).
TIME_COLUMNS = ("timestamp", "unix", "time", "date", "datetime", "date_time", "gmt time", "utc time", "local time",
                "open time", "open_time", "time (utc)", "timestamp (utc)", "date (utc)", "datetime (utc)",
                "transact_time", "window_start", "datum",  # Dukascopy exports, Binance trades, Polygon flat files
                # Databento (ts_recv, by which its files are sorted, before ts_event), Polygon's trades and quotes
                # (sip_timestamp, by which they are sorted, before participant_timestamp), CoinAPI, exchange APIs
                "ts_recv", "ts_event", "sip_timestamp", "participant_timestamp", "time_exchange", "ts", "t")
PRICE_COLUMNS = ("price", "close", "last", "mid", "close/last", "adj close", "adj_close")  # close/last: Nasdaq.com
# Quotes without a price column: the price is the mid of bid and ask, the volume the sum of both sides' volumes.
# (bid_px_00 and ask_px_00: Databento's top of book, mbp-1, tbbo, bbo)
BID_COLUMNS = ("bid", "bid price", "bid_price", "bidprice", "best bid", "best_bid", "bid_px_00")
ASK_COLUMNS = ("ask", "ask price", "ask_price", "askprice", "offer", "offer price", "best ask", "best_ask", "ask_px_00")
BID_VOLUME_COLUMNS = ("bidvolume", "bid volume", "bid_volume", "bid size", "bid_size", "bidsize", "bid vol", "bid_vol",
                      "bid_sz_00")
ASK_VOLUME_COLUMNS = ("askvolume", "ask volume", "ask_volume", "ask size", "ask_size", "asksize", "ask vol", "ask_vol",
                      "offer size", "offer_size", "ask_sz_00")
# MetaTrader: <TICKVOL> over <VOL>; quantity: Binance's aggTrades
VOLUME_COLUMNS = ("volume", "tickvol", "tick_volume", "vol", "vol.", "size", "qty", "quantity")
VOLUME_PREFIX = "volume"  # without any of VOLUME_COLUMNS, the first column named so (Volume BTC, Volume_(BTC))
# instrument_id: Databento's numeric instrument, in a file saved without its symbol column (map_symbols off)
MARKET_COLUMNS = ("market_id", "market", "symbol", "sym", "ticker", "instrument", "pair", "instrument_id")
# Databento's CSV without pretty_px (its batch downloads' default) writes prices as integers in units of 1e-9
# (4108500000000 is 4108.5) and a missing price as UNDEF_PRICE (INT64_MAX); its header names rtype and publisher_id
DATABENTO_FIELDS = frozenset(("rtype", "publisher_id"))
# Databento's order-book schemas (mbp-1, mbp-10) hold book events beside trades: each row carries the top of book after
# its event (bid_px_00, ask_px_00), and its price and size are the event's (an order added, cancelled or modified at
# one side, at any level). Actions: Add, Cancel, Modify, cleaR book change the book and trade nothing; Trade and Fill
# trade their size; None (N) does neither.
DATABENTO_ACTION = "action"
DATABENTO_BOOK_ACTIONS = frozenset("ACMR")
DATABENTO_TRADE_ACTIONS = frozenset("TF")
DATABENTO_TOP = ("bid_px_00", "ask_px_00")
ONE_SIDED_BOOK = "the book lacks a side (bid_px_00 or ask_px_00 empty or UNDEF_PRICE: before the open, after a clear)"
# A book event (mbp row, mbo event) is a tick only when it moves the best bid or ask price or trades: one deeper in the
# book, or changing only the top's size, would repeat the previous tick and stretch a label horizon counted in ticks.
# Book prices may be 0 or below (a calendar spread's, in a parent-symbol download): such an event is no tick either.
BOOK_NOT_POSITIVE = "the book's mid is not above 0 (a spread's prices can be; a tick needs a positive price)"
BOOK_UNCHANGED = "the best bid and ask prices did not change and nothing traded"
# Databento's market-by-order schema (mbo): order events keyed by order_id, no top-of-book columns; the book is rebuilt
# from them (see databento_mbo and the orderbook module). Only T prints a trade: F is the resting order's side of the
# same trade (Nasdaq's "Order Executed" becomes Trade, Fill, then Cancel), so counting it too would double the volume.
MBO_FIELDS = frozenset(("action", "side", "order_id", "price", "size"))
MBO_ACTIONS = "A, C, M, R, T, F, N"
MBO_ONE_SIDED = "the book lacks a side (no bid or no ask order after its event: before the first orders, after a clear)"
MBO_MID_EVENT = ("not the last record of its event (flags without F_LAST, 128): the book is consistent only after the"
                 " last, whose tick carries the event's trades")
_ORDER_SIDES = {"B": True, "A": False}  # an order's side: bid (True) or ask
DATABENTO_UNDEF_PRICE = "9223372036854775807"
FIXED_POINT_MIN = 10**6  # a price of 0.001 in Databento's units of 1e-9: a file of smaller whole prices is not theirs
_FIXED_PRICE = re.compile(r"-?\d+")
# data.binance.vision's files, headerless (spot, and futures before their files had a header), by layout: the column
# names Binance's futures files give them (open_time, transact_time and time are time columns, close and price the
# price, volume, quantity and qty the volume)
BINANCE_KLINES = ("open_time", "open", "high", "low", "close", "volume", "close_time", "quote_volume", "count",
                  "taker_buy_volume", "taker_buy_quote_volume", "ignore")
BINANCE_AGG_TRADES = ("agg_trade_id", "price", "quantity", "first_trade_id", "last_trade_id", "transact_time",
                      "is_buyer_maker", "is_best_match")
BINANCE_TRADES = ("id", "price", "qty", "quote_qty", "time", "is_buyer_maker", "is_best_match")
BINANCE_SAMPLE = 50  # headerless rows that must all fit a Binance layout for a file to be read as one
_BINANCE_BOOLEANS = frozenset(("True", "False", "true", "false"))
# BTCUSDT-1m-2024-01-01, BTCUSDT-trades-2024-01: symbol and interval or kind, then the date
_BINANCE_NAME = re.compile(r"([A-Z0-9]{2,32}-[A-Za-z0-9]{1,16})-\d{4}-\d{2}(?:-\d{2})?")
DATE_HOUR_SAMPLE = 10_000  # rows whose times must all be YYYYMMDDHH date-hours for a file to be read as such
PLAUSIBLE_MS = 100_000_000_000  # 1973-03-03: in a file whose first time is later, an earlier one is of another unit
TITLE_LINES_MAX = 5  # lines without a separator skipped before the header (a download site's name or URL)
DELIMITERS = (",", ";", "\t", "|")  # field separators a file may use; a comma unless its header has none
# a time of day in a column of its own: 9:30, 09:30:00.250, or digits only (stooq's 153500, 0930)
_CLOCK = re.compile(r"\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?$|\d{6}$|\d{4}$")
_INF = math.inf


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
    newest_first: bool = False  # rows run newest first (see runs_newest_first)
    fixed_point: bool = False  # prices are Databento's integers in units of 1e-9 (see databento_fixed_point)
    time_unit: str = "ms"  # unit of numeric times (a key of UNIT_WORDS), from the first time (see time_unit_of)
    time_floor: int = 0  # a numeric time before this (ms) is of another unit than the file's (see time_unit_of)
    ask: int | None = None  # with ``price`` the bid: the price is their mid
    ask_name: str = ""
    ask_volume: int | None = None  # with ``volume`` the bid side's: the volume is their sum
    ask_volume_name: str = ""
    quotes: dict[str, list[float]] = field(default_factory=dict)  # market -> its latest bid and ask (empty: unchanged)
    action: int | None = None  # Databento's action column of an order-book file (see databento_book_events): the
    # price is the mid of the row's own top of book, the volume a trade's size only
    action_name: str = ""
    mbo: MboColumns | None = None  # a Databento mbo file (see databento_mbo): price the mid of its rebuilt book
    # an order-book file's markets -> their bid_px_00 and ask_px_00 in their previous row (None: a side lacked), to
    # tell whether a row moved them (see databento_book_events; shared by the files of one load)
    tops: dict[str, Top | None] = field(default_factory=dict)
    publisher: int | None = None  # an order-book file's publisher_id: a market's top is the best over its venues'
    # an order-book file's markets -> publisher -> its bid_px_00 and ask_px_00 in its latest row (None: no order there)
    venues: dict[str, dict[str, Sides]] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # why -> rows skipped so (neither ticks nor bad rows)
    zone: tzinfo = UTC  # the zone of times written without an offset or zone (training.data_timezone)
    zone_used: bool = False  # a row's time was read in ``zone`` (not UTC) for want of an offset of its own

    def used_fields(self, row: list[str]) -> list[str]:
        """The fields of a row that are read (none when the row has the wrong field count)."""
        if len(row) != self.fields:
            return []
        used = (self.time, self.clock, self.price, self.ask, self.volume, self.ask_volume, self.market, self.action,
                self.publisher, *(self.mbo.names if self.mbo is not None else ()))
        return [row[i] for i in used if i is not None]

    def describe(self, path: Path) -> FileFormat:
        """How the file at ``path`` was read, for people (``cerebellar-norse inspect-data``)."""
        return FileFormat(
            path=str(path), separator={",": ",", ";": ";", "\t": "tab", "|": "|"}[self.delimiter],
            header_lines=self.header_rows,
            time=self.time_name + (f" + {self.clock_name}" if self.clock is not None else ""),
            time_unit=None if self.iso and self.time_unit == "ms" else self.time_unit,
            dates=None if self.day_first is None else ("day/month/year" if self.day_first else "month/day/year"),
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


def not_utf8(fields: list[str]) -> str:
    """``"not UTF-8 text (byte 0x..)"`` when a field holds a byte that did not decode, else ``""``."""
    for text in fields:
        for ch in text:
            if "\udc80" <= ch <= "\udcff":
                return f"not UTF-8 text (byte 0x{ord(ch) - 0xDC00:02x})"
    return ""


@contextlib.contextmanager
def _data_rows(path: Path, cols: Columns) -> Iterator[Iterator[list[str]]]:
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


def slash_order(path: Path, cols: Columns) -> bool | None:
    """Whether a file's dates written with slashes or dots are day first (True) or month first (False), decided
    over its whole time column; None when its first time is not such a date. Dates with dots that do not tell are
    day first (as dates with dots are written); DataError when dates with slashes do not tell, or the column mixes
    both orders."""
    day_first = month_first = False
    example = {True: "", False: ""}
    try:
        with _data_rows(path, cols) as reader:
            seen = False
            for row in reader:
                text = row[cols.time].strip() if len(row) == cols.fields else ""
                if not text or not _can_be_time(text):  # a placeholder ("null", "N/A") is a bad row, not the form
                    continue
                m = SLASH_DATE.match(text)
                if not seen:
                    if m is None:
                        return None
                    seen, first, dots = True, text, m[2] == "."
                if m is None:
                    continue  # reported as a bad row by the reading pass
                if int(m[1]) > 12 and not day_first:
                    day_first, example[True] = True, text
                if int(m[3]) > 12 and not month_first:
                    month_first, example[False] = True, text
            if not seen:
                return None
    except (OSError, csv.Error):
        return None  # the reading pass reports it
    name = cols.time_name
    if day_first and month_first:
        msg = (f"{path}: {name} mixes day-first ({example[True]!r}) and month-first ({example[False]!r}) dates;"
               " write them as ISO 8601 (YYYY-MM-DD)")
        raise DataError(msg, [msg])
    if not (day_first or month_first):
        if dots:
            return True  # dates with dots are written day first (Dukascopy's 02.01.2020)
        msg = (f"{path}: {name} dates such as {first!r} could be month/day or day/month (no day above 12 in the file);"
               " write them as ISO 8601 (YYYY-MM-DD)")
        raise DataError(msg, [msg])
    return day_first


HEADER_SHOWN = 500  # characters of a header line that a refusal shows
LOOKS_LIKE_DATA_SAMPLE = 1000  # header names read to tell a first line of data


def header_name(name: str) -> str:
    return " ".join(name.replace("\ufeff", "").split())


def _match_name(shown: str) -> str:
    """A header name as the column lists hold it: lower case, without angle brackets (MetaTrader writes ``<DATE>``)."""
    return shown.lower().removeprefix("<").removesuffix(">")


def _find_column(path: Path, names: list[str], shown: list[str], aliases: tuple[str, ...], what: str,
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
        return text
    return f"{text[:HEADER_SHOWN]}… ({len(shown)} names, {len(text)} characters)"


def _looks_like_data(name: str) -> bool:
    """Whether a header name is a number or a time (``20230102 00:00:00.123``), as in a first line of data."""
    if is_number(name):
        return True
    try:
        time_any(name, "")
    except ValueError:
        return False
    return True


def _unnamed_index(names: list[str]) -> bool:
    """True when the first header name is empty or pandas' ``Unnamed: 0`` (an index written by ``to_csv``)."""
    return bool(names) and (names[0] == "" or names[0] == "unnamed: 0")


def leading_lines(fh: TextIO) -> tuple[int, str]:
    """Lines before a file's header, and its field separator (see :func:`delimiter_of`), reading from ``fh``'s start.

    A download site may write its name or address on a line of its own above the header (CryptoDataDownload's
    ``https://www.CryptoDataDownload.com``): up to ``TITLE_LINES_MAX`` lines without any separator (or blank) are
    skipped when a line after them has one.
    """
    lines: list[str] = []
    for _ in range(TITLE_LINES_MAX + 1):
        line = fh.readline()
        if not line:
            break
        if any(d in line for d in DELIMITERS):
            return len(lines), delimiter_of(line)
        lines.append(line)
    return 0, delimiter_of(lines[0] if lines else "")


def delimiter_of(first_line: str) -> str:
    """A file's field separator from its first line: a comma when the line has one, else the most frequent of
    ``;``, tab and ``|`` (a comma when it has none of them either)."""
    if "," in first_line:
        return ","
    best = max(DELIMITERS[1:], key=first_line.count)
    return best if first_line.count(best) else ","


def clock_column(path: Path, header: list[str], cols: Columns) -> int | None:
    """The ``time`` column of a file that also has a ``date`` column, when it holds times of day (``00:00:00``):
    then the time column is moved to the date, which the clock completes. None otherwise."""
    names = [_match_name(header_name(h)) for h in header]
    if names[cols.time] != "time" or "date" not in names:
        return None
    try:
        with _data_rows(path, cols) as reader:
            first = next((r for r in reader if len(r) == cols.fields and r[cols.time].strip()), None)
    except (OSError, csv.Error):
        return None
    if first is None or not _CLOCK.match(first[cols.time].strip()):
        return None
    clock, date = cols.time, names.index("date")
    cols.time, cols.time_name = date, header_name(header[date])
    return clock


# hour columns beside a date (electricity prices: Date,Hour,Price), and how each name says whether its hours end
# (1..24) or begin (0..23) the hour they stand for (None: the column's values tell)
HOUR_COLUMNS = {"hour": None, "hr": None, "hour ending": True, "hour_ending": True, "hourending": True, "he": True,
                "hour beginning": False, "hour_beginning": False, "hourbeginning": False, "hb": False}
_HOUR = re.compile(r"(\d{1,2})(?:\.0*|:00)?$")  # 1, 01, 24, 1.0 (a float column), 24:00 (ERCOT's hour ending)
# a date without a time of day (which an hour column completes)
_DATE_ONLY = re.compile(r"\d{4}-\d{2}-\d{2}|\d{8}|\d{1,2}([/.])\d{1,2}\1\d{4}|\d{4}([/.])\d{1,2}\2\d{1,2}")


def hour_column(path: Path, header: list[str], cols: Columns) -> str | None:
    """An hour column (``HOUR_COLUMNS``) beside a time column of dates without a time of day (``Date,Hour,Price``, as
    electricity prices are written) becomes the file's clock: each row is read at the start of its hour. Whether
    the hours end (1..24, hour 1 is 00:00-01:00) or begin (0..23) the hour they stand for is the column's name's
    (``Hour Ending``) or else its values' (a 24 and no 0: ending; a 0 and no 24: beginning); sets ``cols.clock``,
    ``cols.clock_name`` and ``cols.hour_ending`` and returns a note saying which. None (nothing set) for a file
    without such columns; DataError when the hour column holds no hours, or does not tell which."""
    names = [_match_name(header_name(h)) for h in header]
    where = next(((i, HOUR_COLUMNS[n]) for i, n in enumerate(names) if n in HOUR_COLUMNS and i != cols.time), None)
    if where is None:
        return None
    clock, ending = where
    name, date_name = header_name(header[clock]), cols.time_name
    seen = {0: False, 24: False}
    first = ""
    try:
        with _data_rows(path, cols) as reader:
            for row in reader:
                if len(row) != cols.fields:
                    continue
                if not first:
                    date = row[cols.time].strip()
                    if not date or not row[clock].strip():  # a row without one is a bad row of the reading pass
                        continue
                    if not _DATE_ONLY.fullmatch(date):
                        return None  # date-times: the hour column is not needed
                    first = row[clock].strip()
                    if _HOUR.match(first) is None:
                        msg = (f"{path}: {name} {first!r} beside {date_name} {date!r} is not an hour (0..23, or 1..24"
                               " for hours ending): write hours as numbers, or the times as ISO 8601 date-times"
                               " (2024-01-02T05:00) in one column")
                        raise DataError(msg, [msg])
                m = _HOUR.match(row[clock].strip())
                if m is not None and int(m[1]) in seen:
                    seen[int(m[1])] = True
    except (OSError, csv.Error):
        return None  # the reading pass reports it
    if not first:
        return None
    if ending is None:
        if seen[0] == seen[24]:
            shows = "both 0 and 24" if seen[0] else "neither 0 nor 24"
            msg = (f"{path}: {name} holds {shows}, so its hours could be hours ending (1..24) or hours beginning"
                   f" (0..23); name the column 'Hour Ending' or 'Hour Beginning'")
            raise DataError(msg, [msg])
        ending = seen[24]
    cols.clock, cols.clock_name, cols.hour_ending = clock, name, ending
    how = "hours ending 1..24 (hour 1 is 00:00-01:00)" if ending else "hours beginning 0..23 (hour 0 is 00:00-01:00)"
    return f"{path}: time from the {date_name} and {name} columns: {name} read as {how}; each row at its hour's start"


def has_decimal_commas(path: Path, cols: Columns) -> bool:
    """Whether a file's price or volume column holds a comma anywhere (then its numbers have decimal commas)."""
    used = [i for i in (cols.price, cols.volume) if i is not None]
    try:
        with _data_rows(path, cols) as reader:
            return any(len(r) == cols.fields and any("," in r[i] for i in used) for r in reader)
    except (OSError, csv.Error):
        return False


YF_ROW_NUMBER = "(row number)"  # the first column of yfinance's download after reset_index(): no price


def yfinance_header(path: Path, header: list[str], delimiter: str = ",",
                    skip: int = 0) -> tuple[str, str, int] | None:
    """The first column's name, the ticker and the header lines of a file written by ``yf.download(...).to_csv()``
    (header lines ``Price,Close,…``, ``Ticker,AAPL,…`` and ``Date,,…``: the first column is the time) or by
    ``yf.download(...).reset_index().to_csv()`` (``Price,Date,Close,…`` and ``Ticker,,AAPL,…``: the first column
    counts the rows, and is no price: ``YF_ROW_NUMBER``); the ticker "" when it is not a valid market id. None for
    any other file (the header is the line after ``skip`` lines). DataError for a download of several tickers
    (each column named once per ticker)."""
    if not header or header_name(header[0]).lower() != "price":
        return None
    try:
        with open_tick_text(path) as fh:
            reader = csv.reader(fh, delimiter=delimiter)
            for _ in range(skip + 1):
                next(reader, None)
            second, third = next(reader, None), next(reader, None)
    except (OSError, csv.Error):
        return None
    if second is None or len(second) != len(header) or header_name(second[0]).lower() != "ticker":
        return None
    if (third is not None and len(third) == len(header) and not any(c.strip() for c in third[1:])
            and header_name(third[0]).lower() in TIME_COLUMNS):
        first, lines = header_name(third[0]), 3
    elif any(not second[i].strip() and header_name(h).lower() in TIME_COLUMNS for i, h in enumerate(header) if i):
        first, lines = YF_ROW_NUMBER, 2  # reset_index(): the date is a column of its own, without a ticker
    else:
        return None
    tickers = {t.strip() for t in second[1:] if t.strip()}
    if len(tickers) > 1:
        msg = (f"{path}:2: a download of {len(tickers)} tickers ({', '.join(sorted(tickers)[:5])}); "
               "save one ticker per file (yf.download(ticker).to_csv(...))")
        raise DataError(msg, [msg])
    (ticker,) = tickers or {""}
    valid = 1 <= len(ticker) <= MARKET_ID_MAX and all(" " <= ch <= "~" for ch in ticker)
    return first, ticker if valid else "", lines


def file_stem(path: Path) -> str:
    """A file's name without its suffix, or without a compression suffix and the text suffix before it
    (``EURUSD.csv`` and ``EURUSD.csv.gz`` are ``EURUSD``, ``BTCUSDT-1m-2024-01-01.zip``
    ``BTCUSDT-1m-2024-01-01``; see :func:`~cerebellar_norse.training.compressed.without_compressed_suffix`)."""
    name = Path(path).name
    bare = without_compressed_suffix(name)
    return bare if bare != name else Path(path).stem


def _market_from_file_name(path: Path) -> str:
    """The file's stem as a market id: printable ASCII (others become ``_``), 1–64 characters."""
    text = "".join(ch if " " <= ch <= "~" else "_" for ch in file_stem(path)).strip()
    return text[:MARKET_ID_MAX].rstrip() or "_"


def columns_of(path: Path, header: list[str], notes: list[str], ticker: str = "",
               ticker_from: str = "the header's Ticker row") -> Columns:
    """The columns of a file from its header line; notes for the optional columns it lacks. ``ticker`` is the
    market of a file without a market column when its header (yfinance's Ticker row) or name (``ticker_from``) says
    it."""
    shown = [header_name(h) for h in header]
    names = [_match_name(s) for s in shown]
    t = _find_column(path, names, shown, TIME_COLUMNS, "time", not _unnamed_index(names))
    if t is None:  # pandas' to_csv writes a date index as an unnamed first column
        t = 0
        notes.append(f"{path}: unnamed first column used as the time (a pandas index)")
    p = _find_column(path, names, shown, PRICE_COLUMNS, "price", False)
    bid = ask = bid_v = ask_v = None
    if p is None:  # quotes: the mid of bid and ask
        bid = _find_column(path, names, shown, BID_COLUMNS, "bid", False)
        ask = _find_column(path, names, shown, ASK_COLUMNS, "ask", False)
        if bid is None or ask is None:
            _find_column(path, names, shown, PRICE_COLUMNS, "price", True, ", or a bid and an ask column")
        else:
            p = bid
            notes.append(f"{path}: price is the mid of {shown[bid]!r} and {shown[ask]!r}")
    v = _find_column(path, names, shown, VOLUME_COLUMNS, "volume", False)
    if v is None and bid is not None:
        bid_v = _find_column(path, names, shown, BID_VOLUME_COLUMNS, "bid volume", False)
        ask_v = _find_column(path, names, shown, ASK_VOLUME_COLUMNS, "ask volume", False)
        if bid_v is not None and ask_v is not None:
            v = bid_v
            notes.append(f"{path}: volume is {shown[bid_v]!r} + {shown[ask_v]!r}")
        else:
            ask_v = None
    if v is None:
        v = next((i for i, n in enumerate(names) if n.startswith(VOLUME_PREFIX)), None)
        if v is not None:
            notes.append(f"{path}: volume from {shown[v]!r}")
    m = _find_column(path, names, shown, MARKET_COLUMNS, "market", False)
    assert t is not None and p is not None
    default_market = ""
    if v is None:
        notes.append(f"{path}: no volume column; volume 0 used")
    if m is None and ticker:
        default_market = ticker
        notes.append(f"{path}: market id {ticker!r} from {ticker_from}")
    elif m is None:
        default_market = _market_from_file_name(path)
        notes.append(f"{path}: no market column; market id {default_market!r} (from the file name) used")
    return Columns(len(header), t, shown[t], p, shown[p], v, "" if v is None else shown[v],
                   m, "" if m is None else shown[m], default_market, ask=ask, ask_name="" if ask is None else shown[ask],
                   ask_volume=ask_v, ask_volume_name="" if ask_v is None else shown[ask_v])



def repeated_hour_time(row: list[str], cols: Columns) -> int | None:
    """ms since the epoch of a row's time read as the second occurrence of a wall-clock time that its time zone
    repeats when the clocks go back (Interactive Brokers' ``20241103 01:30:00 US/Eastern``, or ``2024-11-03 01:30``
    in a file read in America/New_York: 01:00-01:59 comes twice, and is read as the first unless this is asked for);
    None when the time was not read in a zone with daylight saving time, or is not repeated there."""
    if len(row) != cols.fields:
        return None
    try:
        text = row[cols.time] if cols.clock is None else _with_clock(row, cols)
        ms, zone, _ = read_time(text, cols.time_name, cols.day_first, cols.time_unit, cols.zone)
    except ValueError:
        return None
    if not isinstance(zone, ZoneInfo):
        return None
    wall = (EPOCH + ms * ONE_MS).astimezone(zone)
    if wall.fold:  # already the second occurrence
        return None
    later = datetime_ms(wall.replace(fold=1))
    return later if ms < later < TS_MAX_MS else None


def _iso_time(text: str, cols: Columns) -> int:
    """The fast path for a column of ISO 8601 times (UTC, or with an offset); anything else, and a time without an
    offset in a file read in another zone, goes to :func:`_row_time`."""
    s = text.strip()
    if not s.isdigit():  # an integer is ms, even in a column of dates
        try:
            dt = datetime.fromisoformat(s if cols.day_first is None else from_slash(s, cols.day_first))
        except ValueError:
            pass
        else:
            if dt.tzinfo is not None or cols.zone is UTC:
                ms = (dt - EPOCH_NAIVE) // ONE_MS if dt.tzinfo is None else (dt - EPOCH) // ONE_MS
                if 0 <= ms < TS_MAX_MS:
                    return ms
    return _row_time(text, cols, cols.day_first, cols.time_unit)


def _row_time(text: str, cols: Columns, day_first: bool | None = None, unit: str = "ms") -> int:
    """A row's time field by :func:`~cerebellar_norse.training.csvtime.time_any` in the file's zone; marks ``cols.zone_used`` when the time had no
    offset of its own and that zone is not UTC."""
    ms, _, file_zone = read_time(text, cols.time_name, day_first, unit, cols.zone)
    if file_zone and cols.zone is not UTC:
        cols.zone_used = True
    return ms


_GROUP_HEAD = re.compile(r"[+-]?[$€£¥]?\d{1,3}$")  # 1 of an unquoted 1,234.50 split at its comma
_GROUP_TAIL = re.compile(r"\d{3}(?:\.\d*)?$")  # 234.50 of it


def split_number_hint(row: list[str], cols: Columns) -> str:
    """A hint for a row of a comma-separated file with more fields than its header when a number with digit groups
    was written without quotes (``1,234.50`` is two fields, ``1`` and ``234.50``); "" otherwise."""
    if cols.delimiter != "," or len(row) <= cols.fields:
        return ""
    for a, b in itertools.pairwise(row):
        if _GROUP_HEAD.match(a.strip()) and _GROUP_TAIL.match(b.strip()):
            return (f" (a number with digit groups written without quotes, such as {a.strip()},{b.strip()}, is split"
                    " at its comma: quote such numbers or save them without digit groups)")
    return ""


def parse_row(row: list[str], cols: Columns) -> tuple[int, str, float, float] | None:
    """One data row as (ms, market, price, volume); ValueError with the reason (column named as in the header). None
    for a row that is no tick and no bad row either (an order book without one side), counted in ``cols.skipped``."""
    if len(row) != cols.fields:
        raise ValueError(f"expected {cols.fields} fields, got {len(row)}{split_number_hint(row, cols)}")
    text = row[cols.time] if cols.clock is None else _with_clock(row, cols)
    iso = cols.iso
    if iso is None and text.strip():  # the first time value decides the fast path of the file
        iso = cols.iso = not is_number(text)
    if iso:
        ts = _iso_time(text, cols)
    else:
        if cols.time_unit != "ms":
            ts = _row_time(text, cols, None, cols.time_unit)
        else:
            try:
                ts = int(text)
            except ValueError:
                ts = _row_time(text, cols)
            else:
                if not 0 <= ts < TS_MAX_MS:
                    ts = _row_time(text, cols)
        if ts < cols.time_floor:
            raise ValueError(f"{cols.time_name} {text.strip()!r} read as {UNIT_WORDS[cols.time_unit]} since epoch is before"
                             " 1973-03-03, unlike the file's first time: a time in another unit?")
    if cols.market is None:
        market = cols.default_market
    else:
        raw = row[cols.market]
        known = cols.known_markets.get(raw)
        if known is None:
            market = raw.strip()
            if not 1 <= len(market) <= MARKET_ID_MAX or not all(" " <= ch <= "~" for ch in market):
                raise ValueError(f"{cols.market_name} {market!r} is not 1-{MARKET_ID_MAX} printable characters")
            cols.known_markets[raw] = market
        else:
            market = known
    if cols.mbo is not None:
        return _mbo_tick(row, cols, cols.mbo, ts, market)
    if cols.action is not None:
        return _book_tick(row, cols, ts, market)
    if cols.ask is None:
        price = _fixed_price(row[cols.price], cols.price_name) if cols.fixed_point else _price(
            row[cols.price], cols.price_name, cols.decimal_comma)
    else:
        price = _mid(row, market, cols)
    if cols.volume is None:
        return ts, market, price, 0.0
    volume = _volume(row[cols.volume], cols.volume_name, cols)
    if cols.ask_volume is not None:
        blanks = cols.blank_volumes
        volume += _volume(row[cols.ask_volume], cols.ask_volume_name, cols)
        if volume == _INF:  # two finite sides near the largest float
            raise ValueError(f"{cols.volume_name} + {cols.ask_volume_name} is not finite (each side is, their sum is"
                             " not): no volume is that large")
        cols.blank_volumes = min(cols.blank_volumes, blanks + 1)  # a row counts once
    return ts, market, price, volume


def _with_clock(row: list[str], cols: Columns) -> str:
    """The date of a row completed by its time of day (``cols.clock``); ValueError when the time of day is empty."""
    assert cols.clock is not None
    clock = row[cols.clock].strip()
    if not clock:
        raise ValueError(f"{cols.clock_name} is empty (a time of day is needed beside {cols.time_name})")
    if cols.hour_ending is not None:
        clock = _hour_clock(clock, cols.clock_name, cols.hour_ending)
    return f"{row[cols.time].strip()} {clock}"


def _hour_clock(text: str, name: str, ending: bool) -> str:
    """The start of the hour an hour field stands for, as ``HH:00`` (hour ending 1 and hour beginning 0 are
    ``00:00``); ValueError naming the column when the field is no hour of its kind."""
    m = _HOUR.match(text)
    low = 1 if ending else 0
    if m is None or not low <= int(m[1]) <= low + 23:
        kind = "an hour ending 1..24" if ending else "an hour beginning 0..23"
        raise ValueError(f"{name} {text!r} is not {kind}")
    return f"{int(m[1]) - low:02d}:00"


def mid_price(bid: float, ask: float) -> float:
    """The mid of two finite prices, itself finite: halved before they are added, so that two sides near the largest
    float (``1.7e308``) do not add up to infinity (the same number as ``0.5 * (bid + ask)`` wherever that is finite)."""
    return 0.5 * bid + 0.5 * ask


def _mid(row: list[str], market: str, cols: Columns) -> float:
    """The mid of a quote row's bid and ask; an empty side is the market's previous one (MetaTrader writes only the
    side that changed)."""
    assert cols.ask is not None
    last = cols.quotes.get(market)
    sides = []
    for k, (i, name) in enumerate(((cols.price, cols.price_name), (cols.ask, cols.ask_name))):
        text = row[i]
        if not _no_price(text, cols):
            sides.append(_fixed_price(text, name) if cols.fixed_point else _price(text, name, cols.decimal_comma))
        elif last is not None:
            sides.append(last[k])
        else:
            what = "empty" if not text.strip() else "Databento's UNDEF_PRICE"
            raise ValueError(f"{name} is {what} and market {market!r} has no earlier {name} to keep")
    cols.quotes[market] = sides
    return mid_price(sides[0], sides[1])


def _book_tick(row: list[str], cols: Columns, ts: int, market: str) -> tuple[int, str, float, float] | None:
    """A Databento order-book row (mbp-1, mbp-10) as (ms, market, mid of its bid_px_00 and ask_px_00, size of a trade,
    T or F, else 0); None, counted in ``cols.skipped``, for a row that is no tick (see :func:`_book_skip`).
    ValueError for a field that cannot be read, the market's previous top kept."""
    assert cols.action is not None
    top = _book_top(row, cols, market)
    traded = row[cols.action].strip() in DATABENTO_TRADE_ACTIONS
    volume = _volume(row[cols.volume], cols.volume_name, cols) if traded and cols.volume is not None else 0.0
    why = _book_skip(cols.tops, market, top, traded, ONE_SIDED_BOOK)
    if why is not None:
        _skip(cols, why)
        return None
    assert top is not None
    return ts, market, mid_price(top[0], top[1]), volume


def _book_top(row: list[str], cols: Columns, market: str) -> Top | None:
    """``market``'s best bid and ask after an order-book row's event (any finite prices): the row's own bid_px_00 and
    ask_px_00, or with several publishers the highest bid and lowest ask over each one's latest row (as an mbo
    file's book is read); None when no publisher has a bid or none has an ask (an empty or UNDEF_PRICE side: no order
    there, and an earlier quote would price a book gone since). ValueError, nothing kept, for a price that cannot
    be read."""
    assert cols.ask is not None
    bid_text, ask_text = row[cols.price], row[cols.ask]
    sides: Sides = (None if _no_price(bid_text, cols) else _book_price(bid_text, cols.price_name, cols),
                    None if _no_price(ask_text, cols) else _book_price(ask_text, cols.ask_name, cols))
    if cols.publisher is None:
        return best_of((sides,))
    venues = cols.venues.get(market)
    if venues is None:
        venues = cols.venues[market] = {}
    venues[row[cols.publisher].strip()] = sides
    return best_of(venues.values())


def _book_skip(tops: dict[str, Top | None], key: str, top: Top | None, traded: bool, one_sided: str) -> str | None:
    """Why a book event after which ``key``'s best bid and ask are ``top`` is no tick, None when it is one; ``top``
    becomes ``key``'s previous top in ``tops`` either way. No tick: a side lacks (``one_sided``), the mid is not above
    0, or neither best price moved from the previous top and the event traded nothing (``traded``). The first top of
    a market moves from none."""
    before = tops.get(key)
    tops[key] = top
    if top is None:
        return one_sided
    if not mid_price(top[0], top[1]) > 0.0:
        return BOOK_NOT_POSITIVE
    if top == before and not traded:
        return BOOK_UNCHANGED
    return None


def _skip(cols: Columns, why: str) -> None:
    """Count a row that is neither a tick nor a bad row under ``why`` in ``cols.skipped``."""
    cols.skipped[why] = cols.skipped.get(why, 0) + 1


def _mbo_tick(row: list[str], cols: Columns, m: MboColumns, ts: int, market: str) -> tuple[int, str, float, float] | None:
    """Apply a Databento mbo row's event to its instrument's book (see :mod:`.orderbook`); on the last record of an
    event (flags F_LAST; every row without a flags column) the tick (ms, market, mid of the best bid and best ask over
    the instrument's publishers, units traded by the event's T records). None, counted in ``cols.skipped``, for any
    other record and for an event that is no tick (see :func:`_book_skip`: it moved neither best price and traded
    nothing, or its book lacks a side or has a mid not above 0). ValueError, and no book changed, for a row that
    cannot be read."""
    assert cols.volume is not None
    flags = _mbo_flags(row, m)
    instrument = market if m.instrument is None else row[m.instrument]
    event = (instrument, row[m.publisher])
    action = row[m.action].strip()
    books = m.books
    last = flags is None or bool(flags & F_LAST)
    try:
        if action in ("A", "M", "C"):
            _mbo_order(row, cols, m, event, action, flags)
        elif action == "T":
            traded = books.pending.get(event, 0.0) + _volume(row[cols.volume], cols.volume_name, cols)
            if traded == _INF:  # finite sizes near the largest float
                raise ValueError(f"{cols.volume_name}: the sizes of the event's trades (action T) add up to more than"
                                 " any finite number: no volume is that large")
            books.pending[event] = traded
        elif action == "R":
            books.book(*event).clear()
        elif action not in ("F", "N"):  # neither changes the book (the cancel that follows a fill does)
            raise ValueError(f"{m.names[m.action]} {action!r} is not one of Databento's actions ({MBO_ACTIONS})")
    except ValueError:
        if last:  # the event ends in a bad row: its trades are not carried to the next event
            books.pending.pop(event, None)
        raise
    if not last:
        _skip(cols, MBO_MID_EVENT)
        return None
    volume = books.pending.pop(event, None)  # a skipped event's trades are not carried to a later one
    top = books.top(instrument)
    why = _book_skip(books.tops, instrument, top, volume is not None, MBO_ONE_SIDED)
    if why is not None:
        _skip(cols, why)
        return None
    assert top is not None
    return ts, market, mid_price(top[0], top[1]), volume or 0.0


def _mbo_order(row: list[str], cols: Columns, m: MboColumns, event: tuple[str, str], action: str, flags: int | None) -> None:
    """Apply an add (A), modify (M) or cancel (C) to the book of ``event`` (instrument, publisher); a top-of-book
    record (F_TOB) of an add or modify sets its side's one price instead. A cancel acts on the side its order rests
    on, so its row's side is not read (Databento may write N). ValueError, the book unchanged, for a field that cannot
    be read."""
    assert cols.volume is not None
    size = _volume(row[cols.volume], cols.volume_name, cols)
    if action == "C":
        if not m.books.cancel(*event, _order_id(row, m), size):
            m.unknown_cancels += 1
        return
    text = row[m.side].strip()
    bid = _ORDER_SIDES.get(text)
    if bid is None:
        raise ValueError(f"{m.names[m.side]} {text!r} is not B (bid) or A (ask), as the side of action {action} must be")
    if flags is not None and flags & F_TOB:
        price = None if _no_price(row[cols.price], cols) else _order_price(row, cols)
        m.books.book(*event).top_of_book(bid, price)
        return
    order_id = _order_id(row, m)
    m.books.book(*event).place(order_id, bid, _order_price(row, cols), size)


def _order_id(row: list[str], m: MboColumns) -> int:
    """A Databento mbo row's order id (a whole number); ValueError naming the column otherwise."""
    text = row[m.order_id].strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{m.names[m.order_id]} {text!r} is not an order id (a whole number)") from None


def _order_price(row: list[str], cols: Columns) -> float:
    """The price of an mbo row's order (see :func:`_book_price`); ValueError naming the column for none (UNDEF_PRICE,
    empty) or a bad one."""
    text = row[cols.price]
    if not cols.fixed_point and not text.strip():
        raise ValueError(f"{cols.price_name} is empty (an order needs a price)")
    return _book_price(text, cols.price_name, cols)


def _book_price(text: str, name: str, cols: Columns) -> float:
    """A price in a Databento order book (an order's, or a best bid or ask), in quote currency, fixed point or as
    written as the file's prices are: any finite number, since a calendar spread's prices can be 0 or below (a tick
    still needs a positive mid); ValueError naming the column otherwise, UNDEF_PRICE included."""
    if cols.fixed_point:
        return _fixed_number(text, name)
    return _signed_price(text, name, cols.decimal_comma)


def _mbo_flags(row: list[str], m: MboColumns) -> int | None:
    """A Databento mbo row's flags (a bit field, 0-255); None without a flags column; ValueError naming it otherwise."""
    if m.flags is None:
        return None
    text = row[m.flags]
    try:
        flags = int(text)
    except ValueError:
        flags = -1
    if not 0 <= flags <= 255:
        raise ValueError(f"{m.names[m.flags]} {text.strip()!r} is not Databento's flags (a whole number 0-255)")
    return flags


def _price(text: str, name: str, decimal_comma: bool) -> float:
    """A price field (> 0, finite); ValueError naming the column otherwise."""
    price = _signed_price(text, name, decimal_comma)
    if not price > 0.0:
        raise ValueError(f"{name} {price} is not > 0")
    return price


def _signed_price(text: str, name: str, decimal_comma: bool) -> float:
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


def _no_price(text: str, cols: Columns) -> bool:
    """Whether a price field is empty, or Databento's UNDEF_PRICE in a file of its fixed-point prices (what its
    pretty_px files write as an empty field)."""
    s = text.strip()
    return not s or (cols.fixed_point and s == DATABENTO_UNDEF_PRICE)


def _fixed_price(text: str, name: str) -> float:
    """A Databento fixed-point price field (an integer in units of 1e-9) as a price (> 0); ValueError naming the
    column otherwise, UNDEF_PRICE included."""
    price = _fixed_number(text, name)
    if not price > 0.0:
        raise ValueError(f"{name} {price} is not > 0")
    return price


def _fixed_number(text: str, name: str) -> float:
    """A Databento fixed-point price field (an integer in units of 1e-9) as a price of any sign; ValueError naming
    the column otherwise, UNDEF_PRICE included."""
    s = text.strip()
    if s == DATABENTO_UNDEF_PRICE:
        raise ValueError(f"{name} {s} is Databento's UNDEF_PRICE (the record has no price)")
    if not _FIXED_PRICE.fullmatch(s):
        raise ValueError(f"{name} {s!r} is not a Databento fixed-point price (an integer in units of 1e-9, as the"
                         " file's first prices are)")
    return int(s) / 1e9


def _volume(text: str, name: str, cols: Columns) -> float:
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


def runs_newest_first(path: Path, cols: Columns, sample_rows: int = 10_000) -> bool:
    """True when a file's rows run newest first: of the times that change from one row of a market to its next
    row, within the first ``sample_rows`` rows, more go back than forward. A few out-of-order rows in an
    oldest-first file do not turn it (they are bad rows of the reading pass); False when nothing can be read."""
    last: dict[str, int] = {}
    back = forward = 0
    try:
        with _data_rows(path, cols) as reader:
            for _, r in zip(range(sample_rows), reader, strict=False):
                if len(r) != cols.fields:
                    continue
                try:
                    text = r[cols.time] if cols.clock is None else _with_clock(r, cols)
                    t = time_any(text, cols.time_name, cols.day_first, cols.time_unit, cols.zone)
                except ValueError:
                    continue  # a bad row: the reading pass reports it
                m = "" if cols.market is None else r[cols.market].strip()
                prev = last.get(m)
                if prev is not None:
                    back += t < prev
                    forward += t > prev
                last[m] = t
    except (OSError, csv.Error):
        return False
    return back > forward


def quotes_for_empty_prices(path: Path, header: list[str], cols: Columns, notes: list[str], sample_rows: int = 1000) -> None:
    """Price from the bid and ask columns instead of a price column left empty in the file's first ``sample_rows``
    rows (MetaTrader's tick export: ``<LAST>`` is empty for currencies), noted."""
    if cols.ask is not None:
        return
    shown = [header_name(h) for h in header]
    names = [_match_name(n) for n in shown]
    bid = next((names.index(a) for a in BID_COLUMNS if a in names), None)
    ask = next((names.index(a) for a in ASK_COLUMNS if a in names), None)
    if bid is None or ask is None:
        return
    try:
        with _data_rows(path, cols) as reader:
            rows = [r for _, r in zip(range(sample_rows), reader, strict=False) if len(r) == cols.fields]
    except (OSError, csv.Error):
        return
    if not rows or not all(_no_price(r[cols.price], cols) for r in rows):
        return
    empty = "empty or Databento's UNDEF_PRICE" if cols.fixed_point else "empty"
    notes.append(f"{path}: {cols.price_name} is {empty}; price is the mid of {shown[bid]!r} and {shown[ask]!r}"
                 f" (an {empty.replace('empty', 'empty side', 1)} keeps its previous value)")
    cols.price, cols.price_name, cols.ask, cols.ask_name = bid, shown[bid], ask, shown[ask]


def databento_book_events(path: Path, header: list[str], cols: Columns, books: OrderBooks | None = None,
                          sample_rows: int = 1000) -> str | None:
    """A note, with the price set to the mid of ``bid_px_00`` and ``ask_px_00`` and ``cols.action`` set, for a file of
    Databento's order-book events (mbp-1, mbp-10): its header names ``rtype``, ``publisher_id``, ``action``,
    ``bid_px_00`` and ``ask_px_00``, and the actions of its first ``sample_rows`` rows include a book event (A, C, M
    or R), not only trades. Each row is then read at the top of book after its event, and its ``size`` is volume only
    for a trade (T or F); a row that moves neither price and trades nothing is no tick. A market on several
    publishers has the highest bid and lowest ask over their latest rows (``cols.publisher``, ``cols.venues``). Each
    market's previous top (and its publishers') is kept in ``books`` when given (an earlier file's last row is the
    previous row of the next file's first), else in the file's own. None, nothing set, for any other file (trades,
    tbbo, bbo, OHLCV, another vendor's)."""
    shown = [header_name(h) for h in header]
    names = [_match_name(s) for s in shown]
    if not set(names) >= DATABENTO_FIELDS | {DATABENTO_ACTION, *DATABENTO_TOP}:
        return None
    action = _find_column(path, names, shown, (DATABENTO_ACTION,), "action", True)
    bid, ask = (_find_column(path, names, shown, (name,), name, True) for name in DATABENTO_TOP)
    assert action is not None and bid is not None and ask is not None
    seen: set[str] = set()
    try:
        with _data_rows(path, cols) as reader:
            for _, r in zip(range(sample_rows), reader, strict=False):
                if len(r) == cols.fields:
                    seen.add(r[action].strip())
    except (OSError, csv.Error):
        return None  # the reading pass reports it
    book = sorted(seen & DATABENTO_BOOK_ACTIONS)
    if not book:
        return None
    cols.price, cols.price_name, cols.ask, cols.ask_name = bid, shown[bid], ask, shown[ask]
    cols.ask_volume, cols.ask_volume_name = None, ""
    cols.action, cols.action_name = action, shown[action]
    cols.publisher = _find_column(path, names, shown, ("publisher_id",), "publisher_id", True)
    if books is not None:
        cols.tops, cols.venues = books.tops, books.venues
    volume = f", volume the {cols.volume_name} of trades (T, F) only" if cols.volume is not None else ""
    return (f"{path}: Databento order-book events ({shown[action]} {', '.join(book)}): price is the mid of"
            f" {shown[bid]} and {shown[ask]} after each event{volume}; a row whose book lacks a side is skipped")


def databento_mbo(path: Path, header: list[str], cols: Columns, books: OrderBooks | None = None) -> str | None:
    """A note, with ``cols.mbo`` set (price ``price``, volume ``size``), for a Databento market-by-order file: its
    header names ``rtype``, ``publisher_id``, ``action``, ``side``, ``order_id``, ``price`` and ``size``, and no
    ``bid_px_00`` (an mbp file's top of book). Its rows rebuild each instrument's book (one per ``instrument_id``,
    else per market, and per ``publisher_id``; see :mod:`.orderbook`) in ``books`` (the books the load's earlier
    files left; new, empty books when None), and a tick is the mid of the best bid and ask after each event's last
    record (``flags`` F_LAST; every row when the file has no ``flags`` column) that moves either or trades, with the
    size of the event's trades (T) as volume. None, nothing set, for any other file."""
    shown = [header_name(h) for h in header]
    names = [_match_name(s) for s in shown]
    if not set(names) >= DATABENTO_FIELDS | MBO_FIELDS or DATABENTO_TOP[0] in names:
        return None

    def index(name: str) -> int:
        i = _find_column(path, names, shown, (name,), name, True)  # DataError for a column named twice
        assert i is not None
        return i

    action, side, order_id, publisher, price, size = (
        index(n) for n in ("action", "side", "order_id", "publisher_id", "price", "size"))
    instrument, flags = (_find_column(path, names, shown, (n,), n, False) for n in ("instrument_id", "flags"))
    cols.price, cols.price_name, cols.ask, cols.ask_name = price, shown[price], None, ""
    cols.volume, cols.volume_name, cols.ask_volume, cols.ask_volume_name = size, shown[size], None, ""
    used = (action, side, order_id, publisher, instrument, flags)
    books = OrderBooks() if books is None else books
    cols.mbo = MboColumns(action, side, order_id, publisher, instrument, flags,
                          {i: shown[i] for i in used if i is not None}, books, books.resting())
    last = (f"after each event's last record ({shown[flags]} F_LAST, 128)" if flags is not None
            else "after each row (no flags column: each row is an event)")
    return (f"{path}: Databento market-by-order events (mbo): each instrument's book is rebuilt from its orders"
            f" ({shown[action]} A, C, M, R; one book per {shown[publisher]}, the best bid and ask over them); price is"
            f" the mid of the best bid and best ask {last}, volume the {shown[size]} of trades (T) only; a row whose"
            " book lacks a side is skipped")


def databento_fixed_point(path: Path, header: list[str], cols: Columns, sample_rows: int = 1000) -> str | None:
    """A note, with ``cols.fixed_point`` set, for a file written by Databento without pretty_px (its header names
    ``rtype`` and ``publisher_id``) whose first price (of the price column, or bid and ask; UNDEF_PRICE aside, within
    the first ``sample_rows`` rows) is an integer, and whose integer prices there reach ``FIXED_POINT_MIN`` (0.001 in
    units of 1e-9):
    fixed-point prices in units of 1e-9 (``4108500000000`` is 4108.5; UNDEF_PRICE, 9223372036854775807, is no
    price), and a price with a decimal point is then a bad row. None for any other file: Databento's pretty_px files
    (decimals: ``4108.500000000``), and one re-saved by a tool that writes whole prices without decimals (``4108``)."""
    if not {_match_name(header_name(h)) for h in header} >= DATABENTO_FIELDS:
        return None
    used = [i for i in (cols.price, cols.ask) if i is not None]
    prices: list[str] = []
    undefined = False
    try:
        with _data_rows(path, cols) as reader:
            for _, r in zip(range(sample_rows), reader, strict=False):
                if len(r) != cols.fields:
                    continue
                for i in used:
                    text = r[i].strip()
                    if text == DATABENTO_UNDEF_PRICE:
                        undefined = True
                    elif text:
                        prices.append(text)
    except (OSError, csv.Error):
        return None
    # by magnitude: a calendar spread's prices can all be 0 or below
    whole = [abs(int(p)) for p in prices if _FIXED_PRICE.fullmatch(p)]
    if prices and not (_FIXED_PRICE.fullmatch(prices[0]) and max(whole) >= FIXED_POINT_MIN):
        return None
    if not prices and not undefined:
        return None
    first = prices[0] if prices else DATABENTO_UNDEF_PRICE
    cols.fixed_point = True
    names = cols.price_name + (f" and {cols.ask_name}" if cols.ask is not None else "")
    if first == DATABENTO_UNDEF_PRICE:
        return (f"{path}: {names} read as Databento's fixed-point prices, integers in units of 1e-9;"
                f" {DATABENTO_UNDEF_PRICE} (UNDEF_PRICE, as the first is) is no price")
    return (f"{path}: {names} read as Databento's fixed-point prices, integers in units of 1e-9 (the first, {first},"
            f" is {int(first) / 1e9}); {DATABENTO_UNDEF_PRICE} (UNDEF_PRICE) is no price")


def _binance_row(row: list[str]) -> tuple[str, tuple[str, ...]] | None:
    """The Binance layout (``klines``, ``aggTrades`` or ``trades``) and column names that one headerless row fits
    exactly, or None: a kline's close_time is its open_time plus a whole number of seconds (ms or µs) less one, an
    aggregate trade's and a trade's last fields are True/False, a trade's quote_qty is its price times its qty."""
    def ints(*i: int) -> bool:
        return all(row[k].isascii() and row[k].isdigit() for k in i)

    def numbers(*i: int) -> bool:
        return all(is_number(row[k]) and math.isfinite(float(row[k])) for k in i)

    def flags(k: int) -> bool:
        return all(f in _BINANCE_BOOLEANS for f in row[k:])

    n = len(row)
    if n == 12 and ints(0, 6, 8) and numbers(1, 2, 3, 4, 5, 7, 9, 10):
        second = 1000 if int(row[0]) < 10**14 else 10**6  # ms before 2025, µs in spot files from 2025-01-01
        span = int(row[6]) + 1 - int(row[0])
        return ("klines", BINANCE_KLINES) if span > 0 and span % second == 0 else None
    if n in (7, 8) and ints(0, 3, 4, 5) and numbers(1, 2) and flags(6) and int(row[3]) <= int(row[4]):
        return "aggTrades", BINANCE_AGG_TRADES[:n]
    if n in (6, 7) and ints(0, 4) and numbers(1, 2, 3) and flags(5):
        price, qty, quote = float(row[1]), float(row[2]), float(row[3])
        return ("trades", BINANCE_TRADES[:n]) if math.isclose(quote, price * qty, rel_tol=1e-6, abs_tol=1e-6) else None
    return None


def binance_layout(path: Path, first: list[str], delimiter: str = ",", skip: int = 0) -> tuple[str, tuple[str, ...]] | None:
    """The layout and column names of a headerless file from data.binance.vision (klines, aggTrades or trades) whose
    first line ``first`` (after ``skip`` lines) and every row up to ``BINANCE_SAMPLE`` fit that layout exactly (see
    :func:`_binance_row`), ids or open times increasing; None for any other file."""
    layout = _binance_row(first)
    if layout is None:
        return None
    prev = int(first[0])
    try:
        with open_tick_text(path) as fh:
            reader = csv.reader(fh, delimiter=delimiter)
            for _ in range(skip + 1):
                next(reader, None)
            for _, row in zip(range(BINANCE_SAMPLE - 1), reader, strict=False):
                if not row:
                    continue
                if _binance_row(row) != layout or int(row[0]) <= prev:
                    return None
                prev = int(row[0])
    except (OSError, csv.Error):
        return None
    return layout


def binance_symbol(path: Path) -> str:
    """The market of a file named as data.binance.vision names them: its name without the date
    (``BTCUSDT-1m-2024-01-01.csv`` is ``BTCUSDT-1m``, ``BTCUSDT-aggTrades-2024-01.csv`` ``BTCUSDT-aggTrades``), so
    that a symbol's daily or monthly files of one kind are one market, and its klines and trades are not; "" for
    another name."""
    m = _BINANCE_NAME.fullmatch(file_stem(path))
    return m[1] if m else ""


def time_unit_of(path: Path, cols: Columns) -> str | None:
    """Sets ``cols.iso`` and ``cols.time_unit`` from the file's first time: dates (ISO 8601 or another accepted
    form) or numbers, in the unit of ``TIME_UNITS`` whose span holds it, ms otherwise. A note for a unit other
    than ms, None otherwise."""
    try:
        with _data_rows(path, cols) as reader:
            # the first times that can be times at all: a placeholder ("nan", "N/A", "null", "-") is a bad row of
            # the reading pass and must not decide the unit (a file of seconds read as ms after a first "nan")
            # a zero (pandas' fillna(0), a spreadsheet's empty cell) is a placeholder too: as ms it would make the
            # YYYYMMDD dates, date-times or seconds after it ms of January 1970
            firsts: list[str] = []
            first: str | None = None
            for r in reader:
                if len(r) != cols.fields or not _can_be_time(r[cols.time]):
                    continue
                v = r[cols.time].strip()
                if len(firsts) < 3:
                    firsts.append(v)
                if first is None and not _is_zero(v):
                    first = v
                if first is not None and len(firsts) == 3:
                    break
    except (OSError, csv.Error):
        return None  # the reading pass reports it
    if not firsts:
        return None
    # ASCII digits only: "²".isdigit() is True but int() refuses it. A RangeIndex of a sliced frame starts anywhere
    # (df.iloc[5:]); consecutive integers below 1970-01-02 in ms are no times
    counts_rows = all(v.isascii() and v.isdigit() for v in firsts) and [int(v) for v in firsts] == list(
        range(int(firsts[0]), int(firsts[0]) + len(firsts))) and int(firsts[0]) < SECONDS_HINT_MS
    if cols.time == 0 and cols.time_name.strip().lower() in ("", "unnamed: 0") and counts_rows:
        msg = (f"{path}:1: the unnamed first column counts the rows ({', '.join(firsts)}, …: a pandas RangeIndex), it"
               " holds no times and there is no time column; save the file with its times (a column named e.g."
               " 'date' or 'timestamp', or the dates as the index)")
        raise DataError(msg, [msg])
    if first is None:  # every time is 0: read as ms (bad or noted rows of the reading pass)
        first = firsts[0]
    cols.iso = cols.clock is not None or not is_number(first)
    if cols.iso:
        return None
    if yyyymmdd(first) is not None:  # 20080102: a date, not ms on 1970-01-01
        cols.iso, cols.time_unit = True, "date"
        return f"{path}: {cols.time_name} read as dates written YYYYMMDD (the first, {first})"
    stamp = yyyymmddhhmm(first)
    if stamp is not None:  # 202401020930: a date and time of day, not ms in 1976 (or a time after 2100)
        cols.iso, cols.time_unit = True, "datetime"
        when = datetime.fromtimestamp(stamp / 1000, UTC)
        return (f"{path}: {cols.time_name} read as date-times written YYYYMMDDHHMM[SS] (the first, {first}, is"
                f" {when:%Y-%m-%d %H:%M:%S} {zone_name(cols.zone)})")
    hour = yyyymmddhh(first)
    if hour is not None and _date_hours_not_seconds(path, cols, first):  # 2024010209: 2024-01-02 09:00, not 2034
        cols.iso, cols.time_unit = True, "datehour"
        when = datetime.fromtimestamp(hour / 1000, UTC)
        return (f"{path}: {cols.time_name} read as date-hours written YYYYMMDDHH (the first, {first}, is"
                f" {when:%Y-%m-%d %H:%M} {zone_name(cols.zone)}; as seconds since the epoch it would be a time still to come)")
    x = float(first)
    cols.time_unit = next((unit for unit, (low, high) in TIME_UNITS.items() if low <= x < high), "ms")
    if cols.time_unit != "ms" or x >= PLAUSIBLE_MS:
        cols.time_floor = PLAUSIBLE_MS
    if cols.time_unit == "ms":
        return None
    when = datetime.fromtimestamp(unit_time(first, cols.time_name, cols.time_unit) // 1000, UTC)
    return (f"{path}: {cols.time_name} read as {UNIT_WORDS[cols.time_unit]} since the epoch (the first, {first}, is"
            f" {when:%Y-%m-%d %H:%M:%S} UTC)")


def _now_ms() -> int:
    """The time now, ms since the epoch (a function, for tests)."""
    return int(datetime.now(UTC).timestamp() * 1000)


def _date_hours_not_seconds(path: Path, cols: Columns, first: str) -> bool:
    """Whether a file whose first time is ten digits forming a date and an hour (``2024010209``) holds date-hours
    written ``YYYYMMDDHH`` rather than seconds since the epoch: the first time read as seconds lies after now (no
    market file holds ticks still to come; every date-hour of 1970 on is 2032-06-04 or later as seconds), and every
    time of the first ``DATE_HOUR_SAMPLE`` rows (placeholders and zeros aside) is a date-hour. Genuine seconds
    (``1704186000``, 2024-01-02 09:00) are no date-hour (year 1704) and stay seconds."""
    if int(Decimal(first)) * 1000 <= _now_ms():
        return False
    try:
        with _data_rows(path, cols) as reader:
            for n, r in enumerate(reader):
                if n >= DATE_HOUR_SAMPLE:
                    break
                if len(r) != cols.fields or not _can_be_time(r[cols.time]) or _is_zero(r[cols.time]):
                    continue
                if yyyymmddhh(r[cols.time].strip()) is None:
                    return False
    except (OSError, csv.Error):
        return False
    return True


def _is_zero(text: str) -> bool:
    """Whether a time field is a number equal to 0 (``0``, ``0.0``, ``00000000``)."""
    try:
        return float(text) == 0.0
    except ValueError:
        return False


def _can_be_time(text: str) -> bool:
    """Whether a time field could hold a time: it has a digit, and is not a non-finite number (``nan``, ``inf``)."""
    s = text.strip()
    if not any(ch.isdigit() for ch in s):
        return False
    try:
        return math.isfinite(float(s))
    except ValueError:
        return True


def file_format(path: Path, header: list[str], delimiter: str, notes: list[str], skipped: int = 0,
                zone: tzinfo = UTC, books: OrderBooks | None = None) -> Columns:
    """How the file at ``path`` is written: the columns used, its header lines, date and number formats and row
    order, from its header line (split at ``delimiter``, see :func:`delimiter_of`) and, where that cannot tell,
    from the file itself; a note in ``notes`` for each thing inferred. DataError for a header, or a date column,
    that cannot be read. The header is the line after ``skipped`` lines (see :func:`leading_lines`); the rows
    start after ``header_rows`` lines (``skipped`` for a headerless Binance file, see :func:`binance_layout`). Times
    without an offset are read in ``zone``. ``books``, shared by the files of one load, carries a Databento order
    book's state from one file to the next (see :func:`databento_book_events`, :func:`databento_mbo`)."""
    levels = yfinance_header(path, header, delimiter, skipped)
    ticker, lines, ticker_from = "", 1, "the header's Ticker row"
    binance = None
    if levels is not None:
        first_name, ticker, lines = levels
        header = [first_name, *header[1:]]
    else:
        binance = binance_layout(path, header, delimiter, skipped)
        if binance is not None:  # no header line: the first line is the first row
            header, lines = list(binance[1]), 0
            notes.append(f"{path}: no header line; read as Binance's {binance[0]} file ({','.join(binance[1])})")
        names = tuple(_match_name(header_name(h)) for h in header)
        if binance is not None or names in (BINANCE_KLINES, BINANCE_AGG_TRADES[:7], BINANCE_TRADES[:6]):
            ticker, ticker_from = binance_symbol(path), "the Binance file name without its date"
    cols = columns_of(path, header, notes, ticker, ticker_from)
    cols.zone = zone
    cols.header_rows = skipped + lines
    if skipped:
        notes.append(f"{path}: {skipped} line{'s' if skipped > 1 else ''} before the header skipped")
    cols.delimiter = delimiter
    book_note = databento_book_events(path, header, cols, books) or databento_mbo(path, header, cols, books)
    if book_note:
        notes.append(book_note)
    fixed_note = databento_fixed_point(path, header, cols)
    if fixed_note:
        notes.append(fixed_note)
    quotes_for_empty_prices(path, header, cols, notes)
    cols.decimal_comma = delimiter == ";" and has_decimal_commas(path, cols)
    cols.clock = clock_column(path, header, cols)
    if cols.clock is not None:
        cols.clock_name = header_name(header[cols.clock])
        notes.append(f"{path}: time from the {cols.time_name} and {cols.clock_name} columns")
    else:
        hour_note = hour_column(path, header, cols)
        if hour_note:
            notes.append(hour_note)
    if delimiter != ",":
        named = {";": "';'", "\t": "tabs", "|": "'|'"}[delimiter]
        notes.append(f"{path}: fields separated by {named}" + ("; decimal commas read, '.' between digit groups"
                                                              if cols.decimal_comma else ""))
    cols.day_first = slash_order(path, cols)
    if cols.day_first is not None:
        notes.append(f"{path}: {cols.time_name}: dates read as {'day/month/year' if cols.day_first else 'month/day/year'}")
    unit_note = time_unit_of(path, cols)
    if unit_note:
        notes.append(unit_note)
    cols.newest_first = runs_newest_first(path, cols)
    return cols
