"""Reading Databento's CSV files: order-book top rows (mbp-1, mbp-10), order events (mbo) and fixed-point prices.

:func:`databento_book_events` and :func:`databento_mbo` tell a file of book events from Databento's other schemas
and set its :class:`~.csvcolumns.Columns` to read each row at the mid of the best bid and ask after its event
(:func:`book_tick`; :func:`mbo_tick`, its book rebuilt by :mod:`.orderbook`); :func:`databento_fixed_point` tells
prices written as integers in units of 1e-9 (:func:`fixed_price`). Prices are in quote currency, volumes in traded
units. :mod:`.csvformat` runs these probes and reads the other rows.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from .csvcolumns import (
    Columns,
    MboColumns,
    data_rows,
    find_column,
    header_name,
    match_name,
    mid_price,
    read_volume,
    signed_price,
)
from .orderbook import F_LAST, F_TOB, OrderBooks, Sides, Top, best_of

_INF = math.inf

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


def book_tick(row: list[str], cols: Columns, ts: int, market: str) -> tuple[int, str, float, float] | None:
    """A Databento order-book row (mbp-1, mbp-10) as (ms, market, mid of its bid_px_00 and ask_px_00, size of a trade,
    T or F, else 0); None, counted in ``cols.skipped``, for a row that is no tick (see :func:`_book_skip`).
    ValueError for a field that cannot be read, the market's previous top kept."""
    assert cols.action is not None
    top = _book_top(row, cols, market)
    traded = row[cols.action].strip() in DATABENTO_TRADE_ACTIONS
    volume = read_volume(row[cols.volume], cols.volume_name, cols) if traded and cols.volume is not None else 0.0
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
    sides: Sides = (None if no_price(bid_text, cols) else _book_price(bid_text, cols.price_name, cols),
                    None if no_price(ask_text, cols) else _book_price(ask_text, cols.ask_name, cols))
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


def mbo_tick(row: list[str], cols: Columns, m: MboColumns, ts: int, market: str) -> tuple[int, str, float, float] | None:
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
            traded = books.pending.get(event, 0.0) + read_volume(row[cols.volume], cols.volume_name, cols)
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
    size = read_volume(row[cols.volume], cols.volume_name, cols)
    if action == "C":
        if not m.books.cancel(*event, _order_id(row, m), size):
            m.unknown_cancels += 1
        return
    text = row[m.side].strip()
    bid = _ORDER_SIDES.get(text)
    if bid is None:
        raise ValueError(f"{m.names[m.side]} {text!r} is not B (bid) or A (ask), as the side of action {action} must be")
    if flags is not None and flags & F_TOB:
        price = None if no_price(row[cols.price], cols) else _order_price(row, cols)
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
    return signed_price(text, name, cols.decimal_comma)


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


def no_price(text: str, cols: Columns) -> bool:
    """Whether a price field is empty, or Databento's UNDEF_PRICE in a file of its fixed-point prices (what its
    pretty_px files write as an empty field)."""
    s = text.strip()
    return not s or (cols.fixed_point and s == DATABENTO_UNDEF_PRICE)


def fixed_price(text: str, name: str) -> float:
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
    names = [match_name(s) for s in shown]
    if not set(names) >= DATABENTO_FIELDS | {DATABENTO_ACTION, *DATABENTO_TOP}:
        return None
    action = find_column(path, names, shown, (DATABENTO_ACTION,), "action", True)
    bid, ask = (find_column(path, names, shown, (name,), name, True) for name in DATABENTO_TOP)
    assert action is not None and bid is not None and ask is not None
    seen: set[str] = set()
    try:
        with data_rows(path, cols) as reader:
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
    cols.publisher = find_column(path, names, shown, ("publisher_id",), "publisher_id", True)
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
    names = [match_name(s) for s in shown]
    if not set(names) >= DATABENTO_FIELDS | MBO_FIELDS or DATABENTO_TOP[0] in names:
        return None

    def index(name: str) -> int:
        i = find_column(path, names, shown, (name,), name, True)  # DataError for a column named twice
        assert i is not None
        return i

    action, side, order_id, publisher, price, size = (
        index(n) for n in ("action", "side", "order_id", "publisher_id", "price", "size"))
    instrument, flags = (find_column(path, names, shown, (n,), n, False) for n in ("instrument_id", "flags"))
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
    if not {match_name(header_name(h)) for h in header} >= DATABENTO_FIELDS:
        return None
    used = [i for i in (cols.price, cols.ask) if i is not None]
    prices: list[str] = []
    undefined = False
    try:
        with data_rows(path, cols) as reader:
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
