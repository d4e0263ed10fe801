"""Vendor file shapes: a repeated DST hour in zone-named times, Date + Hour columns, blank or apostrophe digit groups
and currencies beside prices, vendors' time column names."""

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
