"""Vendor file shapes: a repeated DST hour in zone-named times, Date + Hour columns, blank or apostrophe digit groups
and currencies beside prices, vendors' time column names, Databento's fixed-point prices, Binance's headerless files,
a zone-named time skipped when the clocks go forward."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from training_helpers import utc_ms
from training_helpers import write_text_file as write

from cerebellar_norse.errors import DataError
from cerebellar_norse.training.data import load_csv_files

# --------------------------------------------------------------------------------------
# Interactive Brokers' zone-named times in the hour repeated when DST ends
# --------------------------------------------------------------------------------------

IB_WALL = ["00:30", "01:00", "01:30", "01:00", "01:30", "02:00"]  # 2024-11-03, US/Eastern: 01:00-01:59 twice
IB_UTC = [utc_ms(2024, 11, 3, 4, 30), utc_ms(2024, 11, 3, 5), utc_ms(2024, 11, 3, 5, 30), utc_ms(2024, 11, 3, 6),
          utc_ms(2024, 11, 3, 6, 30), utc_ms(2024, 11, 3, 7)]


def test_the_repeated_hour_of_a_named_zone_is_read_as_its_second_occurrence(tmp_path: Path) -> None:
    rows = [f"20241103 {w}:00 US/Eastern,{k + 1},1" for k, w in enumerate(IB_WALL)]
    path = write(tmp_path, "date,close,volume\n" + "\n".join(rows) + "\n", "SPY.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0 and data.report == []
    assert data.markets[0].timestamp.tolist() == IB_UTC
    assert data.markets[0].price.tolist() == [1, 2, 3, 4, 5, 6]
    assert any("2 rows in the hour that the time zone repeats when the clocks go back read as its second" in n
               for n in data.notes)


def test_the_repeated_hour_in_rows_that_run_newest_first(tmp_path: Path) -> None:
    rows = [f"20241103 {w}:00 US/Eastern,{k + 1},1" for k, w in enumerate(IB_WALL)][::-1]
    path = write(tmp_path, "date,close,volume\n" + "\n".join(rows) + "\n", "SPY.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0 and data.formats[0].newest_first
    assert data.markets[0].timestamp.tolist() == IB_UTC


def test_the_repeated_hour_is_kept_per_market_and_only_for_zone_names(tmp_path: Path) -> None:
    # market B's 01:10 after its 01:50 is its second run, market A's rows stay in the first run
    rows = ["20241103 01:20:00 US/Eastern,A,1", "20241103 01:50:00 US/Eastern,B,1", "20241103 01:30:00 US/Eastern,A,2",
            "20241103 01:10:00 US/Eastern,B,2"]
    path = write(tmp_path, "date,symbol,close\n" + "\n".join(rows) + "\n")
    data = load_csv_files([path])
    a, b = data.markets
    assert a.timestamp.tolist() == [utc_ms(2024, 11, 3, 5, 20), utc_ms(2024, 11, 3, 5, 30)]
    assert b.timestamp.tolist() == [utc_ms(2024, 11, 3, 5, 50), utc_ms(2024, 11, 3, 6, 10)]
    # a time going back by more than the repeat, or without a zone name, is still a bad row
    rows = ["20241103 01:50:00 US/Eastern,1", "20241103 00:40:00 US/Eastern,2", "20241103 02:00:00 US/Eastern,3"]
    path = write(tmp_path, "date,close\n" + "\n".join(rows) + "\n", "far.csv")
    assert load_csv_files([path], max_bad_fraction=0.5).report == [
        f"{path}:3: time goes backwards for market 'far' (2024-11-03T04:40:00Z < 2024-11-03T05:50:00Z;"
        f" ms {utc_ms(2024, 11, 3, 4, 40)} < {utc_ms(2024, 11, 3, 5, 50)})"]
    path = write(tmp_path, "date,close\n2024-11-03 01:50:00,1\n2024-11-03 01:10:00,2\n2024-11-03 02:00:00,3\n", "utc.csv")
    assert load_csv_files([path], max_bad_fraction=0.5).bad_rows == 1


# --------------------------------------------------------------------------------------
# Date + Hour (electricity prices)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "hours", "kind"), [
    ("Hour", (1, 2, 24), "hours ending 1..24"),
    ("Hour", (0, 1, 23), "hours beginning 0..23"),
    ("Hour Ending", ("01:00", "02:00", "24:00"), "hours ending 1..24"),  # ERCOT
    ("HE", (1, 2, 24), "hours ending 1..24"),
])
def test_an_hour_column_beside_dates_is_the_time_of_day(tmp_path: Path, name: str, hours: tuple, kind: str) -> None:
    rows = [f"{day},{h},{50 + k}" for day in ("2024-01-02", "2024-01-03") for k, h in enumerate(hours)]
    path = write(tmp_path, f"Date,{name},Price\n" + "\n".join(rows) + "\n", "DA.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0
    assert data.markets[0].timestamp.tolist() == [utc_ms(2024, 1, d, h) for d in (2, 3) for h in (0, 1, 23)]
    assert f"{path}: time from the Date and {name} columns: {name} read as {kind}" in " ".join(data.notes)
    assert data.formats[0].time == f"Date + {name}"


def test_an_hour_column_that_does_not_tell_or_holds_no_hours_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "Date,Hour,Price\n2024-01-02,1,50\n2024-01-02,2,51\n", "amb.csv")
    with pytest.raises(DataError, match=re.escape("Hour holds neither 0 nor 24, so its hours could be hours ending"
                                                  " (1..24) or hours beginning (0..23); name the column 'Hour Ending'"
                                                  " or 'Hour Beginning'")):
        load_csv_files([path])
    path = write(tmp_path, "Date,Hour,Price\n2024-01-02,00 - 01,50\n2024-01-02,01 - 02,51\n", "np.csv")
    with pytest.raises(DataError, match="Hour '00 - 01' beside Date '2024-01-02' is not an hour"):
        load_csv_files([path])
    path = write(tmp_path, "Date,Hour Ending,Price\n2024-01-02,1,50\n2024-01-02,25,51\n2024-01-02,2,51\n", "he.csv")
    assert load_csv_files([path], max_bad_fraction=0.5).report == [f"{path}:3: Hour Ending '25' is not an hour ending 1..24"]
    # beside date-times the hour column is not needed, and ignored
    path = write(tmp_path, "Date,Hour,Price\n2024-01-02 00:00,x,50\n2024-01-02 01:00,y,51\n", "dt.csv")
    assert load_csv_files([path]).markets[0].timestamp.tolist() == [utc_ms(2024, 1, 2, 0), utc_ms(2024, 1, 2, 1)]


# --------------------------------------------------------------------------------------
# Digit groups of blanks or apostrophes, currencies after prices
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sep", "field", "value"), [
    (";", "43 000,00", 43000.0),
    (";", "43\u00a0100,50", 43100.5),  # a no-break space, as spreadsheets with a French locale write it
    (";", "43\u202f100,50", 43100.5),  # a narrow no-break space
    (",", '"43 000,00"', 43000.0),
    (",", "1'234.5", 1234.5),  # Swiss
    (",", "1’234’567.25", 1234567.25),
    (",", "1.50 EUR", 1.5),
    (",", "EUR 1.50", 1.5),
    (",", "1.50€", 1.5),
    (";", "1,50 €", 1.5),
    (",", "CHF 1'234.50", 1234.5),
    (",", '"1,234.50 USD"', 1234.5),
])
def test_blank_or_apostrophe_digit_groups_and_currencies_after_prices(tmp_path: Path, sep: str, field: str,
                                                                     value: float) -> None:
    path = write(tmp_path, sep.join(["date", "close", "volume"]) + "\n" + sep.join(["2024-01-02", field, "1 000"]) + "\n")
    data = load_csv_files([path])
    assert data.bad_rows == 0 and data.markets[0].price.tolist() == [value]
    assert data.markets[0].volume.tolist() == [1000.0]


@pytest.mark.parametrize(("field", "reason"), [
    ("1 2345", "close '1 2345' is not a number (a blank or an apostrophe is read only between groups of three digits,"
               " the same one throughout, as in 43 000,00 or 1'234.5)"),
    ("1'234 567", "close \"1'234 567\" is not a number (a blank or an apostrophe is read only between groups of three"
                  " digits, the same one throughout, as in 43 000,00 or 1'234.5)"),
    ("1.50 euro", "close '1.50 euro' is not a number (beside a price only a currency sign, $, €, £ or ¥, or a"
                  " three-letter code in capitals apart from the number, as in 1.50 EUR, is read)"),
    ('"1,50 €"', "close '1,50 €' is not a number (a comma is read only between groups of three digits, as in 1,234.5:"
                 " write decimals with a point)"),
])
def test_numbers_that_stay_unread_say_what_to_change(tmp_path: Path, field: str, reason: str) -> None:
    path = write(tmp_path, f"date,close\n2024-01-02,{field}\n2024-01-03,1.5\n")
    assert load_csv_files([path], max_bad_fraction=0.5).report == [f"{path}:2: {reason}"]


def test_a_currency_beside_a_volume_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "date,close,volume\n2024-01-02,1.5,$100\n2024-01-03,1.5,100\n")
    assert load_csv_files([path], max_bad_fraction=0.5).report == [
        f"{path}:2: volume '$100' is not a number (a volume is a number of units, without a currency)"]


# --------------------------------------------------------------------------------------
# Vendors' time column names
# --------------------------------------------------------------------------------------


def test_a_databento_file_is_read_at_ts_recv_in_ns(tmp_path: Path) -> None:
    """Databento's CSV: ts_recv (by which its records are sorted) before ts_event; both ns since the epoch."""
    ns = 1_704_186_000_000_000_000
    path = write(tmp_path, "ts_recv,ts_event,rtype,publisher_id,instrument_id,action,side,depth,price,size,symbol\n"
                           f"{ns + 500},{ns},0,1,1,T,N,0,4750.25,1,ESH4\n{ns + 1_000_000_500},{ns + 2},0,1,1,T,N,0,4750.5,2,ESH4\n")
    data = load_csv_files([path])
    assert data.formats[0].time == "ts_recv" and data.formats[0].time_unit == "ns"
    assert data.markets[0].market_id == "ESH4" and data.markets[0].timestamp.tolist() == [ns // 10**6, ns // 10**6 + 1000]


@pytest.mark.parametrize("name", ["ts_event", "sip_timestamp", "participant_timestamp", "time_exchange", "ts", "t"])
def test_more_vendor_time_names(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, f"{name},price\n2024-01-02T09:30:00.123456789Z,1\n2024-01-02T09:31:00Z,2\n", "v.csv")
    data = load_csv_files([path])
    assert data.markets[0].timestamp.tolist() == [utc_ms(2024, 1, 2, 9, 30) + 123, utc_ms(2024, 1, 2, 9, 31)]


# --------------------------------------------------------------------------------------
# Databento without pretty_px: fixed-point prices (units of 1e-9) and UNDEF_PRICE
# --------------------------------------------------------------------------------------

DBN_NS = 1_701_302_400_000_000_000  # 2023-11-30 00:00 UTC
DBN_UNDEF = "9223372036854775807"


@pytest.mark.parametrize(("header", "row"), [
    ("ts_recv,ts_event,rtype,publisher_id,instrument_id,action,side,depth,price,size,flags,ts_in_delta,sequence,symbol",
     "{t},{t},0,1,5482,T,A,0,{px},{sz},0,18765,1000,ESZ3"),  # trades
    ("ts_event,rtype,publisher_id,instrument_id,open,high,low,close,volume,symbol",
     "{t},33,1,5482,4100000000000,4200000000000,4000000000000,{px},{sz},ESZ3"),  # ohlcv-1m
    ("ts_recv,ts_event,rtype,publisher_id,instrument_id,action,side,depth,price,size,flags,ts_in_delta,sequence,"
     "bid_px_00,ask_px_00,bid_sz_00,ask_sz_00,bid_ct_00,ask_ct_00,symbol",
     "{t},{t},1,1,5482,T,B,0,{px},{sz},0,9000,5000,4108250000000,4108750000000,7,9,1,2,ESZ3"),  # tbbo
])
def test_databento_fixed_point_prices_are_scaled(tmp_path: Path, header: str, row: str) -> None:
    prices = ["4108500000000", "4108750000000", "189510000000"]
    rows = [row.format(t=DBN_NS + k * 60_000_000_000, px=px, sz=k + 1) for k, px in enumerate(prices)]
    path = write(tmp_path, header + "\n" + "\n".join(rows) + "\n", "dbn.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert m.market_id == "ESZ3" and m.price.tolist() == [4108.5, 4108.75, 189.51] and m.volume.tolist() == [1, 2, 3]
    assert m.timestamp.tolist() == [DBN_NS // 10**6 + k * 60_000 for k in range(3)]
    assert any("read as Databento's fixed-point prices, integers in units of 1e-9 (the first, 4108500000000, is"
               " 4108.5)" in n for n in data.notes), data.notes


def test_databento_pretty_px_prices_stay_as_written(tmp_path: Path) -> None:
    path = write(tmp_path, "ts_event,rtype,publisher_id,instrument_id,open,high,low,close,volume,symbol\n"
                           f"{DBN_NS},33,1,5482,4100.000000000,4200.0,4000.0,4108.500000000,3,ESZ3\n"
                           f"{DBN_NS + 60_000_000_000},33,1,5482,4100.0,4200.0,4000.0,,4,ESZ3\n")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.markets[0].price.tolist() == [4108.5] and not any("fixed-point" in n for n in data.notes)


def test_a_databento_file_resaved_with_whole_prices_is_not_fixed_point(tmp_path: Path) -> None:
    """A tool that writes 4108.0 as 4108 (R, JavaScript, spreadsheets) leaves integers under a Databento header: prices
    of 1e-9 units are never that small (0.001 is 1000000), so these are read as written."""
    path = write(tmp_path, "ts_event,rtype,publisher_id,instrument_id,open,high,low,close,volume,symbol\n"
                           f"{DBN_NS},33,1,5482,4100,4200,4000,4108,3,ESZ3\n"
                           f"{DBN_NS + 60_000_000_000},33,1,5482,4100,4200,4000,4109,4,ESZ3\n")
    data = load_csv_files([path])
    assert data.markets[0].price.tolist() == [4108.0, 4109.0] and not any("fixed-point" in n for n in data.notes)


def test_databento_undef_price_is_no_price(tmp_path: Path) -> None:
    path = write(tmp_path, "ts_recv,ts_event,rtype,publisher_id,instrument_id,action,side,depth,price,size,symbol\n"
                           f"{DBN_NS},{DBN_NS},0,1,5482,T,A,0,4108500000000,1,ESZ3\n"
                           f"{DBN_NS + 1000},{DBN_NS},0,1,5482,T,A,0,{DBN_UNDEF},1,ESZ3\n"
                           f"{DBN_NS + 2000},{DBN_NS},0,1,5482,T,A,0,4108.5,1,ESZ3\n"
                           f"{DBN_NS + 3000},{DBN_NS},0,1,5482,T,A,0,4108750000000,1,ESZ3\n")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.markets[0].price.tolist() == [4108.5, 4108.75]
    assert data.report == [
        f"{path}:3: price {DBN_UNDEF} is Databento's UNDEF_PRICE (the record has no price)",
        f"{path}:4: price '4108.5' is not a Databento fixed-point price (an integer in units of 1e-9, as the file's"
        " first prices are)"]


def test_databento_quotes_without_a_trade_price_are_read_at_their_mid(tmp_path: Path) -> None:
    """bbo-1s before any trade: price is UNDEF_PRICE, the mid of bid_px_00 and ask_px_00 stands in; an undefined
    side keeps its previous value, as an empty one does."""
    head = "ts_recv,ts_event,rtype,publisher_id,instrument_id,side,price,size,flags,sequence,bid_px_00,ask_px_00,"
    head += "bid_sz_00,ask_sz_00,bid_ct_00,ask_ct_00\n"
    rows = [f"{DBN_NS + k * 10**9},{DBN_NS},195,1,5482,N,{DBN_UNDEF},0,0,{k},{bid},{ask},5,7,1,1\n" for k, (bid, ask) in
            enumerate([(DBN_UNDEF, "4108500000000"), ("4108000000000", "4108500000000"), (DBN_UNDEF, "4109000000000")])]
    path = write(tmp_path, head + "".join(rows), "bbo.csv")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.report == [f"{path}:2: bid_px_00 is Databento's UNDEF_PRICE and market '5482' has no earlier bid_px_00 to keep"]
    assert data.markets[0].price.tolist() == [4108.25, 4108.5] and data.markets[0].volume.tolist() == [0, 0]  # size
    assert any("price is empty or Databento's UNDEF_PRICE; price is the mid of 'bid_px_00' and 'ask_px_00'" in n
               for n in data.notes), data.notes


def test_databento_without_symbols_is_one_market_per_instrument(tmp_path: Path) -> None:
    path = write(tmp_path, "ts_recv,ts_event,rtype,publisher_id,instrument_id,action,side,depth,price,size\n"
                           f"{DBN_NS},{DBN_NS},0,1,5482,T,A,0,4108500000000,1\n"
                           f"{DBN_NS + 1000},{DBN_NS},0,1,17077,T,A,0,50250000000,1\n"
                           f"{DBN_NS + 2000},{DBN_NS},0,1,5482,T,A,0,4108750000000,1\n")
    data = load_csv_files([path])
    assert {m.market_id: m.price.tolist() for m in data.markets} == {"17077": [50.25], "5482": [4108.5, 4108.75]}


# --------------------------------------------------------------------------------------
# Databento order books (mbp-1, mbp-10): the top-of-book mid after each event, trades' sizes as volume
# --------------------------------------------------------------------------------------

MBP_HEAD = ("ts_recv,ts_event,rtype,publisher_id,instrument_id,action,side,depth,price,size,flags,ts_in_delta,sequence,"
            "bid_px_00,ask_px_00,bid_sz_00,ask_sz_00,bid_ct_00,ask_ct_00")
# action, side, the event's price and size, then the top of book after it (None: that side has no order)
MBP_EVENTS = [
    ("R", "N", None, 0, None, None),  # the book cleared before the open
    ("A", "B", "4108.25", 5, "4108.25", None),  # a bid, no ask yet: no mid
    ("A", "A", "4108.75", 7, "4108.25", "4108.75"),
    ("A", "B", "4107.00", 9, "4108.25", "4108.75"),  # a bid below the best (depth 1): the top is unchanged, no tick
    ("T", "A", "4108.25", 3, "4108.25", "4108.75"),  # a trade: a tick, though the top is unchanged
    ("C", "B", "4108.25", 2, "4108.00", "4108.75"),
    ("M", "A", "4108.50", 4, "4108.00", "4108.50"),
    ("F", "A", "4108.00", 6, "4107.75", "4108.50"),
    ("R", "N", None, 0, None, None),  # cleared again: no book, no mid
]
MBP_MIDS = [4108.5, 4108.5, 4108.375, 4108.25, 4108.125]
MBP_VOLUMES = [0.0, 3.0, 0.0, 0.0, 6.0]
MBP_NOTE = ("Databento order-book events (action A, C, M, R): price is the mid of bid_px_00 and ask_px_00 after each"
            " event, volume the size of trades (T, F) only; a row whose book lacks a side is skipped")
MBP_SKIPPED = ("3 rows skipped: the book lacks a side (bid_px_00 or ask_px_00 empty or UNDEF_PRICE: before the open,"
               " after a clear)")
MBP_UNCHANGED = "1 row skipped: the best bid and ask prices did not change and nothing traded"


def databento_px(text: str | None, fixed: bool) -> str:
    """A price as Databento writes it: fixed point (units of 1e-9, UNDEF_PRICE for none) or pretty_px (empty)."""
    if text is None:
        return DBN_UNDEF if fixed else ""
    return str(round(float(text) * 10**9)) if fixed else f"{float(text):.9f}"


def mbp_file(tmp_path: Path, fixed: bool, levels: int = 1, name: str = "mbp.csv") -> Path:
    """An order-book file of MBP_EVENTS: mbp-1, or mbp-10 with ``levels`` 10 (deeper levels 0.25 apart)."""
    head = MBP_HEAD + "".join(f",bid_px_{k:02d},ask_px_{k:02d},bid_sz_{k:02d},ask_sz_{k:02d},bid_ct_{k:02d},ask_ct_{k:02d}"
                              for k in range(1, levels))
    lines = [head + ",symbol"]
    for k, (action, side, price, size, bid, ask) in enumerate(MBP_EVENTS):
        t = DBN_NS + k * 10**9
        book = [databento_px(bid, fixed), databento_px(ask, fixed), "5", "7", "1", "1"]
        for level in range(1, levels):
            deeper = [None if px is None else str(float(px) + sign * 0.25 * level) for px, sign in ((bid, -1), (ask, 1))]
            book += [databento_px(deeper[0], fixed), databento_px(deeper[1], fixed), "50", "70", "2", "2"]
        lines.append(",".join([str(t), str(t), "1" if levels == 1 else "10", "1", "5482", action, side, "0",
                               databento_px(price, fixed), str(size), "128", "9000", str(k), *book, "ESZ3"]))
    return write(tmp_path, "\n".join(lines) + "\n", name)


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed-point", "pretty_px"])
@pytest.mark.parametrize("levels", [1, 10], ids=["mbp-1", "mbp-10"])
def test_a_databento_order_book_is_read_at_its_top_of_book_mid(tmp_path: Path, fixed: bool, levels: int) -> None:
    path = mbp_file(tmp_path, fixed, levels)
    data = load_csv_files([path])
    (m,) = data.markets
    assert m.market_id == "ESZ3" and m.price.tolist() == MBP_MIDS and m.volume.tolist() == MBP_VOLUMES
    assert m.timestamp.tolist() == [DBN_NS // 10**6 + k * 1000 for k in (2, 4, 5, 6, 7)]
    assert (data.rows, data.bad_rows, data.skipped_rows, data.report) == (9, 0, 4, [])
    for note in (MBP_NOTE, MBP_SKIPPED, MBP_UNCHANGED):
        assert f"{path}: {note}" in data.notes, data.notes
    assert data.formats[0].price == "bid_px_00" and data.formats[0].ask == "ask_px_00"
    assert any("bid_px_00 and ask_px_00 read as Databento's fixed-point prices" in n for n in data.notes) == fixed


def test_a_book_that_never_has_both_sides_gives_no_ticks_and_says_why(tmp_path: Path) -> None:
    path = write(tmp_path, MBP_HEAD + "\n" + "".join(
        f"{DBN_NS + k},{DBN_NS},1,1,5482,A,B,0,4108.25,1,128,0,{k},4108.25,,5,0,1,0\n" for k in range(3)), "bids.csv")
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    assert str(err.value) == (f"no valid tick rows in {path}: of 3 rows 0 are bad and 3 skipped (3 because the book"
                              " lacks a side (bid_px_00 or ask_px_00 empty or UNDEF_PRICE: before the open, after a"
                              " clear))")


def test_quotes_and_a_book_near_the_largest_float_have_a_finite_mid(tmp_path: Path) -> None:
    """Fuzzed: a bid and an ask of 1.7e308 (finite, each accepted) added up to inf before they were halved: a tick
    whose price is not finite, which training met as a traceback. Their volumes that overflow so are a bad row."""
    quotes = write(tmp_path, "time,bid,ask,bid_size,ask_size\n2024-01-02T00:00:00Z,1.7e308,1.7e308,1,2\n"
                             "2024-01-02T00:00:01Z,1,2,1e308,1.7e308\n", "Q.csv")
    data = load_csv_files([quotes], max_bad_fraction=1.0)
    assert data.markets[0].price.tolist() == [1.7e308] and data.markets[0].volume.tolist() == [3.0]
    assert data.report == [f"{quotes}:3: bid_size + ask_size is not finite (each side is, their sum is not): no volume"
                           " is that large"]
    book = write(tmp_path, MBP_HEAD + "\n" + "".join(
        f"{DBN_NS + k},{DBN_NS + k},1,1,5482,A,B,0,{bid},1,128,0,{k},{bid},{ask},5,7,1,1\n"
        for k, (bid, ask) in enumerate([("1.7e308", "1.7e308"), ("1", "1.7e308")])), "book.csv")
    assert load_csv_files([book]).markets[0].price.tolist() == [1.7e308, 8.5e307]


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed-point", "pretty_px"])
def test_a_spread_in_an_order_book_is_read_only_where_its_mid_is_above_0(tmp_path: Path, fixed: bool) -> None:
    """A parent-symbol download (ES.FUT) holds calendar spreads, whose prices are often 0 or below: no bad rows."""
    tops = [("5482", "4108.25", "4108.75"),  # ES: a tick at 4108.50
            ("9001", "-45.50", "-45.25"),  # the spread: mid -45.375, no tick
            ("9001", "-0.25", "0.75"),  # mid 0.25: a tick
            ("9001", "-0.25", "0")]  # mid -0.125, no tick
    rows = [f"{DBN_NS + k * 10**9},{DBN_NS},1,1,{instrument},A,B,0,{databento_px(bid, fixed)},1,128,0,{k},"
            f"{databento_px(bid, fixed)},{databento_px(ask, fixed)},1,1,1,1" for k, (instrument, bid, ask) in enumerate(tops)]
    path = write(tmp_path, MBP_HEAD + "\n" + "\n".join(rows) + "\n", "ES.FUT-mbp-1.csv")
    data = load_csv_files([path])
    assert {m.market_id: m.price.tolist() for m in data.markets} == {"5482": [4108.5], "9001": [0.25]}
    assert (data.bad_rows, data.skipped_rows, data.report) == (0, 2, [])
    assert (f"{path}: 2 rows skipped: the book's mid is not above 0 (a spread's prices can be; a tick needs a positive"
            " price)") in data.notes, data.notes


def test_a_databento_trade_still_needs_a_price_above_0(tmp_path: Path) -> None:
    """Trades files keep refusing a price of 0 or below, read as fixed point though all their prices are below 0."""
    path = write(tmp_path, "ts_recv,ts_event,rtype,publisher_id,instrument_id,action,side,depth,price,size,symbol\n"
                           f"{DBN_NS},{DBN_NS},0,1,9001,T,A,0,-45500000000,1,ESZ3-ESH4\n")
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    assert str(err.value) == f"no valid tick rows in {path}: all 1 rows are bad:\n{path}:2: price -45.5 is not > 0"


def test_an_order_books_previous_top_carries_from_one_file_to_the_next(tmp_path: Path) -> None:
    """The first row of a second file is compared with the last of the first, as in the one file they were split
    from: row 3 (a deeper bid) moves nothing and is no tick."""
    lines = mbp_file(tmp_path, fixed=True).read_text().splitlines()
    first = write(tmp_path, "\n".join(lines[:4]) + "\n", "part1.csv")  # header and rows 0-2
    second = write(tmp_path, "\n".join([lines[0], *lines[4:]]) + "\n", "part2.csv")
    data = load_csv_files([first, second])
    (m,) = data.markets
    assert m.price.tolist() == MBP_MIDS and m.volume.tolist() == MBP_VOLUMES
    assert f"{second}: {MBP_UNCHANGED}" in data.notes, data.notes


def test_databento_tbbo_stays_read_at_its_trades(tmp_path: Path) -> None:
    """tbbo: every action is a trade, each with the book before it; read at the trade's price and size, as before."""
    rows = [f"{DBN_NS + k * 10**9},{DBN_NS},1,1,5482,T,{side},0,{px},{sz},0,0,{k},4108.25,4108.75,5,7,1,1"
            for k, (side, px, sz) in enumerate([("A", "4108.25", 3), ("B", "4108.75", 2), ("N", "4108.5", 4)])]
    path = write(tmp_path, MBP_HEAD + "\n" + "\n".join(rows) + "\n", "tbbo.csv")
    data = load_csv_files([path])
    assert data.markets[0].price.tolist() == [4108.25, 4108.75, 4108.5] and data.markets[0].volume.tolist() == [3, 2, 4]
    assert data.formats[0].price == "price" and not any("order-book" in n for n in data.notes), data.notes


@pytest.mark.parametrize("head", [MBP_HEAD.replace("rtype,publisher_id,", "kind,venue,"),  # another vendor's
                                  MBP_HEAD.replace("bid_px_00,ask_px_00", "bid_px,ask_px")])  # no top of book, no order_id
def test_an_action_column_alone_does_not_make_an_order_book(tmp_path: Path, head: str) -> None:
    rows = [f"{DBN_NS + k * 10**9},{DBN_NS},1,1,5482,{a},B,0,{px},{sz},0,0,{k},4108.25,4108.75,5,7,1,1"
            for k, (a, px, sz) in enumerate([("A", "4108.25", 5), ("C", "4108.0", 2), ("T", "4108.5", 1)])]
    path = write(tmp_path, head + "\n" + "\n".join(rows) + "\n", "events.csv")
    data = load_csv_files([path])
    assert data.markets[0].price.tolist() == [4108.25, 4108.0, 4108.5] and data.markets[0].volume.tolist() == [5, 2, 1]
    assert not any("order-book" in n for n in data.notes), data.notes


# --------------------------------------------------------------------------------------
# Binance public data (data.binance.vision): headerless klines, aggTrades, trades
# --------------------------------------------------------------------------------------

BN_MS = 1_704_067_200_000  # 2024-01-01 00:00 UTC


def kline(open_ms: int, close: str, volume: str, us: bool = False) -> str:
    k = 1000 if us else 1
    return (f"{open_ms * k},42283.58000000,42300.00000000,42270.00000000,{close},{volume},{(open_ms + 60_000) * k - 1},"
            "1000.0,12,0.5,500.0,0")


@pytest.mark.parametrize(("name", "lines", "unit"), [
    ("BTCUSDT-1m-2024-01-01.csv", [kline(BN_MS + k * 60_000, c, v) for k, (c, v) in
                                   enumerate([("42290.10000000", "1.5"), ("42295.00000000", "2.25")])], "ms"),
    ("BTCUSDT-1m-2025-01-01.csv", [kline(BN_MS + k * 60_000, c, v, us=True) for k, (c, v) in
                                   enumerate([("42290.10000000", "1.5"), ("42295.00000000", "2.25")])], "µs"),
    ("BTCUSDT-aggTrades-2024-01-01.csv", [f"2500000000,42290.10000000,1.50000000,3300000000,3300000001,{BN_MS},True,True",
                                          f"2500000001,42295.00000000,2.25000000,3300000002,3300000002,{BN_MS + 60_000},"
                                          "False,True"], "ms"),
    ("BTCUSDT-aggTrades-2024-01.csv", [f"2500000000,42290.1,1.5,3300000000,3300000001,{BN_MS},true",
                                       f"2500000001,42295.0,2.25,3300000002,3300000002,{BN_MS + 60_000},false"], "ms"),
    ("BTCUSDT-trades-2024-01-01.csv", [f"3300000000,42290.10000000,1.50000000,63435.15000000,{BN_MS},True,True",
                                       f"3300000001,42295.00000000,2.25000000,95163.75000000,{BN_MS + 60_000},False,True"],
     "ms"),
    ("BTCUSDT-trades-2025-01-01.csv", [f"3300000000,42290.1,1.5,63435.15,{BN_MS * 1000},true",
                                       f"3300000001,42295.0,2.25,95163.75,{(BN_MS + 60_000) * 1000},false"], "µs"),
])
def test_headerless_binance_files_are_read_by_their_layout(tmp_path: Path, name: str, lines: list[str], unit: str) -> None:
    path = write(tmp_path, "\n".join(lines) + "\n", name)
    data = load_csv_files([path])
    (m,) = data.markets
    assert data.rows == 2 and data.bad_rows == 0
    assert m.market_id == "-".join(name.split("-")[:2]) and m.timestamp.tolist() == [BN_MS, BN_MS + 60_000]
    assert m.price.tolist() == [42290.1, 42295.0] and m.volume.tolist() == [1.5, 2.25]
    layout = name.split("-")[1].replace("1m", "klines")
    assert any(f"{path}: no header line; read as Binance's {layout} file (" in n for n in data.notes), data.notes
    assert data.formats[0].header_lines == 0 and data.formats[0].time_unit == unit


def test_binance_daily_files_continue_one_market(tmp_path: Path) -> None:
    a = write(tmp_path, kline(BN_MS, "42290.1", "1") + "\n", "ETHUSDT-1m-2024-01-01.csv")
    b = write(tmp_path, kline(BN_MS + 86_400_000, "42295.0", "2") + "\n", "ETHUSDT-1m-2024-01-02.csv")
    data = load_csv_files([a, b])
    assert [(m.market_id, len(m)) for m in data.markets] == [("ETHUSDT-1m", 2)]


def test_binance_futures_files_with_a_header(tmp_path: Path) -> None:
    """The futures files have a header; an aggregate trade's volume is its quantity."""
    path = write(tmp_path, "agg_trade_id,price,quantity,first_trade_id,last_trade_id,transact_time,is_buyer_maker\n"
                           f"1,42290.1,1.5,10,11,{BN_MS},true\n2,42295.0,2.25,12,12,{BN_MS + 1},false\n",
                 "BTCUSDT-aggTrades-2024-01-01.csv")
    data = load_csv_files([path])
    assert data.markets[0].market_id == "BTCUSDT-aggTrades" and data.markets[0].volume.tolist() == [1.5, 2.25]


@pytest.mark.parametrize("lines", [
    # Kraken's OHLCVT layout (read as such, tests/training/test_csv_platform_exports.py) but with times in ms
    [f"{BN_MS + k * 60_000},42000.0,42003.0,41986.5,{42000 + k},0.5,7" for k in range(3)],
    [kline(BN_MS, "1", "1").replace(str(BN_MS + 59_999), str(BN_MS + 59_000)), kline(BN_MS + 60_000, "1", "1")],
    [f"2500000001,42290.1,1.5,3300000000,3300000001,{BN_MS},True,True",  # aggregate trade ids not increasing
     f"2500000000,42295.0,2.25,3300000002,3300000002,{BN_MS + 1},False,True"],
    [f"3300000000,42290.1,1.5,999.0,{BN_MS},True,True"],  # quote_qty is not price x qty
])
def test_other_headerless_files_are_still_told_to_add_a_header(tmp_path: Path, lines: list[str]) -> None:
    path = write(tmp_path, "\n".join(lines) + "\n", "BTCUSDT-1m-2024-01-01.csv")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert str(exc.value).endswith("(the first line looks like data: add a header line naming the columns)")


def test_a_first_line_of_times_and_prices_is_told_to_be_data(tmp_path: Path) -> None:
    """Headerless ticks of no known layout: a time, bid and ask (TrueFX's, with the pair first, are read as theirs)."""
    path = write(tmp_path, "20230102 00:00:00.123,1.06950,1.06970\n20230102 00:00:01.456,1.06951,1.06971\n")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert str(exc.value).endswith("(the first line looks like data: add a header line naming the columns)")


# --------------------------------------------------------------------------------------
# A zone-named time that the zone skips when the clocks go forward
# --------------------------------------------------------------------------------------


def test_a_time_skipped_when_the_clocks_go_forward_is_a_bad_row(tmp_path: Path) -> None:
    wall = ["01:00", "01:30", "02:30", "03:00", "03:30"]  # 2024-03-10, US/Eastern: 02:00-02:59 does not exist
    rows = [f"20240310 {w}:00 US/Eastern,{k + 1},1" for k, w in enumerate(wall)]
    path = write(tmp_path, "date,close,volume\n" + "\n".join(rows) + "\n", "SPY.csv")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.report == [f"{path}:4: date '20240310 02:30:00 US/Eastern' does not exist in US/Eastern: the clocks go"
                           " forward by 1:00:00 over it (when daylight saving time starts)"]
    assert data.markets[0].timestamp.tolist() == [utc_ms(2024, 3, 10, 6), utc_ms(2024, 3, 10, 6, 30),
                                                  utc_ms(2024, 3, 10, 7), utc_ms(2024, 3, 10, 7, 30)]


def test_an_order_books_top_is_the_best_over_its_publishers(tmp_path: Path) -> None:
    """Each publisher's row carries that venue's top: read row by row, two venues alternating made every row a tick
    bouncing between their mids, though neither venue's top moved (an mbo file of the same book gives two ticks)."""
    venue_tops = {1: ("100.00", "101.00"), 2: ("100.50", "101.50")}
    rows = []
    for k in range(10):  # every event is deeper in its venue's book
        pub = 1 + k % 2
        bid, ask = venue_tops[pub]
        rows.append(f"{DBN_NS + k * 10**9},{DBN_NS},1,{pub},5482,A,B,1,99.000000000,1,128,0,{k},"
                    f"{bid},{ask},5,5,1,1,XYZ")
    rows.append(f"{DBN_NS + 10 * 10**9},{DBN_NS},1,2,5482,C,A,0,101.500000000,5,128,0,10,100.50,,0,0,0,0,XYZ")
    path = write(tmp_path, MBP_HEAD + ",symbol\n" + "\n".join(rows) + "\n", "XYZ-mbp-1.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    # venue 1 alone, then 100.50 / 101.00 over both; venue 2's ask leaving does not take the best ask away
    assert m.price.tolist() == [100.5, 100.75]
    assert (data.bad_rows, data.skipped_rows) == (0, 9)
