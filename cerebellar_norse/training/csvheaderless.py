"""Headerless tick files of a known layout: data.binance.vision's (klines, aggTrades, trades) and TrueFX's quotes.

A file without a header is read only when its first rows fit one of these layouts exactly
(:func:`binance_layout`, :func:`truefx_layout`); the column names each layout gives its fields are the names a
header of that vendor would carry, so the rest of the reader finds the time, price and volume columns by name.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from pathlib import Path

from .compressed import open_tick_text
from .csvnumbers import is_number

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
