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
  file's zone, :attr:`~.csvcolumns.Columns.zone`: UTC unless ``training.data_timezone`` or ``--timezone`` names another),
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
  ``adj_close``, ``adj. close``, ``adjclose``, ``adjusted_close``, ``adjusted close`` (so ``close`` is used, not
  ``adj close``, when a file has both, unless the file has a split ratio column: then its close is not adjusted
  for splits and the adjusted close is used); without
  any, the mid of a bid and an ask column (``BID_COLUMNS``, ``ASK_COLUMNS``). In a Databento file written
  without pretty_px, prices are integers in units of 1e-9, scaled (:func:`~.databento.databento_fixed_point`). A Databento
  order book (mbp-1, mbp-10: book events, actions A, C, M, R, beside trades) is read at the mid of ``bid_px_00``
  and ``ask_px_00``, the top of book after each event (over a market's publishers, the highest bid and lowest ask
  of their latest rows), whatever its ``price``; a row whose book lacks a side is skipped, counted in
  ``Columns.skipped`` (:func:`~.databento.databento_book_events`). A Databento market-by-order file (mbo: order events keyed
  by ``order_id``, no top of book) has each instrument's book rebuilt from its events (:mod:`.orderbook`) and is
  read at the mid of its best bid and best ask after each event's last record (flags F_LAST); its other records,
  and events that leave the book without a side, are skipped (:func:`~.databento.databento_mbo`). In both, a book event is a
  tick only when it moves the best bid or ask price or trades, a book price may be any finite number (a calendar
  spread's can be 0 or below) and an event whose mid is not above 0 is skipped (:func:`~.databento._book_skip`); the files of one
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
``Ticker,…`` and ``Date,,…``, or the first two swapped), or another table of pandas' two-level columns with one
symbol above its fields (``Symbol,JFC,…``, ``,open,…``, ``dt,,…``), is read with its first column as the time and
the symbol as the market. A pandas index written without a name (an empty first
header name) is the time column. A file without a header line is read only when it is one of
Binance's (klines, aggTrades, trades), TrueFX's quotes, MetaTrader 4's history export, NinjaTrader's (HistData's)
bars or ticks, or HistData's ticks (:mod:`.csvheaderless`).

:func:`file_format` works out how a file is written from its header line and, where the
header cannot tell, from the file itself (each probe, :func:`yfinance_header`,
:func:`clock_column`, :func:`has_decimal_commas`, :func:`slash_order`,
:func:`runs_newest_first`, reads what it needs); :mod:`cerebellar_norse.training.data`
reads the rows (:func:`parse_row`). A time field is read by :mod:`.csvtime`, a price or volume written with digit
groups, a currency or a suffix by :mod:`.csvnumbers`, a Databento file's book events and fixed-point prices by
:mod:`.databento`; the column roles (:class:`~.csvcolumns.Columns`) are :mod:`.csvcolumns`'s. Every pass opens the file with
:func:`~cerebellar_norse.training.compressed.open_tick_text`, so a gzip, bzip2, xz or one-file zip file reads as its
plain text.
"""

from __future__ import annotations

import csv
import itertools
import math
import re
from datetime import UTC, datetime, tzinfo
from decimal import Decimal
from pathlib import Path
from typing import TextIO
from zoneinfo import ZoneInfo

from ..errors import DataError
from ..ticks import MARKET_ID_MAX, TS_MAX_MS
from ..timezones import zone_name
from .compressed import open_tick_text, without_compressed_suffix
from .csvcolumns import Columns, data_rows, find_column, header_name, match_name, mid_price, read_volume, signed_price
from .csvheaderless import (
    BINANCE_AGG_TRADES,
    BINANCE_KLINES,
    BINANCE_TRADES,
    DAY_MS,
    HISTDATA_TICKS,
    LEAN_BARS,
    METATRADER4_BARS,
    TRUEFX_QUOTES,
    LeanDay,
    binance_layout,
    histdata_ticks_layout,
    kraken_layout,
    lean_bars_layout,
    lean_intraday_layout,
    metatrader4_layout,
    ninjatrader_layout,
    truefx_layout,
)
from .csvnumbers import is_number
from .csvtime import (
    BEFORE_1970,
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
from .databento import (
    book_tick,
    databento_book_events,
    databento_fixed_point,
    databento_mbo,
    fixed_price,
    mbo_tick,
    no_price,
)
from .orderbook import OrderBooks

# Header names per column, in order of preference (compared in lower case).
TIME_COLUMNS = ("timestamp", "unix", "time", "date", "datetime", "date_time", "date time", "gmt time", "utc time", "local time",
                "open time", "open_time", "time (utc)", "timestamp (utc)", "date (utc)", "datetime (utc)",
                "timestamp_utc", "time_utc", "datetime_utc", "date_utc",  # the same written as one word (CME bars)
                "transact_time", "window_start", "datum",  # Dukascopy exports, Binance trades, Polygon flat files
                # Databento (ts_recv, by which its files are sorted, before ts_event), Polygon's trades and quotes
                # (sip_timestamp, by which they are sorted, before participant_timestamp), CoinAPI, Futu's time_key,
                # fastquant's dt, zipline's day, exchange APIs
                "ts_recv", "ts_event", "sip_timestamp", "participant_timestamp", "time_exchange", "time_key", "dt",
                "day", "ts", "t", "observation_date")  # FRED's series
# close/last: Nasdaq.com; the adjusted closes: Yahoo (adj close), Quandl WIKI (adj. close, adj_close), Tiingo
# (adjclose), Alpha Vantage and EODHD (adjusted_close)
ADJUSTED_PRICE_COLUMNS = ("adj close", "adj_close", "adj. close", "adjclose", "adjusted_close", "adjusted close")
PRICE_COLUMNS = ("price", "close", "last", "mid", "close/last", *ADJUSTED_PRICE_COLUMNS)
# An adjusted close so named is written beside a close NOT adjusted for splits (EODHD's Adjusted_close, Alpha
# Vantage's adjusted_close): the file is read at it, as beside a split ratio column (below)
RAW_BESIDE_COLUMNS = ("adjusted_close", "adjusted close")
# A column of split ratios, as vendors write beside prices NOT adjusted for splits (Quandl WIKI's Split Ratio and
# split_ratio, Tiingo's splitFactor, Alpha Vantage's split_coefficient): such a file's close falls by the ratio at
# a split (a 2:1 split reads as -50 %), so its adjusted close is the price.
# A volume adjusted for splits, as vendors write beside their adjusted close (Quandl WIKI's Adj. Volume and adj_volume,
# Tiingo's adjVolume): read with that close, as the volume as traded jumps by the split's ratio where the price does not
ADJUSTED_VOLUME_COLUMNS = ("adj. volume", "adj_volume", "adjvolume", "adj volume", "adjusted_volume", "adjusted volume")
SPLIT_COLUMNS = ("split ratio", "split_ratio", "splitfactor", "split_factor", "split factor", "split_coefficient",
                 "split coefficient")
# Quotes without a price column: the price is the mid of bid and ask, the volume the sum of both sides' volumes.
# (bid_px_00 and ask_px_00: Databento's top of book, mbp-1, tbbo, bbo)
BID_COLUMNS = ("bid", "bid price", "bid_price", "bidprice", "best bid", "best_bid", "bid_px_00")
ASK_COLUMNS = ("ask", "ask price", "ask_price", "askprice", "offer", "offer price", "best ask", "best_ask", "ask_px_00")
BID_VOLUME_COLUMNS = ("bidvolume", "bid volume", "bid_volume", "bid size", "bid_size", "bidsize", "bid vol", "bid_vol",
                      "bid_sz_00", "bid_amount")  # bid_amount: Tardis' quotes
ASK_VOLUME_COLUMNS = ("askvolume", "ask volume", "ask_volume", "ask size", "ask_size", "asksize", "ask vol", "ask_vol",
                      "offer size", "offer_size", "ask_sz_00", "ask_amount")
# MetaTrader: <TICKVOL> over <VOL>; quantity: Binance's aggTrades
VOLUME_COLUMNS = ("volume", "tickvol", "tick_volume", "vol", "vol.", "size", "qty", "quantity")
VOLUME_PREFIX = "volume"  # without any of VOLUME_COLUMNS, the first column named so (Volume BTC, Volume_(BTC))
# without any of those either: the quantity traded as Tardis' and ccxt's trades name it (a turnover in some files,
# beside which they write a volume column, read first)
AMOUNT_VOLUME = "amount"
# instrument_id: Databento's numeric instrument, in a file saved without its symbol column (map_symbols off)
MARKET_COLUMNS = ("market_id", "market", "symbol", "sym", "ticker", "instrument", "pair", "instrument_id")
# BTCUSDT-1m-2024-01-01, BTCUSDT-trades-2024-01: symbol and interval or kind, then the date
_BINANCE_NAME = re.compile(r"([A-Z0-9]{2,32}-[A-Za-z0-9]{1,16})-\d{4}-\d{2}(?:-\d{2})?")
DATE_HOUR_SAMPLE = 10_000  # rows whose times must all be YYYYMMDDHH date-hours for a file to be read as such
PLAUSIBLE_MS = 100_000_000_000  # 1973-03-03: in a file whose first time is later, an earlier one is of another unit
FRED_MISSING = "the price is '.', as FRED marks a day without a value (a holiday)"  # why such rows are skipped
LEAN_SUSPICIOUS = "marked suspicious (1 in its last field), as Lean marks ticks its algorithms skip"
LEAN_ONE_SIDE = "a quote before both sides of its market were quoted (Lean writes the side not quoted as 0 or empty)"
# why a row whose every field but its time (and market) is NaN, NA or empty is skipped
NO_VALUES = ("every field but the time is NaN, NA or empty, as a bar without trades is written (Kaggle's Bitstamp"
             " minutes) and R writes a missing value")
_FOUR_DIGIT_YEAR = re.compile(r"(?<!\d)1\d{3}(?!\d)")  # a year before 2000 written in full (1969, 1871)
BEFORE_EPOCH = ("dated before 1970-01-01, the earliest time read (a history that starts earlier is read from 1970 on;"
                " a time in ms or seconds before it is a bad row)")
_NO_VALUE = frozenset(("nan", "", "na"))  # pandas' NaN and empty field, R's NA (write.csv, write.zoo)
WIDE_NAMES_SHOWN = 8  # series of a table of several series named in its note
# words of header names that say a column holds no price (see _no_price_name)
_NO_PRICE_WORDS = ("amount", "count", "trades", "transactions", "interest", "openint", "turnover", "notional", "qty",
                   "quantity", "size", "spread", "shares", "_id", " id", "weight", "ratio")
TITLE_LINES_MAX = 5  # lines without a separator skipped before the header (a download site's name or URL)
DELIMITERS = (",", ";", "\t", "|")  # field separators a file may use; a comma unless its header has none
# (then single blanks where its first lines split so, see blank_separated: R's write.table and write.zoo)
# a time of day in a column of its own: 9:30, 09:30:00.250, or digits only (stooq's 153500, 0930)
_CLOCK = re.compile(r"\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?$|\d{6}$|\d{4}$")
_INF = math.inf


def not_utf8(fields: list[str]) -> str:
    """``"not UTF-8 text (byte 0x..)"`` when a field holds a byte that did not decode, else ``""``."""
    for text in fields:
        for ch in text:
            if "\udc80" <= ch <= "\udcff":
                return f"not UTF-8 text (byte 0x{ord(ch) - 0xDC00:02x})"
    return ""


def slash_order(path: Path, cols: Columns, notes: list[str] | None = None, given: bool | None = None) -> bool | None:
    """Whether a file's dates written with slashes or dots are day first (True) or month first (False), decided
    over its whole time column; None when its first time is not such a date. Where no day is above 12, the order in
    which its successive dates are days apart, not months (see :func:`_order_by_gaps`), noted in ``notes``; else
    dates with dots are day first (as dates with dots are written); DataError when dates with slashes do not tell,
    or the column mixes both orders. ``given`` (``training.date_order``, ``--date-order``) is the order instead,
    DataError where a date of the column cannot be read so (a month above 12)."""
    day_first = month_first = False
    example = {True: "", False: ""}
    dates: list[tuple[int, int, int]] = []  # the column's successive distinct dates (first two fields, year)
    try:
        with data_rows(path, cols) as reader:
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
                date = (int(m[1]), int(m[3]), int(m[4]))
                if len(dates) < _GAP_DATES and (not dates or dates[-1] != date):
                    dates.append(date)
                if int(m[1]) > 12 and not day_first:
                    day_first, example[True] = True, text
                if int(m[3]) > 12 and not month_first:
                    month_first, example[False] = True, text
            if not seen:
                return None
    except (OSError, csv.Error):
        return None  # the reading pass reports it
    name = cols.time_name
    if given is not None:
        shown = month_first if given else day_first  # a date that only the other order reads
        if shown:
            order, other = ("day/month", "month/day") if given else ("month/day", "day/month")
            msg = (f"{path}: {name} date {example[not given]!r} cannot be read as {order} (training.date_order or"
                   f" --date-order says so): it is {other}; read the file with the other order, or without one")
            raise DataError(msg, [msg])
        return given
    if day_first and month_first:
        msg = (f"{path}: {name} mixes day-first ({example[True]!r}) and month-first ({example[False]!r}) dates;"
               " write them as ISO 8601 (YYYY-MM-DD)")
        raise DataError(msg, [msg])
    if not (day_first or month_first):
        by_gaps = _order_by_gaps(dates)
        if by_gaps is not None:
            if notes is not None:
                other = "month/day" if by_gaps else "day/month"
                notes.append(f"{path}: {name}: no day above 12, but read as {other} its successive dates would be"
                             f" a month or more apart ({first!r} and the next), read the other way days apart")
            return by_gaps
        if dots:
            return True  # dates with dots are written day first (Dukascopy's 02.01.2020)
        msg = (f"{path}: {name} dates such as {first!r} could be month/day or day/month (no day above 12 in the file);"
               " say which with training.date_order (or --date-order day-first|month-first), or write them as"
               " ISO 8601 (YYYY-MM-DD)")
        raise DataError(msg, [msg])
    return day_first


_GAP_DATES = 2000  # successive distinct dates of a file kept to tell the order of its slash dates by their gaps
_DAILY_GAP_DAYS = 4  # successive trading days are at most this far apart (a long weekend)


def _order_by_gaps(dates: list[tuple[int, int, int]]) -> bool | None:
    """Day first (True) or month first (False) for a column's successive distinct slash dates (first field, second
    field, year) where no day is above 12: the one order in which every two successive dates are at most
    ``_DAILY_GAP_DAYS`` apart, as days of bars and ticks are, while in the other some two are further apart (read
    the wrong way round, dates a day apart are a month apart: ``11/5/2019``, ``11/6/2019``). None when fewer than three
    dates, or both orders or neither do."""
    if len(dates) < 3:
        return None

    def daily(day_first: bool) -> bool:
        try:
            days = [datetime(y, b, a) if day_first else datetime(y, a, b) for a, b, y in dates]
        except ValueError:
            return False
        return all(abs((later - earlier).days) <= _DAILY_GAP_DAYS for earlier, later in itertools.pairwise(days))

    fits = [order for order in (True, False) if daily(order)]
    return fits[0] if len(fits) == 1 else None


# names of a first column that holds a table's index: none (pandas' to_csv, R's write.csv row names), pandas'
# Unnamed: 0 (a file read and written again), and Index, as R's write.zoo writes a zoo or xts series' dates
INDEX_NAMES = ("", "unnamed: 0", "index")


def _unnamed_index(names: list[str]) -> bool:
    """True when the first header name is one of ``INDEX_NAMES`` (an index written by pandas' ``to_csv`` or R's
    ``write.csv`` or ``write.zoo``)."""
    return bool(names) and names[0] in INDEX_NAMES


def symbol_prefixed(header: list[str]) -> tuple[list[str], str] | None:
    """The header without the symbol before each field name, and that symbol, for a header whose columns after the
    first are all ``SYMBOL.Field`` of one symbol and name no price as written while their fields do: R's quantmod
    writes its series so (``write.zoo(getSymbols("MSFT", auto.assign = FALSE))``: ``Index,MSFT.Open,MSFT.High,
    MSFT.Low,MSFT.Close,MSFT.Volume,MSFT.Adjusted``); None for any other header."""
    if len(header) < 3:
        return None
    shown = [header_name(h) for h in header]
    if any(match_name(h) in PRICE_COLUMNS for h in shown):
        return None
    parts = [h.rpartition(".") for h in shown[1:]]
    symbols = {symbol for symbol, dot, field in parts if dot and symbol.strip() and field.strip()}
    if len(symbols) != 1 or any(not dot for _, dot, _ in parts):
        return None
    fields = [field.strip() for _, _, field in parts]
    if not any(match_name(f) in PRICE_COLUMNS for f in fields):
        return None
    return [shown[0], *fields], symbols.pop().strip()


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
    if len(lines) > 1 and blank_separated(lines[0], lines[1]):
        return 0, " "
    return 0, delimiter_of(lines[0] if lines else "")


def blank_separated(header: str, row: str) -> bool:
    """Whether a file whose first lines have none of ``DELIMITERS`` separates its fields by single blanks, as R's
    ``write.table`` and ``write.zoo`` write them by default (``"Open" "High" "Low" "Close"``, then ``"2007-01-02"
    50.04 50.12 …``): its header splits into at least two fields, none empty (no runs of blanks, no fixed-width
    table), and its first row into as many or one more (R's row names have no name in the header), or two more
    (unquoted date-times split at their blank: refused by :func:`blank_split_times`, which names them)."""
    names, fields = _blank_fields(header), _blank_fields(row)
    return len(names) >= 2 and all(n.strip() for n in names) and len(names) <= len(fields) <= len(names) + 2 and all(
        f.strip() for f in fields)


_SPLIT_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_SPLIT_CLOCK = re.compile(r"\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?")


def blank_split_times(path: Path, skip: int) -> None:
    """DataError for a file separated by single blanks (see :func:`blank_separated`) whose first row holds a date
    and a time of day as two fields (``"1" 2020-01-02 09:30:00 99.37``): R's ``write.table`` writes the date-times
    of a POSIXct column without quotes, so their blank separates date from time as it separates the fields."""
    rows = rows_after_header(path, " ", skip, 1)
    row = rows[0] if rows else []
    for date, clock in itertools.pairwise(f.strip() for f in row):
        if _SPLIT_DATE.fullmatch(date) and _SPLIT_CLOCK.fullmatch(clock):
            msg = (f"{path}:{skip + 2}: fields are separated by single blanks and the date-time '{date} {clock}' is"
                   " written without quotes, so its blank splits the date from the time (R's write.table writes a"
                   " POSIXct column so): save it with write.csv(x), or write.table(x, sep = \",\")")
            raise DataError(msg, [msg])


def _blank_fields(line: str) -> list[str]:
    """``line`` split at single blanks as ``csv`` reads it (a quoted field keeps its blanks); [] when it cannot."""
    try:
        return next(csv.reader([line.rstrip("\r\n")], delimiter=" "), [])
    except csv.Error:
        return []


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
    names = [match_name(header_name(h)) for h in header]
    if names[cols.time] != "time" or "date" not in names:
        return None
    try:
        with data_rows(path, cols) as reader:
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
    names = [match_name(header_name(h)) for h in header]
    where = next(((i, HOUR_COLUMNS[n]) for i, n in enumerate(names) if n in HOUR_COLUMNS and i != cols.time), None)
    if where is None:
        return None
    clock, ending = where
    name, date_name = header_name(header[clock]), cols.time_name
    seen = {0: False, 24: False}
    first = ""
    try:
        with data_rows(path, cols) as reader:
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
        with data_rows(path, cols) as reader:
            return any(len(r) == cols.fields and any("," in r[i] for i in used) for r in reader)
    except (OSError, csv.Error):
        return False


YF_ROW_NUMBER = "(row number)"  # the first column of yfinance's download after reset_index(): no price


ROW_NAMES_SAMPLE = 20  # rows that must all have one field more than the header for it to lack the row names' name


def rows_after_header(path: Path, delimiter: str, skip: int, count: int) -> list[list[str]] | None:
    """Up to ``count`` rows of a tick file after its header (the line after ``skip`` lines), as ``csv`` reads them
    (empty rows included); None when the file cannot be read."""
    try:
        with open_tick_text(path) as fh:
            reader = csv.reader(fh, delimiter=delimiter)
            for _ in range(skip + 1):
                next(reader, None)
            return [row for _, row in zip(range(count), reader, strict=False)]
    except (OSError, csv.Error):
        return None


def row_names_header(path: Path, header: list[str], delimiter: str = ",", skip: int = 0) -> list[str] | None:
    """The header with an unnamed first column before its names, for a file whose header names no time column and
    whose first ``ROW_NAMES_SAMPLE`` rows each have one field more than it: R's ``write.table`` (``row.names = TRUE``,
    its default) writes the row names, a series' dates, in a first column that its header does not name
    (``"Open","High",…`` then ``"2000-09-27",63.4375,…``). Likewise for a header that names a time column when the
    extra first fields count the rows (``"Date" "Close"`` then ``"1" 1985-01-02 3.08``: a data frame's row numbers,
    rising whole numbers); a row whose extra field is anywhere else (a name missing from the header) is no such
    file. None for any other file (the header is the line after ``skip`` lines)."""
    if not header:
        return None
    read = rows_after_header(path, delimiter, skip, ROW_NAMES_SAMPLE)
    rows = [row for row in read or [] if row]
    if not rows or any(len(row) != len(header) + 1 for row in rows):
        return None
    if any(match_name(header_name(h)) in TIME_COLUMNS for h in header):
        numbers = [row[0].strip() for row in rows]
        if not all(n.isdigit() for n in numbers) or any(int(b) <= int(a) for a, b in itertools.pairwise(numbers)):
            return None
    return ["", *header]


def yfinance_header(path: Path, header: list[str], delimiter: str = ",",
                    skip: int = 0) -> tuple[list[str], str, int] | None:
    """The column names, the ticker and the header lines of a file whose columns pandas wrote in two levels, a field
    and a symbol: by ``yf.download(...).to_csv()`` (header lines ``Price,Close,…``, ``Ticker,AAPL,…`` and
    ``Date,,…``: the first column is the time; with ``group_by="ticker"`` the first two lines swapped), by
    ``yf.download(...).reset_index().to_csv()`` (``Price,Date,Close,…`` and ``Ticker,,AAPL,…``: the first column
    counts the rows, and is no price: ``YF_ROW_NUMBER``), or by any table with symbols above its fields
    (fastquant's ``Symbol,JFC,…``, ``,open,…``, ``dt,,…``); the ticker "" when it is not a valid market id. None for
    any other file (the header is the line after ``skip`` lines). DataError for a table of several symbols (each
    column named once per symbol)."""
    if not header:
        return None
    read = rows_after_header(path, delimiter, skip, 2)
    if read is None:
        return None
    second, third = [*read, None, None][:2]
    if second is None or len(second) != len(header):
        return None
    tops = header_name(header[0]).lower(), header_name(second[0]).lower()
    if tops == ("price", "ticker"):
        fields, symbols, line = header, second, 2
    elif tops in (("ticker", "price"), ("symbol", ""), ("ticker", "")):
        fields, symbols, line = second, header, 1
    else:
        return None
    if (third is not None and len(third) == len(header) and not any(c.strip() for c in third[1:])
            and header_name(third[0]).lower() in TIME_COLUMNS):
        first, lines = header_name(third[0]), 3
    elif fields is header and any(not second[i].strip() and header_name(h).lower() in TIME_COLUMNS
                                  for i, h in enumerate(header) if i):
        first, lines = YF_ROW_NUMBER, 2  # reset_index(): the date is a column of its own, without a ticker
    else:
        return None
    tickers = {t.strip() for t, f in zip(symbols[1:], fields[1:], strict=True) if t.strip() and f.strip()}
    if len(tickers) > 1:
        what = "download" if tops[0] in ("price", "ticker") else "table"
        msg = (f"{path}:{line}: a {what} of {len(tickers)} tickers ({', '.join(sorted(tickers)[:5])}); save one ticker"
               " per file" + (" (yf.download(ticker).to_csv(...))" if what == "download" else
                              ", or one row per tick with a symbol column (df.stack(level=0).reset_index())"))
        raise DataError(msg, [msg])
    (ticker,) = tickers or {""}
    valid = 1 <= len(ticker) <= MARKET_ID_MAX and all(" " <= ch <= "~" for ch in ticker)
    return [first, *fields[1:]], ticker if valid else "", lines


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
               ticker_from: str = "the header's Ticker row", series: int | None = None) -> Columns:
    """The columns of a file from its header line; notes for the optional columns it lacks. ``ticker`` is the
    market of a file without a market column when its header (yfinance's Ticker row) or name (``ticker_from``) says
    it. In a table of several series as columns (:func:`series_columns`) the price is column ``series`` (the first
    series when None), its market named by its header."""
    shown = [header_name(h) for h in header]
    names = [match_name(s) for s in shown]
    t = find_column(path, names, shown, TIME_COLUMNS, "time", not _unnamed_index(names))
    if t is None:  # pandas' to_csv writes a date index as an unnamed first column
        t = 0
        what = "unnamed first column" if names[0] != "index" else f"first column {shown[0]!r}"
        notes.append(f"{path}: {what} used as the time (an index, as pandas' to_csv and R's write.csv and write.zoo"
                     " write it)")
    p = find_column(path, names, shown, PRICE_COLUMNS, "price", False)
    adjusted_v = None  # the volume adjusted for splits, read beside a close adjusted for them
    split = find_column(path, names, shown, SPLIT_COLUMNS, "split ratio", False)
    raw = find_column(path, names, shown, RAW_BESIDE_COLUMNS, "adjusted price", False)
    if p is not None and raw is not None and split is None and names[p] not in ADJUSTED_PRICE_COLUMNS:
        notes.append(f"{path}: price from {shown[raw]!r}, not {shown[p]!r}: beside {shown[raw]!r} (EODHD's and Alpha"
                     f" Vantage's name) {shown[p]!r} is not adjusted for splits, so a split would read as a fall of its"
                     f" ratio (2:1 as -50 %)")
        p = raw
    elif p is not None and split is not None and names[p] not in ADJUSTED_PRICE_COLUMNS:
        adjusted = find_column(path, names, shown, ADJUSTED_PRICE_COLUMNS, "adjusted price", False)
        if adjusted is not None:
            notes.append(f"{path}: price from {shown[adjusted]!r}, not {shown[p]!r}: a file with a split ratio column"
                         f" ({shown[split]!r}) writes {shown[p]!r} not adjusted for splits, so a split would read as"
                         f" a fall of its ratio (2:1 as -50 %)")
            p = adjusted
            adjusted_v = find_column(path, names, shown, ADJUSTED_VOLUME_COLUMNS, "adjusted volume", False)
        else:
            notes.append(f"{path}: {shown[p]!r} is not adjusted for splits in a file with a split ratio column"
                         f" ({shown[split]!r}), and the file has no adjusted close: a split reads as a fall of its"
                         f" ratio (2:1 as -50 %) unless it is found and taken out (training.adjust_splits); adjust the"
                         " prices, or add an 'Adj Close' column")
    bid = ask = bid_v = ask_v = None
    if p is None:  # quotes: the mid of bid and ask
        bid = find_column(path, names, shown, BID_COLUMNS, "bid", False)
        ask = find_column(path, names, shown, ASK_COLUMNS, "ask", False)
        wide = series_columns(shown, names, t) if bid is None or ask is None else ()
        if (bid is None or ask is None) and len(names) == 2 and not _known_column(names[1 - t]):
            p = 1 - t  # a series as FRED writes it: DATE,DCOILWTICO
            notes.append(f"{path}: price from {shown[p]!r}, the one column beside the time (a series as FRED"
                         " writes it)")
        elif wide:
            p = wide[0] if series is None else series
            listed = ", ".join(shown[i] for i in wide[:WIDE_NAMES_SHOWN]) + (", …" if len(wide) > WIDE_NAMES_SHOWN
                                                                            else "")
            notes.append(f"{path}: {len(wide)} series as columns beside the time ({listed}): each read as its own"
                         " market, named by its column, at its values (its rows counted once per series); a row whose"
                         " value is empty, NaN, NA or '.' gives that market no tick"
                         + ("; the unnamed first column (a pandas index) ignored" if t != 0 and 0 not in wide else ""))
            return Columns(len(header), t, shown[t], p, shown[p], None, "", None, "", _market_name(shown[p]),
                           series=wide)
        elif bid is None or ask is None:
            find_column(path, names, shown, PRICE_COLUMNS, "price", True, ", or a bid and an ask column")
        else:
            p = bid
            notes.append(f"{path}: price is the mid of {shown[bid]!r} and {shown[ask]!r}")
    v = find_column(path, names, shown, VOLUME_COLUMNS, "volume", False)
    if adjusted_v is not None:
        if v is not None:
            notes.append(f"{path}: volume from {shown[adjusted_v]!r}, not {shown[v]!r}: beside the close adjusted for"
                         f" splits, the volume adjusted for them ({shown[v]!r}, as traded, jumps by a split's ratio)")
        v = adjusted_v
    if v is None and bid is not None:
        bid_v = find_column(path, names, shown, BID_VOLUME_COLUMNS, "bid volume", False)
        ask_v = find_column(path, names, shown, ASK_VOLUME_COLUMNS, "ask volume", False)
        if bid_v is not None and ask_v is not None:
            v = bid_v
            notes.append(f"{path}: volume is {shown[bid_v]!r} + {shown[ask_v]!r}")
        else:
            ask_v = None
    if v is None:
        v = next((i for i, n in enumerate(names) if n.startswith(VOLUME_PREFIX)), None)
        if v is None:
            v = find_column(path, names, shown, (AMOUNT_VOLUME,), "volume", False)
        if v is not None:
            notes.append(f"{path}: volume from {shown[v]!r}")
    m = find_column(path, names, shown, MARKET_COLUMNS, "market", False)
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


def _market_name(text: str) -> str:
    """``text`` as a market id: printable ASCII (others become ``_``), 1–64 characters."""
    text = "".join(ch if " " <= ch <= "~" else "_" for ch in text).strip()
    return text[:MARKET_ID_MAX].rstrip() or "_"


def series_columns(shown: list[str], names: list[str], t: int) -> tuple[int, ...]:
    """The columns of a table of several series as columns beside the time column ``t`` (``Date,Brent,WTI``, a pandas
    ``to_csv()`` of closes ``Date,AAPL,MSFT,GOOG``, FRED's download of several series): every other column is named,
    by a name of no column read (no open, high, low, volume, market, bid or ask) nor of returns, counts or amounts
    (:func:`_known_column`, :func:`_no_price_name`) nor a number, the names distinct once made market ids; () for any
    other header (one other column is FRED's single series). An unnamed first column beside a named time column (a
    pandas index saved after ``reset_index()``) is ignored."""
    # an unnamed first column beside a named time column is a pandas index (df.reset_index().to_csv()), no series
    others = [i for i in range(len(names)) if i != t and not (i == 0 and _unnamed_index(names))]
    # a name that is a number is an id (zipline's and pyfolio's sids: a table of volumes or market caps by asset) or
    # a value, not a series' name
    if len(others) < 2 or any(_known_column(names[i]) or _no_price_name(names[i]) or is_number(names[i])
                              for i in others):
        return ()
    markets = [_market_name(shown[i]) for i in others]
    return tuple(others) if len(set(markets)) == len(markets) else ()


def _no_price_name(name: str) -> bool:
    """Whether a header name says its column holds no price (an amount, a count, open interest, an id, a spread, which
    can be 0 or below): such a column in a table of series makes it no table of prices."""
    return any(word in name for word in _NO_PRICE_WORDS) or name in ("id", "oi", "n") or name.startswith("unnamed:")


def _known_column(name: str) -> bool:
    """Whether a header name is one of the columns read (other than the price) or a bid or ask column: a file of a
    time and such a column has no price, not a series to read at it (``Date,Volume``)."""
    return (name in TIME_COLUMNS or name in VOLUME_COLUMNS or name.startswith(VOLUME_PREFIX) or name in MARKET_COLUMNS
            or name in BID_COLUMNS or name in ASK_COLUMNS or name in BID_VOLUME_COLUMNS or name in ASK_VOLUME_COLUMNS
            or name in SPLIT_COLUMNS or name in ("open", "high", "low", "") or _returns_name(name))


def _returns_name(name: str) -> bool:
    """Whether a header name says its column holds returns or changes, not prices (``return``, ``pct_change``,
    ``Change %``, ``ret``, ``pnl``)."""
    return (any(word in name for word in ("return", "change", "pct", "%")) or
            name in ("ret", "rets", "r", "chg", "diff", "pnl", "p&l"))


def repeated_hour_time(row: list[str], cols: Columns) -> int | None:
    """ms since the epoch of a row's time read as the second occurrence of a wall-clock time that its time zone
    repeats when the clocks go back (Interactive Brokers' ``20241103 01:30:00 US/Eastern``, or ``2024-11-03 01:30``
    in a file read in America/New_York: 01:00-01:59 comes twice, and is read as the first unless this is asked for);
    None when the time was not read in a zone with daylight saving time, or is not repeated there."""
    if len(row) != cols.fields:
        return None
    try:
        text = time_text(row, cols)
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


FOOTER_LINES_MAX = 5  # rows after a file's last tick, none with a time, skipped as its footer (a total, a disclaimer)


def footer_text(row: list[str], cols: Columns) -> str | None:
    """A row as a footer note shows it (its first 60 characters) when it could be a line of a file's footer (a
    total, a disclaimer): its time field has no digit (``Total``, empty), or it is one field (a line without a
    separator) that is no time; None otherwise (a row cut short after its time, a date that does not exist: a bad
    row wherever it is)."""
    if len(row) == 1 and cols.fields > 1:
        try:
            read_time(row[0], cols.time_name, cols.day_first, cols.time_unit, cols.zone)
        except ValueError:
            pass
        else:
            return None
    elif cols.time < len(row) and _can_be_time(row[cols.time]):
        return None
    shown = cols.delimiter.join(row).strip()
    return shown if len(shown) <= 60 else shown[:59] + "…"


CLOCKS_BACK_MS = 3_600_000  # a time going back by at most this much may be local time in the hour repeated


def clocks_back_hint(row: list[str], cols: Columns, back_ms: int) -> str:
    """Why a row whose time goes back by ``back_ms`` may be local time: ``"; …"`` when it goes back by at most an
    hour and its time has no offset or zone of its own, read in a zone without daylight saving time (UTC, the
    default, or a fixed offset), so that local times of the hour the clocks repeat when they go back would read so;
    else ``""``."""
    if not 0 < back_ms <= CLOCKS_BACK_MS or len(row) != cols.fields:
        return ""
    try:
        text = time_text(row, cols)
        read = read_time(text, cols.time_name, cols.day_first, cols.time_unit, cols.zone)
    except ValueError:
        return ""
    zone = read.zone
    if not read.file_zone or zone is None:
        return ""
    if isinstance(zone, ZoneInfo):
        year = (EPOCH + read.ms * ONE_MS).year
        if any(datetime(year, month, 1, tzinfo=zone).dst() for month in (1, 7)):
            return ""  # a zone with daylight saving time reads its repeated hour (repeated_hour_time)
    return (f"; the time has no offset and was read in {zone_name(zone)}: if the file's times are local times,"
            " this may be the hour repeated when the clocks go back; give the file's time zone (--timezone,"
            " training.data_timezone, or data_timezone in POST /training)")


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
    if cols.flag is not None and row[cols.flag].strip() == "1":
        cols.skipped[LEAN_SUSPICIOUS] = cols.skipped.get(LEAN_SUSPICIOUS, 0) + 1
        return None
    text = time_text(row, cols)
    iso = cols.iso
    if iso is None and text.strip():  # the first time value decides the fast path of the file
        iso = cols.iso = not is_number(text)
    if iso:
        try:
            ts = _iso_time(text, cols)
        except ValueError as exc:
            if not str(exc).endswith(BEFORE_1970) or not _FOUR_DIGIT_YEAR.search(text):
                raise  # (a two-digit year a century back, 27 as 1927, is a misread more likely than a history)
            cols.skipped[BEFORE_EPOCH] = cols.skipped.get(BEFORE_EPOCH, 0) + 1  # a long history's first years
            return None
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
        return mbo_tick(row, cols, cols.mbo, ts, market)
    if cols.action is not None:
        return book_tick(row, cols, ts, market)
    if cols.ask is None:
        written = row[cols.price].strip()
        if written == ".":  # FRED's mark of a day without a value
            cols.skipped[FRED_MISSING] = cols.skipped.get(FRED_MISSING, 0) + 1
            return None
        if written.lower() in _NO_VALUE and _no_values(row, cols):
            cols.skipped[NO_VALUES] = cols.skipped.get(NO_VALUES, 0) + 1
            return None
        if cols.series and written.lower() in _NO_VALUE:  # a series of a table without a value that day
            why = f"{cols.price_name} is empty, NaN or NA, no value of that series (a table of series as columns)"
            cols.skipped[why] = cols.skipped.get(why, 0) + 1
            return None
        price = fixed_price(row[cols.price], cols.price_name) if cols.fixed_point else _price(
            row[cols.price], cols.price_name, cols.decimal_comma)
    else:
        quoted = _quote_update(row, market, cols) if cols.zero_sides else _mid(row, market, cols)
        if quoted is None:
            cols.skipped[LEAN_ONE_SIDE] = cols.skipped.get(LEAN_ONE_SIDE, 0) + 1
            return None
        price = quoted
    if cols.volume is None:
        return ts, market, price, 0.0
    volume = read_volume(row[cols.volume], cols.volume_name, cols)
    if cols.ask_volume is not None:
        blanks = cols.blank_volumes
        volume += read_volume(row[cols.ask_volume], cols.ask_volume_name, cols)
        if volume == _INF:  # two finite sides near the largest float
            raise ValueError(f"{cols.volume_name} + {cols.ask_volume_name} is not finite (each side is, their sum is"
                             " not): no volume is that large")
        cols.blank_volumes = min(cols.blank_volumes, blanks + 1)  # a row counts once
    return ts, market, price, volume


def _no_values(row: list[str], cols: Columns) -> bool:
    """Whether every field of ``row`` but its time, time of day and market is NaN, NA or empty: a bar without trades, no
    tick (a row with a value anywhere else stays a bad row)."""
    keep = (cols.time, cols.clock, cols.market)
    return all(f.strip().lower() in _NO_VALUE for i, f in enumerate(row) if i not in keep)


def time_text(row: list[str], cols: Columns) -> str:
    """A row's time as text to read: its time field, completed by its time of day (``cols.clock``), or written as the
    date and time of day it stands for in a Lean minute, second or tick file (``cols.day``); ValueError when the time
    of day is empty, or such a file's time is not ms within a day."""
    if cols.day:
        return _day_time(row[cols.time], cols)
    return row[cols.time] if cols.clock is None else _with_clock(row, cols)


def _day_time(text: str, cols: Columns) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffff``: the time ``text`` (ms after midnight of ``cols.day``, a fraction of a ms
    allowed, as Lean's tick files write them) stands for."""
    s = text.strip()
    whole, _, frac = s.partition(".")
    if not (s.isascii() and whole.isdigit() and (not frac or frac.isdigit()) and int(whole) < DAY_MS):
        raise ValueError(f"{cols.time_name} {s!r} is not ms after midnight (0 to {DAY_MS - 1}) of {cols.day}, the"
                         " date in the file's name")
    ms = int(whole)
    return (f"{cols.day}T{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"
            f"{frac[:3].ljust(3, '0')}")


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


def _mid(row: list[str], market: str, cols: Columns) -> float:
    """The mid of a quote row's bid and ask; an empty side is the market's previous one (MetaTrader writes only the
    side that changed)."""
    assert cols.ask is not None
    last = cols.quotes.get(market)
    sides = []
    for k, (i, name) in enumerate(((cols.price, cols.price_name), (cols.ask, cols.ask_name))):
        text = row[i]
        if not no_price(text, cols):
            sides.append(fixed_price(text, name) if cols.fixed_point else _price(text, name, cols.decimal_comma))
        elif last is not None:
            sides.append(last[k])
        else:
            what = "empty" if not text.strip() else "Databento's UNDEF_PRICE"
            raise ValueError(f"{name} is {what} and market {market!r} has no earlier {name} to keep")
    cols.quotes[market] = sides
    return mid_price(sides[0], sides[1])


def _quote_update(row: list[str], market: str, cols: Columns) -> float | None:
    """The mid of a market's latest bid and ask after a row of Lean's quotes (ticks or bars), which quotes one side or
    both (a side written 0, or empty, is not quoted in the row); None while a side was never quoted."""
    assert cols.ask is not None
    sides = list(cols.quotes.get(market, (0.0, 0.0)))
    for k, (i, name) in enumerate(((cols.price, cols.price_name), (cols.ask, cols.ask_name))):
        text = row[i]
        if not text.strip():
            continue
        price = signed_price(text, name, cols.decimal_comma)
        if price < 0.0:
            raise ValueError(f"{name} {price} is not >= 0 (0: that side not quoted)")
        if price > 0.0:
            sides[k] = price
    cols.quotes[market] = sides
    return None if 0.0 in sides else mid_price(sides[0], sides[1])


def _price(text: str, name: str, decimal_comma: bool) -> float:
    """A price field (> 0, finite); ValueError naming the column otherwise."""
    price = signed_price(text, name, decimal_comma)
    if not price > 0.0:
        raise ValueError(f"{name} {price} is not > 0")
    return price


def runs_newest_first(path: Path, cols: Columns, sample_rows: int = 10_000) -> bool:
    """True when a file's rows run newest first: of the times that change from one row of a market to its next
    row, within the first ``sample_rows`` rows, more go back than forward. A few out-of-order rows in an
    oldest-first file do not turn it (they are bad rows of the reading pass); False when nothing can be read."""
    last: dict[str, int] = {}
    back = forward = 0
    try:
        with data_rows(path, cols) as reader:
            for _, r in zip(range(sample_rows), reader, strict=False):
                if len(r) != cols.fields:
                    continue
                try:
                    text = time_text(r, cols)
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
    names = [match_name(n) for n in shown]
    bid = next((names.index(a) for a in BID_COLUMNS if a in names), None)
    ask = next((names.index(a) for a in ASK_COLUMNS if a in names), None)
    if bid is None or ask is None:
        return
    try:
        with data_rows(path, cols) as reader:
            rows = [r for _, r in zip(range(sample_rows), reader, strict=False) if len(r) == cols.fields]
    except (OSError, csv.Error):
        return
    if not rows or not all(no_price(r[cols.price], cols) for r in rows):
        return
    empty = "empty or Databento's UNDEF_PRICE" if cols.fixed_point else "empty"
    notes.append(f"{path}: {cols.price_name} is {empty}; price is the mid of {shown[bid]!r} and {shown[ask]!r}"
                 f" (an {empty.replace('empty', 'empty side', 1)} keeps its previous value)")
    cols.price, cols.price_name, cols.ask, cols.ask_name = bid, shown[bid], ask, shown[ask]


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
        with data_rows(path, cols) as reader:
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
    if cols.time == 0 and cols.time_name.strip().lower() in INDEX_NAMES and counts_rows:
        named = cols.time_name.strip().lower() == "index"
        what = f"first column {cols.time_name.strip()!r}" if named else "unnamed first column"
        msg = (f"{path}:1: the {what} counts the rows ({', '.join(firsts)}, …: a pandas RangeIndex, R's row names), it"
               " holds no times and there is no time column; save the file with its times (a column named e.g."
               " 'date' or 'timestamp', or the dates as the index)")
        raise DataError(msg, [msg])
    if first is None:  # every time is 0: read as ms (bad or noted rows of the reading pass)
        first = firsts[0]
    cols.iso = cols.clock is not None or bool(cols.day) or not is_number(first)
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
        with data_rows(path, cols) as reader:
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
                zone: tzinfo = UTC, books: OrderBooks | None = None, series: int | None = None,
                day_first: bool | None = None) -> Columns:
    """How the file at ``path`` is written: the columns used, its header lines, date and number formats and row
    order, from its header line (split at ``delimiter``, see :func:`delimiter_of`) and, where that cannot tell,
    from the file itself; a note in ``notes`` for each thing inferred. DataError for a header, or a date column,
    that cannot be read. The header is the line after ``skipped`` lines (see :func:`leading_lines`); the rows
    start after ``header_rows`` lines (``skipped`` for a headerless Binance file, see :func:`.csvheaderless.binance_layout`). Times
    without an offset are read in ``zone``. ``books``, shared by the files of one load, carries a Databento order
    book's state from one file to the next (see :func:`~.databento.databento_book_events`, :func:`~.databento.databento_mbo`).
    In a table of several series as columns (``cols.series``), the column ``series`` is read (the first when None).
    ``day_first`` (``training.date_order``): the order of dates with slashes or dots, None to read it from the column
    (see :func:`slash_order`)."""
    if delimiter == " ":
        blank_split_times(path, skipped)
    levels = yfinance_header(path, header, delimiter, skipped)
    ticker, lines, ticker_from = "", 1, "the header's Ticker row"
    lean: LeanDay | None = None
    binance = None
    if levels is not None:
        header, ticker, lines = levels
    else:
        binance = binance_layout(path, header, delimiter, skipped)
        if binance is not None:  # no header line: the first line is the first row
            header, lines = list(binance[1]), 0
            notes.append(f"{path}: no header line; read as Binance's {binance[0]} file ({','.join(binance[1])})")
        elif truefx_layout(path, header, delimiter, skipped):
            header, lines = list(TRUEFX_QUOTES), 0
            notes.append(f"{path}: no header line; read as TrueFX's tick file ({','.join(TRUEFX_QUOTES)}; times in"
                         " UTC)")
        elif metatrader4_layout(path, header, delimiter, skipped):
            header, lines = list(METATRADER4_BARS), 0
            notes.append(f"{path}: no header line; read as MetaTrader 4's history export ({','.join(METATRADER4_BARS)};"
                         " times in the broker's time zone, read in " + zone_name(zone) + ": give that zone if it is not)")
        elif histdata_ticks_layout(path, header, delimiter, skipped):
            header, lines = list(HISTDATA_TICKS), 0
            notes.append(f"{path}: no header line; read as HistData's tick file ({','.join(HISTDATA_TICKS)}; times in"
                         f" EST, UTC-05:00 all year, read in {zone_name(zone)}: give -05:00 if they are not)")
        elif (ninja := ninjatrader_layout(path, header, delimiter, skipped)) is not None:
            header, lines = list(ninja), 0
            notes.append(f"{path}: no header line; read as NinjaTrader's (or HistData's) text export"
                         f" ({';'.join(ninja)}; times in the zone it exported them in, read in {zone_name(zone)}: give that"
                         " zone if it is not)")
        elif lean_bars_layout(path, header, delimiter, skipped):
            header, lines = list(LEAN_BARS), 0
            notes.append(f"{path}: no header line; read as QuantConnect Lean's daily or hour bars ({','.join(LEAN_BARS)};"
                         f" times in the exchange's zone, New York for US equities, read in {zone_name(zone)}: give that"
                         " zone if it is not; an equity's prices are in 1/10,000 of a dollar, as Lean stores them, which"
                         " changes no return)")
        elif (lean := lean_intraday_layout(path, header, delimiter)) is not None:
            header, lines = list(lean.names), 0
            if lean.market:
                ticker, ticker_from = _market_name(lean.market), "the symbol in the file's name (or its folder's), as Lean names them"
            notes.append(f"{path}: no header line; read as QuantConnect Lean's {lean.what} ({','.join(lean.names)};"
                         f" times in ms after midnight of {lean.day}, the date in the file's name, in the exchange's"
                         f" zone, New York for US equities, read in {zone_name(zone)}: give that zone if it is not; an"
                         " equity's prices are in 1/10,000 of a dollar, as Lean stores them, which changes no return)")
        elif (with_row_names := row_names_header(path, header, delimiter, skipped)) is not None:
            header = with_row_names
            notes.append(f"{path}: every row has one field more than the header names: the first, unnamed, is the rows'"
                         " names (as R's write.table writes them)")
        elif (kraken := kraken_layout(path, header, delimiter, skipped)) is not None:
            header, lines = list(kraken), 0
            what = "trades (time and sales)" if len(kraken) == 3 else "OHLCVT bars"
            notes.append(f"{path}: no header line; read as Kraken's downloadable {what} ({','.join(kraken)}; times in"
                         " seconds since the epoch)")
        elif (prefixed := symbol_prefixed(header)) is not None:
            header, ticker = prefixed
            ticker_from = f"the prefix of its columns' names (as R's quantmod writes them: {ticker}.Close)"
        names = tuple(match_name(header_name(h)) for h in header)
        if binance is not None or names in (BINANCE_KLINES, BINANCE_AGG_TRADES[:7], BINANCE_TRADES[:6]):
            ticker, ticker_from = binance_symbol(path), "the Binance file name without its date"
    cols = columns_of(path, header, notes, ticker, ticker_from, series)
    cols.zone = zone
    if lean is not None:
        cols.day = lean.day
        if "suspicious" in lean.names:
            cols.flag = lean.names.index("suspicious")
        if lean.quotes:
            cols.zero_sides = True
            notes.append(f"{path}: a row of Lean's quotes may quote one side only, the other written 0 or empty:"
                         " price the mid of each side's latest quote, from the first row both sides were quoted")
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
        named = {";": "';'", "\t": "tabs", "|": "'|'", " ": "single blanks (as R's write.table writes them)"}[delimiter]
        notes.append(f"{path}: fields separated by {named}" + ("; decimal commas read, '.' between digit groups"
                                                              if cols.decimal_comma else ""))
    cols.day_first = slash_order(path, cols, notes, day_first)
    if cols.day_first is not None:
        notes.append(f"{path}: {cols.time_name}: dates read as {'day/month/year' if cols.day_first else 'month/day/year'}"
                     + (" (training.date_order)" if day_first is not None else ""))
    unit_note = time_unit_of(path, cols)
    if unit_note:
        notes.append(unit_note)
    cols.newest_first = runs_newest_first(path, cols)
    return cols
