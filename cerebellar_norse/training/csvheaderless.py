"""Headerless tick files of a known layout: data.binance.vision's (klines, aggTrades, trades), TrueFX's quotes,
MetaTrader 4's history export, NinjaTrader's (and HistData's) text files of bars and ticks, HistData's ticks,
Kraken's downloadable trades (time and sales) and OHLCVT bars, and QuantConnect Lean's bars and ticks.

A file without a header is read only when its first rows fit one of these layouts exactly
(:func:`binance_layout`, :func:`truefx_layout`, :func:`metatrader4_layout`, :func:`ninjatrader_layout`,
:func:`histdata_ticks_layout`, :func:`kraken_layout`, :func:`lean_bars_layout`, :func:`lean_intraday_layout`); the column names each layout gives its fields are the names a
header of that vendor would carry, so the rest of the reader finds the time, price and volume columns by name.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .compressed import open_tick_text, zip_member_name
from .csvnumbers import is_number
from .csvtime import yyyymmdd

# data.binance.vision's files, headerless (spot, and futures before their files had a header), by layout: the column
# names Binance's futures files give them (open_time, transact_time and time are time columns, close and price the
# price, volume, quantity and qty the volume)
BINANCE_KLINES = ("open_time", "open", "high", "low", "close", "volume", "close_time", "quote_volume", "count",
                  "taker_buy_volume", "taker_buy_quote_volume", "ignore")
BINANCE_AGG_TRADES = ("agg_trade_id", "price", "quantity", "first_trade_id", "last_trade_id", "transact_time",
                      "is_buyer_maker", "is_best_match")
BINANCE_TRADES = ("id", "price", "qty", "quote_qty", "time", "is_buyer_maker", "is_best_match")
# TrueFX's tick files, headerless: the pair, the time in UTC (20240102 00:00:00.071), the bid and the ask
TRUEFX_QUOTES = ("pair", "time", "bid", "ask")
_TRUEFX_PAIR = re.compile(r"[A-Z]{3}/[A-Z]{3}")
_TRUEFX_TIME = re.compile(r"\d{8} \d{2}:\d{2}:\d{2}\.\d{3}")
# MetaTrader 4's History Center export (File > Save As, .csv), headerless: 2020.01.02,00:00,O,H,L,C,V
METATRADER4_BARS = ("date", "time", "open", "high", "low", "close", "volume")
_MT4_DATE = re.compile(r"\d{4}\.\d{2}\.\d{2}")
_MT4_TIME = re.compile(r"\d{2}:\d{2}(:\d{2})?")
# NinjaTrader's text export (and HistData's ASCII files, the same layout), headerless, fields separated by ';': bars
# (20200102 000000;O;H;L;C;V), NinjaTrader 7's ticks (20200102 093000;last;volume) and NinjaTrader 8's (20200102
# 093000 1230000;last;bid;ask;volume: 100 ns after the seconds)
NINJATRADER_BARS = ("time", "open", "high", "low", "close", "volume")
NINJATRADER_TICKS = ("time", "last", "volume")
NINJATRADER_QUOTED_TICKS = ("time", "last", "bid", "ask", "volume")
_NINJATRADER_TIME = re.compile(r"\d{8} \d{6}( \d{7})?")
# QuantConnect Lean's daily and hour trade bars (data/<kind>/<market>/daily/spy.zip, unzipped: spy.csv), headerless:
# 20131011 00:00,O,H,L,C,V in the exchange's time zone; an equity's prices in 1/10,000 of a dollar
LEAN_BARS = ("time", "open", "high", "low", "close", "volume")
_LEAN_TIME = re.compile(r"\d{8} \d{2}:\d{2}")
# HistData's ASCII tick files, headerless: the time with ms run on (20190101 170008587), bid, ask, volume
HISTDATA_TICKS = ("time", "bid", "ask", "volume")
_HISTDATA_TIME = re.compile(r"\d{8} \d{9}")
# Kraken's downloadable history, one file per pair: trades (time and sales, XBTUSD.csv) and OHLCVT bars (XBTUSD_1.csv),
# times in whole seconds since the epoch
KRAKEN_TRADES = ("timestamp", "price", "volume")
KRAKEN_OHLCVT = ("timestamp", "open", "high", "low", "close", "volume", "trades")
_KRAKEN_SECONDS = re.compile(r"1[3-9]\d{8}|[2-3]\d{9}")  # 2011-03-13 up to 2096, as plain digits
HEADERLESS_SAMPLE = 50  # headerless rows that must all fit a layout for a file to be read as one
_BINANCE_BOOLEANS = frozenset(("True", "False", "true", "false"))


def _sample_fits(path: Path, delimiter: str, skip: int, fits: Callable[[list[str], list[str]], bool]) -> bool:
    """Whether every row up to ``HEADERLESS_SAMPLE`` after the first (``skip`` lines, then the first row) fits, each
    judged by ``fits(row, previous row)``; False for a file that cannot be read or parsed."""
    try:
        with open_tick_text(path) as fh:
            reader = csv.reader(fh, delimiter=delimiter)
            for _ in range(skip + 1):
                prev = next(reader, None) or []
            for _, row in zip(range(HEADERLESS_SAMPLE - 1), reader, strict=False):
                if not row:
                    continue
                if not fits(row, prev):
                    return False
                prev = row
    except (OSError, csv.Error):
        return False
    return True


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
    first line ``first`` (after ``skip`` lines) and every row up to ``HEADERLESS_SAMPLE`` fit that layout exactly (see
    :func:`_binance_row`), ids or open times increasing; None for any other file."""
    layout = _binance_row(first)
    if layout is None:
        return None
    if not _sample_fits(path, delimiter, skip,
                        lambda row, prev: _binance_row(row) == layout and int(row[0]) > int(prev[0])):
        return None
    return layout


def _truefx_row(row: list[str]) -> bool:
    """Whether one headerless row is a TrueFX quote exactly: ``EUR/USD,20240102 00:00:00.071,1.10425,1.10430``."""
    return (len(row) == 4 and _TRUEFX_PAIR.fullmatch(row[0]) is not None and _TRUEFX_TIME.fullmatch(row[1]) is not None
            and all(is_number(f) and math.isfinite(float(f)) for f in row[2:]))


def truefx_layout(path: Path, first: list[str], delimiter: str = ",", skip: int = 0) -> bool:
    """Whether a headerless file is TrueFX's tick file: its first line ``first`` (after ``skip`` lines) and every row
    up to ``HEADERLESS_SAMPLE`` are TrueFX quotes (:func:`_truefx_row`) with times that do not go back."""
    return _truefx_row(first) and _sample_fits(path, delimiter, skip,
                                               lambda row, prev: _truefx_row(row) and row[1] >= prev[1])


def _finite(*fields: str) -> bool:
    """Whether every field is a plain finite number."""
    return all(is_number(f) and math.isfinite(float(f)) for f in fields)


def _bar_fits(o: str, h: str, low: str, c: str) -> bool:
    """Whether open, high, low and close form a bar: the high at or above the others, the low at or below them."""
    fo, fh, fl, fc = float(o), float(h), float(low), float(c)
    return fl <= min(fo, fc, fh) and fh >= max(fo, fc, fl)


def _metatrader4_row(row: list[str]) -> bool:
    """Whether one headerless row is a MetaTrader 4 bar exactly: ``2020.01.02,00:00,1.1212,1.1215,1.1210,1.1213,123``
    (date with dots, time of day, open, high, low, close forming a bar, volume)."""
    return (len(row) == 7 and _MT4_DATE.fullmatch(row[0]) is not None and _MT4_TIME.fullmatch(row[1]) is not None
            and _finite(*row[2:]) and _bar_fits(*row[2:6]) and float(row[6]) >= 0)


def metatrader4_layout(path: Path, first: list[str], delimiter: str = ",", skip: int = 0) -> bool:
    """Whether a headerless file is MetaTrader 4's history export: its first line ``first`` (after ``skip`` lines) and
    every row up to ``HEADERLESS_SAMPLE`` are MetaTrader 4 bars (:func:`_metatrader4_row`) whose times go forward."""
    return _metatrader4_row(first) and _sample_fits(
        path, delimiter, skip, lambda row, prev: _metatrader4_row(row) and (row[0], row[1]) > (prev[0], prev[1]))


def _ninjatrader_row(row: list[str]) -> tuple[str, ...] | None:
    """The NinjaTrader layout (column names) one headerless row fits exactly, or None: a time ``20200102 093000`` (or
    ``20200102 093000 1230000``), then open, high, low, close forming a bar and a volume; or a price and a volume; or
    a last, bid, ask and volume."""
    if not row or _NINJATRADER_TIME.fullmatch(row[0]) is None or not _finite(*row[1:]):
        return None
    if len(row) == 6 and _bar_fits(*row[1:5]) and float(row[5]) >= 0:
        return NINJATRADER_BARS
    if len(row) == 3 and float(row[2]) >= 0:
        return NINJATRADER_TICKS
    if len(row) == 5 and float(row[2]) <= float(row[3]) and float(row[4]) >= 0:
        return NINJATRADER_QUOTED_TICKS
    return None


def ninjatrader_layout(path: Path, first: list[str], delimiter: str = ";", skip: int = 0) -> tuple[str, ...] | None:
    """The column names of a headerless NinjaTrader (or HistData) text file, separated by ``;``, whose first line
    ``first`` (after ``skip`` lines) and every row up to ``HEADERLESS_SAMPLE`` fit one layout
    (:func:`_ninjatrader_row`) with times that do not go back; None for any other file."""
    if delimiter != ";":
        return None
    layout = _ninjatrader_row(first)
    if layout is None:
        return None
    if not _sample_fits(path, delimiter, skip, lambda row, prev: _ninjatrader_row(row) == layout and row[0] >= prev[0]):
        return None
    return layout


def _lean_bar_row(row: list[str]) -> bool:
    """Whether one headerless row is a Lean daily or hour trade bar exactly: ``19980102 00:00,973100,975300,965300,
    973600,2150000`` (date and time of day, open, high, low, close forming a bar, a volume)."""
    return (len(row) == 6 and _LEAN_TIME.fullmatch(row[0]) is not None and _finite(*row[1:])
            and _bar_fits(*row[1:5]) and float(row[5]) >= 0)


def lean_bars_layout(path: Path, first: list[str], delimiter: str = ",", skip: int = 0) -> bool:
    """Whether a headerless file is QuantConnect Lean's daily or hour trade bars: its first line ``first`` (after
    ``skip`` lines) and every row up to ``HEADERLESS_SAMPLE`` are Lean bars (:func:`_lean_bar_row`) whose times go
    forward."""
    return delimiter == "," and _lean_bar_row(first) and _sample_fits(
        path, delimiter, skip, lambda row, prev: _lean_bar_row(row) and row[0] > prev[0])


LEAN_QUOTE_BARS = ("time", "bid_open", "bid_high", "bid_low", "bid", "bid_size", "ask_open", "ask_high", "ask_low",
                   "ask", "ask_size")
# QuantConnect Lean's tick files: equities' trades and quotes (an exchange, a sale condition and Lean's suspicious flag
# after the numbers; a quote updates one side, the other written 0,0), forex and CFD quotes (bid, ask), crypto trades
# and quotes (their numbers only)
LEAN_TRADE_TICKS = ("time", "price", "quantity", "exchange", "sale_condition", "suspicious")
LEAN_QUOTE_TICKS = ("time", "bid", "bid_size", "ask", "ask_size", "exchange", "sale_condition", "suspicious")
_LEAN_TICK_LAYOUTS = {("trade", 6): LEAN_TRADE_TICKS, ("trade", 3): LEAN_TRADE_TICKS[:3],
                      ("quote", 8): LEAN_QUOTE_TICKS, ("quote", 5): LEAN_QUOTE_TICKS[:5], ("quote", 3): ("time", "bid", "ask")}
# QuantConnect Lean's minute, second and tick files: 20171217_btcusd_minute_trade.csv, 20131007_spy_Trade_Tick.csv,
# 20140501_xauusd_tick_quote.csv, each zipped as 20171217_trade.zip in the symbol's folder
# (data/crypto/coinbase/minute/btcusd/); their first field is ms since midnight of the name's date
_LEAN_DAY_FILE = re.compile(r"(\d{8})_")
# (a future's or an option's files add the contract's expiry: 20131007_gc_minute_trade_201310.csv)
_LEAN_DAY_CSV = re.compile(r"\d{8}_(.+?)_(minute|second|tick)_(trade|quote)(?:_(\d{6,8}))?(?:\.|$)", re.IGNORECASE)
_LEAN_TICK_CSV = re.compile(r"\d{8}_(.+?)_(trade|quote)_(tick)(?:_(\d{6,8}))?(?:\.|$)", re.IGNORECASE)
_LEAN_DAY_ZIP = re.compile(r"\d{8}_(trade|quote)\.zip", re.IGNORECASE)
_LEAN_MS = re.compile(r"\d+(?:\.\d+)?")  # tick files write fractions of a ms (43.142)
DAY_MS = 86_400_000


@dataclass(frozen=True)
class LeanDay:
    """How a QuantConnect Lean minute, second or tick file is read (see :func:`lean_intraday_layout`)."""

    names: tuple[str, ...]  # the column names read (LEAN_BARS, LEAN_QUOTE_BARS, LEAN_TRADE_TICKS, ...)
    day: str  # YYYY-MM-DD: the date whose midnight (in the exchange's zone) its times count from, in ms
    market: str  # the symbol, with "-second", "-tick" and "-quote" as the file's kind says ("" when no name tells it)
    what: str  # "minute trade bars", "tick quotes", ... for the note

    @property
    def quotes(self) -> bool:
        """Whether the file holds quotes (bars or ticks), whose rows may quote one side only."""
        return "ask" in self.names


def _lean_day_row(row: list[str], numbers: int, quotes: bool) -> bool:
    """Whether a headerless row opens a Lean minute, second or tick file: ms since midnight (below a day's, a fraction
    allowed) and ``numbers - 1`` plain finite numbers after it (the fields beyond them are a tick's exchange, sale
    condition and suspicious flag); in a file of ``quotes`` a side not quoted may be empty, not both."""
    ms = row[0].strip()
    if _LEAN_MS.fullmatch(ms) is None or float(ms) >= DAY_MS:
        return False
    fields = row[1:numbers]
    if not quotes:
        return _finite(*fields)
    written = [f for f in fields if f.strip()]
    return _finite(*written) and any(float(f) > 0 for f in written)


def lean_intraday_layout(path: Path, first: list[str], delimiter: str = ",") -> LeanDay | None:
    """How to read a headerless QuantConnect Lean minute, second or tick file, None for any other file: its name
    starts with a date (``20171217_btcusd_minute_trade.csv``, ``20131007_spy_Trade_Tick.csv``, or the zip
    ``20171217_trade.zip`` holding one) and its first line ``first`` is a row of one of Lean's layouts: a trade bar
    (6 numbers: ms since midnight, open, high, low, close, volume), a quote bar (11: ms, the bid's bar and size, the
    ask's bar and size) or, in a tick file (its name, its zip's file's name or its folder's folder says ``tick``),
    a tick of its kind (``_LEAN_TICK_LAYOUTS``: a trade's price and quantity, a quote's bid and ask, with their sizes,
    and an equity's exchange, sale condition and suspicious flag). Later rows are checked by the reading pass, as any
    file's. The market is the symbol in the file's name (a zip's: in the name of the file it holds), else the name
    of the folder the file is in, which Lean names after the symbol."""
    day = _LEAN_DAY_FILE.match(path.name)
    if day is None or delimiter != "," or not first:
        return None
    d = day[1]
    if yyyymmdd(d) is None:  # no date, or one before 1970
        return None
    named = _match_lean_name(path.name) or _match_lean_name(Path(zip_member_name(path)).name)
    folder = path.parent.parent.name.lower()
    resolution = named[1] if named else (folder if folder in ("second", "tick") else "minute")
    zipped = _LEAN_DAY_ZIP.fullmatch(path.name)
    kind = named[2] if named else zipped[1].lower() if zipped else ""
    if resolution == "tick":
        names = _LEAN_TICK_LAYOUTS.get((kind, len(first)))
        what = f"tick {kind}s"
    else:
        names = LEAN_BARS if len(first) == 6 else LEAN_QUOTE_BARS if len(first) == 11 else None
        kind = "trade" if names == LEAN_BARS else "quote"
        what = f"{resolution} {kind} bars"
    if names is None:
        return None
    numbers = names.index("exchange") if "exchange" in names else len(names)  # (an equity tick's text fields follow)
    if not _lean_day_row(first, numbers, kind == "quote"):
        return None
    symbol = named[0] if named else path.parent.name
    suffix = ("" if resolution == "minute" else f"-{resolution}") + ("-quote" if kind == "quote" else "")
    return LeanDay(names, f"{d[:4]}-{d[4:6]}-{d[6:]}", symbol + suffix if symbol else "", what)


def _match_lean_name(name: str) -> tuple[str, str, str] | None:
    """(symbol, resolution, kind) of a Lean minute, second or tick file's name, in lower case but the symbol (with a
    future's expiry: ``gc-201310``, each contract its own series); None for another name."""
    m = _LEAN_DAY_CSV.match(name)
    if m is not None:
        resolution, kind = m[2].lower(), m[3].lower()
    else:
        m = _LEAN_TICK_CSV.match(name)
        if m is None:
            return None
        resolution, kind = "tick", m[2].lower()
    return (m[1] if m[4] is None else f"{m[1]}-{m[4]}"), resolution, kind


def _histdata_tick_row(row: list[str]) -> bool:
    """Whether one headerless row is a HistData tick exactly: ``20190101 170008587,1.146480,1.146680,0`` (the time
    with its ms run on, a bid at or below the ask, a volume)."""
    return (len(row) == 4 and _HISTDATA_TIME.fullmatch(row[0]) is not None and _finite(*row[1:])
            and float(row[1]) <= float(row[2]) and float(row[3]) >= 0)


def histdata_ticks_layout(path: Path, first: list[str], delimiter: str = ",", skip: int = 0) -> bool:
    """Whether a headerless file is HistData's ASCII tick file: its first line ``first`` (after ``skip`` lines) and
    every row up to ``HEADERLESS_SAMPLE`` are HistData ticks (:func:`_histdata_tick_row`) whose times do not go
    back."""
    return _histdata_tick_row(first) and _sample_fits(
        path, delimiter, skip, lambda row, prev: _histdata_tick_row(row) and row[0] >= prev[0])


def _kraken_row(row: list[str]) -> tuple[str, ...] | None:
    """The layout of one headerless row of Kraken's downloadable history, None for any other row: a trade
    ``1672531436,90.540000,1.10448420`` (whole seconds, a price above 0, a volume) or an OHLCVT bar
    ``1672531200,90.5,90.6,90.3,90.4,12.5,7`` (whole seconds, open, high, low and close forming a bar, a volume, a
    whole count of trades)."""
    if not row or _KRAKEN_SECONDS.fullmatch(row[0]) is None or not _finite(*row[1:]):
        return None
    if len(row) == 3 and float(row[1]) > 0 and float(row[2]) >= 0:
        return KRAKEN_TRADES
    if (len(row) == 7 and _bar_fits(*row[1:5]) and float(row[4]) > 0 and float(row[5]) >= 0
            and row[6].isdigit()):
        return KRAKEN_OHLCVT
    return None


def kraken_layout(path: Path, first: list[str], delimiter: str = ",", skip: int = 0) -> tuple[str, ...] | None:
    """The layout of a headerless file of Kraken's downloadable history (``KRAKEN_TRADES`` or ``KRAKEN_OHLCVT``): its
    first line ``first`` (after ``skip`` lines) and every row up to ``HEADERLESS_SAMPLE`` are rows of that layout
    (:func:`_kraken_row`) whose times do not go back; None for any other file."""
    layout = _kraken_row(first) if delimiter == "," else None
    if layout is None:
        return None
    fits = _sample_fits(path, delimiter, skip,
                        lambda row, prev: _kraken_row(row) == layout and int(row[0]) >= int(prev[0]))
    return layout if fits else None
