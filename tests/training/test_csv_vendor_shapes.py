"""Vendor file shapes: a repeated DST hour in zone-named times, Date + Hour columns, blank or apostrophe digit groups
and currencies beside prices, vendors' time column names, Databento's fixed-point prices, Binance's headerless files,
a zone-named time skipped when the clocks go forward."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cerebellar_norse.errors import DataError
from cerebellar_norse.training.data import load_csv_files


def write(tmp_path: Path, text: str, name: str = "ticks.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def utc_ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    return round(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


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
        f"{path}:3: time goes backwards for market 'far' ({utc_ms(2024, 11, 3, 4, 40)} < {utc_ms(2024, 11, 3, 5, 50)})"]
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
     "{t},{t},1,1,5482,A,B,0,{px},{sz},128,9000,5000,4108250000000,4108750000000,7,9,1,2,ESZ3"),  # mbp-1
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
    [f"{BN_MS // 1000 + k * 60},42000.0,42003.0,41986.5,{42000 + k},0.5,7" for k in range(3)],  # Kraken OHLCVT
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
    """TrueFX's headerless ticks: a pair, a time, bid and ask."""
    path = write(tmp_path, "EUR/USD,20230102 00:00:00.123,1.06950,1.06970\nEUR/USD,20230102 00:00:01.456,1.06951,1.06971\n")
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
