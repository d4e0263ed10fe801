"""Order books rebuilt from Databento's market-by-order (mbo) events, for the best bid and best ask after each event.

Databento's mbo schema has no top-of-book columns: each record is one order event (action ``A`` add, ``C`` cancel,
``M`` modify, ``R`` clear the book, ``T`` trade, ``F`` fill, ``N`` none), keyed by its order id, on one instrument
at one publisher (venue). Following Databento's own book-building examples:

* ``A`` rests an order (``side`` ``B`` bid or ``A`` ask, ``price``, ``size``); ``M`` changes an existing order's
  price and/or size, and acts as an add for an order not in the book; an add of an order already resting replaces it.
  An add or modify to size 0 leaves no order (a modify to 0 removes it).
* ``C`` removes ``size`` from an order, the whole order when nothing is left (never below zero), on the side the
  order rests on; a cancel of an order not in the book (a file that starts after the order was placed, without a
  snapshot) changes nothing (:meth:`OrderBooks.cancel` returns False).
* ``R`` empties the book of that instrument at that publisher (the start of a snapshot or a session).
* ``T``, ``F`` and ``N`` do not change the book: the cancels and modifies that go with a trade do.
* A top-of-book record (flag ``F_TOB``, as Databento writes the mbo of venues that publish only their best bid and
  offer) replaces its whole side with that one price, or empties the side when it has no price.

Each instrument has one book per publisher; its best bid is the highest best bid over its publishers' books, its best
ask the lowest best ask (as Databento's consolidated examples take the BBO of a dataset such as DBEQ.BASIC).

Prices are in quote currency (already scaled by the caller, e.g. from Databento's fixed-point units of 1e-9), any
finite number (a calendar spread's can be 0 or below); sizes in traded units. Memory is O(live orders): an order leaves
the book with its last unit.

One :class:`OrderBooks` may serve several files of one stream in turn (a request split into files, consecutive daily
files): the orders resting at the end of one file are the book at the start of the next.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

F_LAST = 128  # last record of an event for its instrument: the book is consistent only after it
F_TOB = 64  # a top-of-book record (the side's best price and nothing deeper), not an individual order

_COMPACT_SLACK = 64  # stale heap entries tolerated beyond the live levels before the heap is rebuilt


class BookSide:
    """One side of a book: price -> number of orders resting there, and the best price (highest bid, lowest ask).

    The best is the top of a heap of level prices; a level that empties stays in the heap until it reaches the top
    (then dropped), and the heap is rebuilt from the live levels when stale entries outnumber them, so memory stays
    O(live levels)."""

    __slots__ = ("_heap", "_sign", "levels")

    def __init__(self, bids: bool) -> None:
        self.levels: dict[float, int] = {}
        self._heap: list[float] = []  # prices times _sign: the top is the best
        self._sign = -1.0 if bids else 1.0

    def add(self, price: float) -> None:
        """One more order at ``price``."""
        count = self.levels.get(price)
        if count is not None:
            self.levels[price] = count + 1
            return
        self.levels[price] = 1
        heapq.heappush(self._heap, self._sign * price)
        if len(self._heap) > 2 * len(self.levels) + _COMPACT_SLACK:
            self._heap = [self._sign * p for p in self.levels]
            heapq.heapify(self._heap)

    def remove(self, price: float) -> None:
        """One order fewer at ``price`` (which holds one)."""
        count = self.levels[price] - 1
        if count:
            self.levels[price] = count
        else:
            del self.levels[price]

    def best(self) -> float | None:
        """The best price with an order resting, None for an empty side."""
        heap, levels = self._heap, self.levels
        while heap:
            price = self._sign * heap[0]
            if price in levels:
                return price
            heapq.heappop(heap)
        return None

    def clear(self) -> None:
        """No orders on this side."""
        self.levels.clear()
        self._heap.clear()


class Book:
    """The orders of one instrument at one publisher: order id -> (bid, price, size left), and both sides' levels."""

    __slots__ = ("asks", "bids", "orders")

    def __init__(self) -> None:
        self.orders: dict[int, tuple[bool, float, float]] = {}
        self.bids = BookSide(bids=True)
        self.asks = BookSide(bids=False)

    def _side(self, bid: bool) -> BookSide:
        return self.bids if bid else self.asks

    def place(self, order_id: int, bid: bool, price: float, size: float) -> None:
        """An add or a modify: the order rests at ``price`` with ``size`` (units), replacing any order of that id;
        with no units (size 0) it leaves the book instead, as a cancel of all it holds: an order of nothing is no
        bid or ask, and would otherwise set the top."""
        old = self.orders.get(order_id)
        if old is not None:
            self._side(old[0]).remove(old[1])
        if size <= 0:
            if old is not None:
                del self.orders[order_id]
            return
        self.orders[order_id] = (bid, price, size)
        self._side(bid).add(price)

    def cancel(self, order_id: int, size: float) -> bool:
        """``size`` units fewer in the order, which leaves the book when none are left; False, nothing changed, for
        an order not in the book."""
        order = self.orders.get(order_id)
        if order is None:
            return False
        bid, price, left = order
        left -= size
        if left > 0:
            self.orders[order_id] = (bid, price, left)
        else:
            del self.orders[order_id]
            self._side(bid).remove(price)
        return True

    def top_of_book(self, bid: bool, price: float | None) -> None:
        """A top-of-book record: the side holds only ``price`` (nothing when None), no individual orders."""
        side = self._side(bid)
        if self.orders:
            self.orders = {k: o for k, o in self.orders.items() if o[0] != bid}
        side.clear()
        if price is not None:
            side.add(price)

    def clear(self) -> None:
        """An empty book (action R)."""
        self.orders.clear()
        self.bids.clear()
        self.asks.clear()


Top = tuple[float, float]  # an instrument's best bid and best ask (quote currency)
Sides = tuple[float | None, float | None]  # one publisher's best bid and best ask (None: no order on that side)


def best_of(venues: Iterable[Sides]) -> Top | None:
    """The best bid and best ask over several publishers' (``venues``: each one's best bid and ask, None for a side
    without an order): the highest bid and the lowest ask, in quote currency; None when none has a bid or none has an
    ask. (Such a consolidated top can be crossed: it is taken as it is.)"""
    bid: float | None = None
    ask: float | None = None
    for b, a in venues:
        if b is not None and (bid is None or b > bid):
            bid = b
        if a is not None and (ask is None or a < ask):
            ask = a
    if bid is None or ask is None:
        return None
    return bid, ask


class OrderBooks:
    """The books of every instrument in a stream of files, one per publisher, and the best bid and ask of each
    instrument.

    Instruments and publishers are keys as the files write them (``instrument_id``, ``publisher_id``). Beside the
    books, what a reader carries from one event to the next: ``tops``, each instrument's best bid and ask after its
    latest event (None while it lacks a side), to tell whether an event moved them (an mbp file's reader keeps its
    markets' tops there too, so that they also carry from file to file); ``pending``, the units traded so far in an
    event whose last record is still to come, per (instrument, publisher); ``venues``, an mbp file's markets' latest
    top per publisher, whose best bid and ask are the market's."""

    __slots__ = ("_books", "pending", "tops", "venues")

    def __init__(self) -> None:
        self._books: dict[str, dict[str, Book]] = {}
        self.tops: dict[str, Top | None] = {}
        self.pending: dict[tuple[str, str], float] = {}
        self.venues: dict[str, dict[str, Sides]] = {}  # an mbp file's markets -> publisher -> its latest top

    def book(self, instrument: str, publisher: str) -> Book:
        """The book of ``instrument`` at ``publisher`` (empty at first)."""
        books = self._books.get(instrument)
        if books is None:
            books = self._books[instrument] = {}
        book = books.get(publisher)
        if book is None:
            book = books[publisher] = Book()
        return book

    def cancel(self, instrument: str, publisher: str, order_id: int, size: float) -> bool:
        """Action C (see :meth:`Book.cancel`); False, nothing changed, when the order is not in the book."""
        return self.book(instrument, publisher).cancel(order_id, size)

    def resting(self) -> int:
        """Orders resting over every book (a top-of-book record's price counts as one)."""
        return sum(sum(side.levels.values()) for books in self._books.values() for book in books.values()
                   for side in (book.bids, book.asks))

    def top(self, instrument: str) -> Top | None:
        """The best bid and best ask of ``instrument`` over its publishers (quote currency); None when no publisher
        has a bid or none has an ask (:func:`best_of`)."""
        return best_of((book.bids.best(), book.asks.best()) for book in self._books.get(instrument, {}).values())
