"""Databento market-by-order (mbo) files: each instrument's book rebuilt from its order events and read at the mid of
its best bid and ask after each event (its last record, flags F_LAST), with the size of its trades as volume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cerebellar_norse.cli import main
from cerebellar_norse.errors import DataError
from cerebellar_norse.training.checkpoints import ModelStore
from cerebellar_norse.training.csvformat import file_format
from cerebellar_norse.training.data import load_csv_files
from cerebellar_norse.training.orderbook import BookSide

HEAD = ("ts_recv,ts_event,rtype,publisher_id,instrument_id,action,side,price,size,channel_id,order_id,flags,"
        "ts_in_delta,sequence,symbol")
DBN_NS = 1_701_302_400_000_000_000  # 2023-11-30 00:00 UTC
T0_MS = DBN_NS // 10**6
UNDEF = "9223372036854775807"
LAST = 128  # F_LAST
SNAPSHOT = 40  # Databento's F_SNAPSHOT (32) | F_BAD_TS_RECV (8), as a snapshot's records other than its last carry
TOB = 64  # F_TOB
ES, NQ = ("5482", "ESZ3"), ("1234", "NQZ3")

# (instrument, action, side, price, size, order_id, flags); row k is at DBN_NS + k seconds, publisher 1
EVENTS = [
    (ES, "R", "N", None, 0, 0, SNAPSHOT),  # 0: a snapshot: clear, then the resting orders
    (ES, "A", "B", "4108.25", 5, 1, SNAPSHOT),  # 1
    (ES, "A", "B", "4108.00", 4, 2, SNAPSHOT),  # 2
    (ES, "A", "A", "4108.75", 7, 3, SNAPSHOT),  # 3
    (ES, "A", "A", "4109.00", 2, 4, SNAPSHOT | LAST),  # 4: snapshot complete: 4108.25 / 4108.75
    (ES, "A", "B", "4107.75", 9, 5, LAST),  # 5: a deeper bid: top unchanged, no tick
    (ES, "C", "B", "4108.25", 2, 1, LAST),  # 6: partial cancel of the best bid (5 -> 3): top unchanged, no tick
    (ES, "C", "B", "4108.25", 3, 1, LAST),  # 7: the rest of it: best bid 4108.00
    (ES, "M", "A", "4108.50", 7, 3, LAST),  # 8: the best ask modified down: 4108.00 / 4108.50
    (ES, "T", "B", "4108.50", 3, 0, 0),  # 9: a buy of 3 ...
    (ES, "F", "A", "4108.50", 3, 3, 0),  # 10: ... filling order 3 ...
    (ES, "C", "A", "4108.50", 3, 3, LAST),  # 11: ... which the cancel reduces (7 -> 4): top unchanged, a tick of 3
    (ES, "T", "B", "4108.50", 4, 0, 0),  # 12: a buy of 4 ...
    (ES, "F", "A", "4108.50", 4, 3, 0),  # 13
    (ES, "C", "A", "4108.50", 4, 3, LAST),  # 14: ... takes the rest of order 3: best ask 4109.00
    (NQ, "A", "B", "15000.00", 1, 100, LAST),  # 15: NQ has a bid only: no mid
    (ES, "M", "B", "4108.25", 6, 99, LAST),  # 16: a modify of an order not in the book adds it: best bid 4108.25
    (NQ, "A", "A", "15001.00", 1, 101, LAST),  # 17: NQ 15000 / 15001
    (ES, "C", "B", "4108.25", 1, 777, LAST),  # 18: a cancel of an order never seen: ignored, counted; no tick
    (ES, "R", "N", None, 0, 0, LAST),  # 19: cleared: no book, no mid
    (ES, "A", "B", "4110.00", 1, 200, LAST),  # 20: rebuilt: a bid only
    (ES, "A", "A", "4110.50", 1, 201, LAST),  # 21: 4110.00 / 4110.50
    (NQ, "N", "N", None, 0, 0, LAST),  # 22: no action: the last record of an event that moves nothing, no tick
]
ES_TICKS = [4, 7, 8, 11, 14, 16, 21]  # rows with F_LAST and both sides that move the best bid or ask, or trade
ES_MIDS = [(4108.25 + 4108.75) / 2, (4108.00 + 4108.75) / 2, (4108.00 + 4108.50) / 2, (4108.00 + 4108.50) / 2,
           (4108.00 + 4109.00) / 2, (4108.25 + 4109.00) / 2, (4110.00 + 4110.50) / 2]
ES_VOLUMES = [0, 0, 0, 3, 4, 0, 0]
NQ_TICKS, NQ_MIDS, NQ_VOLUMES = [17], [15000.5], [0]
MBO_NOTE = ("Databento market-by-order events (mbo): each instrument's book is rebuilt from its orders (action A, C,"
            " M, R; one book per publisher_id, the best bid and ask over them); price is the mid of the best bid and"
            " best ask after each event's last record (flags F_LAST, 128), volume the size of trades (T) only; a row"
            " whose book lacks a side is skipped")
MID_EVENT = ("8 rows skipped: not the last record of its event (flags without F_LAST, 128): the book is consistent only"
             " after the last, whose tick carries the event's trades")
ONE_SIDED = ("3 rows skipped: the book lacks a side (no bid or no ask order after its event: before the first orders,"
             " after a clear)")
UNCHANGED = "4 rows skipped: the best bid and ask prices did not change and nothing traded"  # rows 5, 6, 18, 22
UNKNOWN = ("1 cancel (action C) of orders not in the book ignored: the book was incomplete at the start (the file"
           " starts after those orders were placed, without a snapshot)")


def px(text: str | None, fixed: bool) -> str:
    """A price as Databento writes it: fixed point (units of 1e-9, UNDEF_PRICE for none) or pretty_px (empty)."""
    if text is None:
        return UNDEF if fixed else ""
    return str(round(float(text) * 10**9)) if fixed else f"{float(text):.9f}"


def mbo_rows(events: list[tuple[tuple[str, str], str, str, str | None, int, int | str, int | str]], fixed: bool,
             publishers: list[int] | None = None) -> list[str]:
    """The CSV lines of ``events``, row k at DBN_NS + k s (publisher 1, or ``publishers[k]``)."""
    lines = []
    for k, ((instrument, symbol), action, side, price, size, order_id, flags) in enumerate(events):
        t = DBN_NS + k * 10**9
        pub = 1 if publishers is None else publishers[k]
        lines.append(f"{t},{t},160,{pub},{instrument},{action},{side},{px(price, fixed)},{size},0,{order_id},{flags},"
                     f"0,{k},{symbol}")
    return lines


def write(folder: Path, lines: list[str], name: str = "ES.mbo.csv", head: str = HEAD) -> Path:
    path = folder / name
    path.write_text("\n".join([head, *lines]) + "\n")
    return path


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed-point", "pretty_px"])
def test_an_mbo_file_is_read_at_the_mid_of_its_rebuilt_book(tmp_path: Path, fixed: bool) -> None:
    path = write(tmp_path, mbo_rows(EVENTS, fixed))
    data = load_csv_files([path])
    es, nq = data.markets
    assert es.market_id == "ESZ3" and es.price.tolist() == ES_MIDS and es.volume.tolist() == ES_VOLUMES
    assert es.timestamp.tolist() == [T0_MS + k * 1000 for k in ES_TICKS]
    assert nq.market_id == "NQZ3" and nq.price.tolist() == NQ_MIDS and nq.volume.tolist() == NQ_VOLUMES
    assert nq.timestamp.tolist() == [T0_MS + k * 1000 for k in NQ_TICKS]
    assert (data.rows, data.bad_rows, data.skipped_rows, data.report) == (23, 0, 15, [])
    for note in (MBO_NOTE, MID_EVENT, ONE_SIDED, UNCHANGED, UNKNOWN):
        assert f"{path}: {note}" in data.notes, data.notes
    assert data.formats[0].price == "price" and data.formats[0].ask is None and data.formats[0].volume == "size"
    fixed_note = f"{path}: price read as Databento's fixed-point prices, integers in units of 1e-9 (the first, 4108250000000"
    assert any(n.startswith(fixed_note) for n in data.notes) == fixed


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed-point", "pretty_px"])
def test_the_top_is_the_best_bid_and_ask_over_an_instruments_publishers(tmp_path: Path, fixed: bool) -> None:
    """As on DBEQ.BASIC: publisher 39 sends every order, publisher 40 only its top of book (flag F_TOB)."""
    goog = ("10", "GOOG")
    events = [
        (goog, "A", "B", "150.00", 100, 1, LAST),  # 39: a bid only: no mid
        (goog, "A", "A", "150.10", 200, 0, TOB | LAST),  # 40's ask: 150.00 (39) / 150.10 (40)
        (goog, "A", "A", "150.20", 100, 2, LAST),  # 39's ask, above 40's: top unchanged, no tick
        (goog, "A", "B", "150.04", 300, 0, TOB | LAST),  # 40's bid, above 39's: 150.04 / 150.10
        (goog, "A", "B", None, 0, 0, TOB | LAST),  # 40 has no bid any more: 150.00 (39) / 150.10
        (goog, "A", "A", "150.15", 200, 0, TOB | LAST),  # 40's ask replaced (150.10 gone): 150.00 / 150.15
        (goog, "R", "N", None, 0, 0, LAST),  # 39 cleared: no bid anywhere
    ]
    path = write(tmp_path, mbo_rows(events, fixed, [39, 40, 39, 40, 40, 40, 39]), "GOOG.mbo.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert m.price.tolist() == pytest.approx([(150.00 + 150.10) / 2, (150.04 + 150.10) / 2, (150.00 + 150.10) / 2,
                                              (150.00 + 150.15) / 2], abs=1e-9)
    assert m.timestamp.tolist() == [T0_MS + k * 1000 for k in (1, 3, 4, 5)]
    assert (data.bad_rows, data.skipped_rows) == (0, 3)


def test_an_mbo_row_that_cannot_be_read_is_a_bad_row_and_changes_no_book(tmp_path: Path) -> None:
    x = ("7", "X")
    events = [
        (x, "A", "B", "100.00", 1, 1, LAST),  # a bid only
        (x, "A", "N", "100.50", 1, 2, LAST),  # an order without a side (a bid at 100.50 would move the mid)
        (x, "Q", "A", "100.50", 1, 3, LAST),  # not an action
        (x, "A", "A", "100.50", 1, "abc", LAST),  # not an order id
        (x, "A", "A", "100.50", 1, 4, "2x"),  # not flags
        (x, "A", "A", None, 1, 5, LAST),  # an order without a price
        (x, "A", "A", "102.00", 1, 6, LAST),  # the only ask: 100.00 / 102.00
    ]
    path = write(tmp_path, mbo_rows(events, fixed=False), "X.csv")
    data = load_csv_files([path], max_bad_fraction=1.0)
    (m,) = data.markets
    assert m.price.tolist() == [101.0]
    assert data.report == [f"{path}:3: side 'N' is not B (bid) or A (ask), as the side of action A must be",
                           f"{path}:4: action 'Q' is not one of Databento's actions (A, C, M, R, T, F, N)",
                           f"{path}:5: order_id 'abc' is not an order id (a whole number)",
                           f"{path}:6: flags '2x' is not Databento's flags (a whole number 0-255)",
                           f"{path}:7: price is empty (an order needs a price)"]
    fixed = write(tmp_path, mbo_rows(events[:1] + events[5:], fixed=True), "Y.csv")
    data = load_csv_files([fixed], max_bad_fraction=1.0)
    assert data.markets[0].price.tolist() == [101.0]
    assert data.report == [f"{fixed}:3: price {UNDEF} is Databento's UNDEF_PRICE (the record has no price)"]


def test_an_order_of_size_0_is_no_bid_or_ask(tmp_path: Path) -> None:
    """A modify to size 0 takes the order out of the book; an add or modify to size 0 of an unknown order rests
    nothing: neither sets the top."""
    v = ("6", "V")
    events = [
        (v, "A", "B", "100.00", 5, 1, LAST),  # a bid only
        (v, "A", "A", "101.00", 5, 2, LAST),  # 100.00 / 101.00
        (v, "A", "B", "99.00", 5, 3, LAST),  # deeper: top unchanged, no tick
        (v, "M", "B", "100.00", 0, 1, LAST),  # the best bid modified to nothing: 99.00 / 101.00
        (v, "A", "B", "100.50", 0, 4, LAST),  # an add of nothing: top unchanged, no tick (100.50 / 101.00 would be one)
        (v, "M", "A", "100.75", 0, 5, LAST),  # a modify of nothing of an order not in the book: top unchanged
        (v, "M", "B", "99.50", 0, 3, LAST),  # moved and emptied: no bid left
    ]
    path = write(tmp_path, mbo_rows(events, fixed=False), "V.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert m.price.tolist() == [100.5, 100.0]
    assert (data.bad_rows, data.skipped_rows) == (0, 5)


def test_without_a_flags_column_each_row_is_an_event(tmp_path: Path) -> None:
    y = ("8", "Y")
    events = [(y, "A", "B", "10.00", 5, 1, 0), (y, "A", "A", "11.00", 5, 2, 0), (y, "T", "B", "11.00", 2, 0, 0),
              (y, "C", "A", "11.00", 5, 2, 0)]
    lines = [",".join(f for k, f in enumerate(line.split(",")) if k != 11) for line in mbo_rows(events, fixed=False)]
    path = write(tmp_path, lines, "Y.csv", HEAD.replace(",flags", ""))
    data = load_csv_files([path])
    (m,) = data.markets
    assert m.price.tolist() == [10.5, 10.5] and m.volume.tolist() == [0, 2]
    assert data.skipped_rows == 2  # the bid alone, then the ask cancelled
    assert any("after each row (no flags column: each row is an event)" in n for n in data.notes), data.notes


def test_a_file_that_starts_mid_session_ignores_what_it_cannot_know(tmp_path: Path) -> None:
    """No snapshot: cancels and fills of orders placed before the file began change nothing, and never go negative."""
    z = ("9", "Z")
    events = [(z, "C", "A", "50.25", 3, 41, LAST), (z, "A", "B", "50.00", 2, 1, LAST), (z, "F", "B", "50.00", 9, 42, 0),
              (z, "C", "B", "50.00", 9, 42, LAST), (z, "A", "A", "50.50", 1, 2, LAST), (z, "C", "B", "50.00", 5, 1, LAST),
              (z, "A", "B", "49.75", 1, 3, LAST)]
    path = write(tmp_path, mbo_rows(events, fixed=False), "Z.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert m.price.tolist() == [50.25, (49.75 + 50.50) / 2]  # the cancel of 5 of order 1's 2 removes it, no more
    assert f"{path}: 2 cancels (action C) of orders not in the book ignored: the book was incomplete at the start" \
           " (the file starts after those orders were placed, without a snapshot)" in data.notes
    assert data.skipped_rows == 5


def test_a_book_that_never_has_both_sides_gives_no_ticks_and_says_why(tmp_path: Path) -> None:
    w = ("3", "W")
    path = write(tmp_path, mbo_rows([(w, "A", "B", "1.5", 1, k, LAST) for k in range(3)], fixed=False), "W.csv")
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    assert str(err.value) == (f"no valid tick rows in {path}: of 3 rows 0 are bad and 3 skipped (3 because the book"
                              " lacks a side (no bid or no ask order after its event: before the first orders, after a"
                              " clear))")


SPREAD = ("9001", "ESZ3-ESH4")  # a calendar spread, as a parent-symbol download (ES.FUT) holds beside the outrights
NOT_POSITIVE = "the book's mid is not above 0 (a spread's prices can be; a tick needs a positive price)"


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed-point", "pretty_px"])
def test_a_spread_rests_orders_at_any_price_and_gives_ticks_only_at_a_positive_mid(tmp_path: Path, fixed: bool) -> None:
    events = [
        (ES, "A", "B", "4108.25", 5, 1, LAST),  # 0: ES has a bid only
        (SPREAD, "A", "B", "-45.50", 2, 2, LAST),  # 1: the spread has a bid only
        (SPREAD, "A", "A", "-45.25", 3, 3, LAST),  # 2: -45.50 / -45.25: mid -45.375, no tick
        (ES, "A", "A", "4108.75", 7, 4, LAST),  # 3: ES 4108.25 / 4108.75
        (SPREAD, "M", "A", "0.75", 3, 3, LAST),  # 4: -45.50 / 0.75: mid -22.375, no tick
        (SPREAD, "C", "B", "-45.50", 2, 2, LAST),  # 5: the cancel finds its order: no bid left
        (SPREAD, "A", "B", "0", 1, 5, LAST),  # 6: 0.00 / 0.75: mid 0.375, a tick
    ]
    path = write(tmp_path, mbo_rows(events, fixed), "ES.FUT.mbo.csv")
    data = load_csv_files([path])
    assert {m.market_id: (m.price.tolist(), m.timestamp.tolist()) for m in data.markets} == {
        "ESZ3": ([4108.5], [T0_MS + 3000]), "ESZ3-ESH4": ([0.375], [T0_MS + 6000])}
    assert (data.bad_rows, data.skipped_rows, data.report) == (0, 5, [])
    assert f"{path}: 2 rows skipped: {NOT_POSITIVE}" in data.notes, data.notes
    assert not any("of orders not in the book" in n for n in data.notes), data.notes


def test_fixed_point_prices_all_below_0_are_recognised_by_their_magnitude(tmp_path: Path) -> None:
    events = [(SPREAD, "A", "B", "-45.50", 2, 1, LAST), (SPREAD, "A", "A", "-45.25", 3, 2, LAST)]
    path = write(tmp_path, mbo_rows(events, fixed=True), "spread.csv")
    notes: list[str] = []
    cols = file_format(path, HEAD.split(","), ",", notes)
    assert cols.fixed_point
    assert (f"{path}: price read as Databento's fixed-point prices, integers in units of 1e-9 (the first, -45500000000,"
            f" is -45.5); {UNDEF} (UNDEF_PRICE) is no price") in notes
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    assert str(err.value) == (f"no valid tick rows in {path}: of 2 rows 0 are bad and 2 skipped (1 because the book"
                              " lacks a side (no bid or no ask order after its event: before the first orders, after a"
                              f" clear); 1 because {NOT_POSITIVE})")


def test_a_cancel_acts_on_its_orders_side_whatever_its_row_says(tmp_path: Path) -> None:
    """Databento may write a cancel's side as N: the order's own side, from the book, is the one it leaves."""
    u = ("4", "U")
    events = [
        (u, "A", "B", "100.00", 5, 1, LAST),  # a bid only
        (u, "A", "B", "99.00", 5, 2, LAST),  # deeper
        (u, "A", "A", "101.00", 5, 3, LAST),  # 100.00 / 101.00
        (u, "C", "N", "100.00", 5, 1, LAST),  # the best bid cancelled: 99.00 / 101.00
        (u, "C", "N", "98.00", 5, 77, LAST),  # an order never seen: ignored, counted
        (u, "C", "A", "99.00", 5, 2, LAST),  # the row says ask, the order is a bid: no bid left
    ]
    path = write(tmp_path, mbo_rows(events, fixed=False), "U.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert m.price.tolist() == [100.5, 100.0] and m.timestamp.tolist() == [T0_MS + 2000, T0_MS + 3000]
    assert (data.bad_rows, data.skipped_rows, data.report) == (0, 4, [])
    assert any(n.startswith(f"{path}: 1 cancel (action C) of orders not in the book ignored") for n in data.notes)


@pytest.mark.parametrize("split", [8, 10], ids=["between-events", "within-a-trade"])
def test_books_carry_from_one_file_to_the_next_of_a_load(tmp_path: Path, split: int) -> None:
    """A stream split into two files (a request split by size, consecutive daily files) reads as the one file does:
    the orders resting at the end of the first are the book of the second, and a trade's event may straddle them."""
    lines = mbo_rows(EVENTS, fixed=True)
    whole = load_csv_files([write(tmp_path, lines, "whole.csv")])
    first, second = write(tmp_path, lines[:split], "part1.csv"), write(tmp_path, lines[split:], "part2.csv")
    parts = load_csv_files([first, second])
    assert [(m.market_id, m.timestamp.tolist(), m.price.tolist(), m.volume.tolist()) for m in parts.markets] == [
        ("ESZ3", [T0_MS + k * 1000 for k in ES_TICKS], ES_MIDS, ES_VOLUMES),
        ("NQZ3", [T0_MS + k * 1000 for k in NQ_TICKS], NQ_MIDS, NQ_VOLUMES)]
    assert [(m.timestamp.tolist(), m.price.tolist(), m.volume.tolist()) for m in parts.markets] == [
        (m.timestamp.tolist(), m.price.tolist(), m.volume.tolist()) for m in whole.markets]
    # at either split: bid orders 2 (4108.00) and 5 (4107.75), ask orders 3 (4108.75, or 4108.50) and 4 (4109.00)
    carried = f"{second}: books carried over from the previous file: 4 orders resting"
    assert any(n.startswith(carried) for n in parts.notes), parts.notes
    assert not any(n.startswith(f"{first}: books carried") for n in parts.notes)
    assert f"{second}: {UNKNOWN}" in parts.notes and not any(n.startswith(f"{first}: 1 cancel") for n in parts.notes)


def test_a_book_side_keeps_its_best_and_its_memory_as_levels_come_and_go() -> None:
    bids = BookSide(bids=True)
    for price in (10.0, 12.0, 11.0, 12.0):
        bids.add(price)
    assert bids.best() == 12.0
    bids.remove(12.0)
    assert bids.best() == 12.0  # one order is left there
    bids.remove(12.0)
    assert bids.best() == 11.0
    for k in range(10_000):  # a level deep in the book placed and taken away, again and again
        bids.add(1.0 + k % 7)
        bids.remove(1.0 + k % 7)
    assert bids.best() == 11.0 and len(bids._heap) <= 2 * len(bids.levels) + 64 + 1
    bids.remove(11.0)
    bids.remove(10.0)
    assert bids.best() is None


def test_inspect_data_shows_an_mbo_file_read_at_its_book(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__DATA_DIR", str(tmp_path))
    path = write(tmp_path, mbo_rows(EVENTS, fixed=True))
    assert main(["inspect-data", path.name]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "  time 'ts_recv' (ns), price 'price', volume 'size', market 'symbol'"
    assert out[2] == "rows 23, bad 0, skipped 15, ticks 8 in 2 markets"
    assert f"  {path}: {MBO_NOTE}" in out and f"  {path}: {UNKNOWN}" in out
    assert main(["inspect-data", path.name, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["rows"], d["bad_rows"], d["skipped_rows"], d["ticks"]) == (23, 0, 15, 8)
    assert [(m["market_id"], m["ticks"]) for m in d["markets"]] == [("ESZ3", 7), ("NQZ3", 1)]


def random_walk_mbo(n: int, seed: int = 0) -> list[str]:
    """An mbo file of ``n`` events on one instrument: each moves the quote (cancel both orders, add two new, the last
    with F_LAST) a quarter up or down at random, every fourth with a trade of 1-5 before it."""
    rng = np.random.default_rng(seed)
    es = ES
    events: list[tuple[tuple[str, str], str, str, str | None, int, int | str, int | str]] = []
    mid, bid_id, ask_id = 4000.0, 0, 0
    for k in range(n):
        if k % 4 == 3:
            events.append((es, "T", "B", f"{mid + 0.125}", int(rng.integers(1, 6)), 0, 0))
        if bid_id:
            events += [(es, "C", "B", f"{mid - 0.125}", 10, bid_id, 0), (es, "C", "A", f"{mid + 0.125}", 10, ask_id, 0)]
        mid += 0.25 * (1 if rng.random() < 0.5 else -1)
        bid_id, ask_id = 2 * k + 1, 2 * k + 2
        events += [(es, "A", "B", f"{mid - 0.125}", 10, bid_id, 0), (es, "A", "A", f"{mid + 0.125}", 10, ask_id, LAST)]
    return mbo_rows(events, fixed=True)


def test_train_on_an_mbo_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, random_walk_mbo(3000))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\ndata_dir = "{tmp_path}"\n')
    assert main(["--config", str(cfg), "train", str(path), "--epochs", "1", "--json"]) == 0
    version = json.loads(capsys.readouterr().out)["model_version"]
    metrics = ModelStore(tmp_path / "state").metrics_of(version)
    assert metrics is not None
    data = metrics["data"]
    assert (data["ticks"], data["bad_rows"], data["markets"]) == (3000, 0, 1)
    assert data["skipped_rows"] == data["rows"] - 3000 and f"{path}: {MBO_NOTE}" in data["notes"]


def test_an_event_that_ends_in_a_bad_row_does_not_carry_its_trades_to_the_next(tmp_path: Path) -> None:
    x = ("7", "X")
    events = [
        (x, "A", "B", "100.00", 5, 1, LAST),
        (x, "A", "A", "101.00", 7, 2, LAST),  # 100.00 / 101.00: a tick
        (x, "T", "B", "101.00", 3, 0, 0),  # a trade of 3 ...
        (x, "C", "A", "101.00", 3, "zz", LAST),  # ... whose event ends in a bad row
        (x, "A", "A", "100.50", 1, 3, LAST),  # a new best ask: a tick with no trade
    ]
    data = load_csv_files([write(tmp_path, mbo_rows(events, fixed=False), "X.csv")], max_bad_fraction=1.0)
    (m,) = data.markets
    assert m.price.tolist() == [100.5, 100.25] and m.volume.tolist() == [0.0, 0.0]
    assert data.bad_rows == 1


def test_a_book_near_the_largest_float_has_a_finite_mid_and_trades_that_overflow_are_a_bad_row(tmp_path: Path) -> None:
    """Fuzzed: both sides at 1.7e308 added up to inf before they were halved, and two trades of 1e308 in one event to
    a volume of inf: a tick of a price or volume that is not finite, which training met as a traceback."""
    x = ("7", "X")
    events = [
        (x, "A", "B", "1.7e308", 5, 1, LAST),
        (x, "A", "A", "1.7e308", 7, 2, LAST),  # both sides near the largest float: a finite mid
        (x, "T", "B", "1.7e308", 1e308, 0, 0),
        (x, "T", "B", "1.7e308", 1e308, 0, LAST),  # the event's trades add up to more than any finite number
    ]
    data = load_csv_files([write(tmp_path, mbo_rows(events, fixed=False), "X.csv")], max_bad_fraction=1.0)
    (m,) = data.markets
    assert m.price.tolist() == [1.7e308] and m.volume.tolist() == [0.0]
    assert data.report == [f"{tmp_path / 'X.csv'}:5: size: the sizes of the event's trades (action T) add up to more"
                           " than any finite number: no volume is that large"]
