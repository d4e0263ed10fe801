"""Shapes of market files that Python packages ship as sample data: year-first dates without leading zeros, dates
with an English month name, and vendors' time column names (each test names the package and file its lines come
from)."""

from __future__ import annotations

import json
import re
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from training_helpers import utc_ms
from training_helpers import write_text_file as write

from cerebellar_norse.errors import DataError
from cerebellar_norse.training.csvtime import century_year
from cerebellar_norse.training.data import load_csv_files


def test_year_first_dates_without_leading_zeros(tmp_path: Path) -> None:
    """pandas-ta 0.4.71b0, ``data/ADX_D.csv``: a pandas index column, then ``2020-6-19`` (month and day not padded),
    with the month rolling over to ``2020-7-1``."""
    path = write(tmp_path, ",date,high,low,close\n0,2020-6-19,11382,11150,11286\n1,2020-6-30,11351,11155,11325\n"
                           "2,2020-7-1,11355,11225,11238\n", "ADX_D.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0
    assert data.markets[0].timestamp.tolist() == [utc_ms(2020, 6, 19), utc_ms(2020, 6, 30), utc_ms(2020, 7, 1)]
    assert data.markets[0].price.tolist() == [11286, 11325, 11238]


def test_year_first_dashes_keep_the_time_and_offset(tmp_path: Path) -> None:
    path = write(tmp_path, "date,close\n2020-6-19T09:30:00-04:00,1\n2020-6-19 14:00,2\n")
    data = load_csv_files([path])
    assert data.markets[0].timestamp.tolist() == [utc_ms(2020, 6, 19, 13, 30), utc_ms(2020, 6, 19, 14)]


def test_a_one_digit_hour_after_a_date(tmp_path: Path) -> None:
    """Unpadded date-times as a spreadsheet or a script writes them (``2020-6-19 9:30``): the hour is read, not the
    row refused; two-digit hours and dates without a time are read as before."""
    path = write(tmp_path, "date,close\n2020-6-19 9:30,1\n2020.06.19 9:45:00,2\nJun 19 2020 10:05,3\n2020-6-20,4\n")
    data = load_csv_files([path])
    assert data.bad_rows == 0
    assert data.markets[0].timestamp.tolist() == [utc_ms(2020, 6, 19, 9, 30), utc_ms(2020, 6, 19, 9, 45),
                                                  utc_ms(2020, 6, 19, 10, 5), utc_ms(2020, 6, 20)]


def test_dates_with_a_month_name(tmp_path: Path) -> None:
    """vega_datasets 0.9.0, ``vega_datasets/_data/stocks.csv``: ``symbol,date,price`` with dates ``Jan 1 2000``, one
    block of rows per symbol, no newline after the last row."""
    path = write(tmp_path, "symbol,date,price\nMSFT,Jan 1 2000,39.81\nMSFT,Feb 1 2000,36.35\nMSFT,Sep 1 2000,25.7\n"
                           "AAPL,Feb 1 2010,204.62\nAAPL,Mar 1 2010,223.02", "stocks.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0
    by_id = {m.market_id: m for m in data.markets}
    assert by_id["MSFT"].timestamp.tolist() == [utc_ms(2000, 1, 1), utc_ms(2000, 2, 1), utc_ms(2000, 9, 1)]
    assert by_id["AAPL"].timestamp.tolist() == [utc_ms(2010, 2, 1), utc_ms(2010, 3, 1)]
    assert by_id["AAPL"].price.tolist() == [204.62, 223.02]


@pytest.mark.parametrize("written", ['"Jan 02, 2020"', "02-Jan-2020", "2 January 2020", "jan 2 2020"])
def test_month_name_forms(tmp_path: Path, written: str) -> None:
    path = write(tmp_path, f"date,close\n{written},1\n")
    assert load_csv_files([path]).markets[0].timestamp.tolist() == [utc_ms(2020, 1, 2)]


def test_day_first_month_names_with_two_digit_years(tmp_path: Path) -> None:
    """ta 0.11.0's test data (``test/data/cs-tsi.csv``, StockCharts' spreadsheets: ``Date,Close,…`` with dates
    ``1-Sep-10``) and mplfinance's ``examples/scratch_pad/issues/issue568.csv`` (``3-Jan-22``): a spreadsheet's
    default date format, d-mmm-yy, was no time, so every row was bad and the file refused."""
    path = write(tmp_path, "Date,Close,Momentum\n1-Sep-10,1080.29,\n2-Sep-10,1090.10,9.81\n03-JAN-22,17625.70,1\n"
                           "31-Oct-22,18012.20,2\n", "cs-tsi.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0
    assert data.markets[0].timestamp.tolist() == [utc_ms(2010, 9, 1), utc_ms(2010, 9, 2), utc_ms(2022, 1, 3),
                                                  utc_ms(2022, 10, 31)]
    assert data.markets[0].price.tolist() == [1080.29, 1090.10, 17625.70, 18012.20]


def test_a_two_digit_year_is_the_latest_not_after_this_year(tmp_path: Path) -> None:
    """A two-digit year lies in the hundred years up to this one: 95 is 1995, never 2095; this year's digits are
    this year, next year's are a century back (before 1970, so refused as such, not read as a date to come)."""
    year = datetime.now(UTC).year
    assert century_year(95) == 1995 and century_year(9) == 2009
    assert century_year(year % 100) == year and century_year((year + 1) % 100) == year + 1 - 100
    path = write(tmp_path, f"date,close\n15-Mar-95,1\n02-Jan-{(year + 1) % 100:02d},2\n")
    data = load_csv_files([path], max_bad_fraction=1.0)
    assert data.markets[0].timestamp.tolist() == [utc_ms(1995, 3, 15)]
    assert data.bad_rows == 1 and any("is before 1970-01-01" in line for line in data.report)


def test_a_month_name_that_is_none_is_a_bad_row(tmp_path: Path) -> None:
    path = write(tmp_path, "date,close\nJan 2 2020,1\nJax 3 2020,2\nFeb 30 2020,3\n")
    data = load_csv_files([path], max_bad_fraction=1.0)
    assert data.bad_rows == 2 and data.markets[0].price.tolist() == [1]
    assert any("'Jax 3 2020' is not a time" in line for line in data.report)
    assert any("'Feb 30 2020' is not a time" in line for line in data.report)


def test_only_bad_month_names_name_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "date,close\nJax 3 2020,2\n")
    with pytest.raises(DataError, match=r"ticks\.csv:2: date 'Jax 3 2020' is not a time"):
        load_csv_files([path])


@pytest.mark.parametrize(("header", "row", "source"), [
    # stock-pandas 5.4.5, example/tencent.csv (Futu OpenAPI's bars): time_key, close before high and low
    ("time_key,open,close,high,low,volume,turnover", "2019-10-15 00:00:00,329.4,328.8,331.6,327.6,14202519,4679498788.0",
     "tencent"),
    # fastquant 0.1.8.1, fastquant/data/JFC_20180101_20190110_DCV.csv
    ("dt,close,volume,dividend", "2019-10-15,328.8,14202519,0", "JFC"),
    # zipline-reloaded 3.2.1, tests/resources/pipeline_inputs/AAPL.csv
    ("day,open,high,low,close,volume", "2019-10-15,523.42,530.64,522.80,328.8,14202519", "AAPL"),
])
def test_vendors_time_column_names(tmp_path: Path, header: str, row: str, source: str) -> None:
    path = write(tmp_path, f"{header}\n{row}\n", f"{source}.csv")
    data = load_csv_files([path])
    tick = data.markets[0]
    assert tick.market_id == source
    assert tick.timestamp.tolist() == [utc_ms(2019, 10, 15)]
    assert tick.price.tolist() == [328.8] and tick.volume.tolist() == [14202519]


def test_a_day_column_gives_way_to_a_date_column(tmp_path: Path) -> None:
    path = write(tmp_path, "day,date,close\n3,2019-10-15,1\n")
    assert load_csv_files([path]).markets[0].timestamp.tolist() == [utc_ms(2019, 10, 15)]


def test_a_table_of_several_symbols_above_their_fields_is_refused_naming_them(tmp_path: Path) -> None:
    """fastquant 0.1.8.1, ``fastquant/data/merged_stock_data.zip``: pandas' two-level columns, the symbols
    (``Symbol,2GO,…``, one of them ``T``) above the fields (``,open,…,value``), then the index name (``dt,,…``); the
    repeated ``T`` was taken for a time column named five times."""
    path = write(tmp_path, "Symbol,2GO,2GO,T,T\n,open,close,open,close\ndt,,,,\n2013-01-02,7.3,7.4,1.1,1.2\n",
                 "merged_stock_data.csv")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert str(exc.value) == (f"{path}:1: a table of 2 tickers (2GO, T); save one ticker per file, or one row per tick"
                              " with a symbol column (df.stack(level=0).reset_index())")


def test_a_table_of_one_symbol_above_its_fields_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, "Symbol,JFC,JFC,JFC\n,open,close,value\ndt,,,\n2013-01-02,7.3,7.4,100\n"
                           "2013-01-03,7.4,7.5,200\n", "merged.csv")
    data = load_csv_files([path])
    tick = data.markets[0]
    assert tick.market_id == "JFC" and tick.price.tolist() == [7.4, 7.5]
    assert tick.timestamp.tolist() == [utc_ms(2013, 1, 2), utc_ms(2013, 1, 3)]


def test_yfinance_grouped_by_ticker_is_read(tmp_path: Path) -> None:
    """``yf.download("AAPL", group_by="ticker").to_csv()``: the Ticker line above the Price line."""
    path = write(tmp_path, "Ticker,AAPL,AAPL,AAPL,AAPL,AAPL\nPrice,Open,High,Low,Close,Volume\nDate,,,,,\n"
                           "2024-01-02,187.15,188.44,183.89,185.64,82488700\n", "AAPL.csv")
    tick = load_csv_files([path]).markets[0]
    assert tick.market_id == "AAPL" and tick.price.tolist() == [185.64] and tick.volume.tolist() == [82488700]
    assert tick.timestamp.tolist() == [utc_ms(2024, 1, 2)]


@pytest.mark.parametrize("text", [
    # finta 1.3's test data, tests/data/xau-usd.json (OANDA's candles as pandas writes them): one line of 400 kB
    '[{"time": "2019-03-31T23:00:00.000000000Z", "volume": 510, "high": "1292.489", "close": "1291.729"},'
    ' {"time": "2019-04-01T01:00:00.000000000Z", "volume": 1079, "high": "1293.742", "close": "1293.079"}]',
    # the same pretty-printed, JSON Lines, and an exchange API's klines (arrays of arrays)
    '[\n  {\n    "time": 1556668800000,\n    "close": 5.1\n  }\n]\n',
    '{"time": 1556668800000, "close": 5.1}\n{"time": 1556668860000, "close": 5.2}\n',
    '[[1556668800000, "5000.1", "5010.0", "4990.2", "5005.3", "12.5"]]',
])
def test_a_json_file_is_refused_saying_it_is_json_and_how_to_convert_it(tmp_path: Path, text: str) -> None:
    """A JSON file was refused as a CSV file with "no time column", its first line (the whole file, for finta's
    one-line file) echoed back as the header: the message said nothing of JSON."""
    path = write(tmp_path, text, "xau-usd.json")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    message = str(exc.value)
    assert message.startswith(f"{path}:1: JSON, not CSV (the file starts with ")
    assert "pd.read_json(FILE).to_csv(" in message and "no time column" not in message
    assert len(message) < 400


@pytest.mark.parametrize(("rows", "names"), [
    # freqtrade's candles (tests/testdata/UNITTEST_BTC-1m.json, ccxt's order) and trades (XRP_ETH-trades.json.gz)
    ([[1509836520000, 0.00162008, 0.00162008, 0.00162008, 0.00162008, 108.14853839],
      [1509836580000, 0.00161, 0.00161, 0.00161, 0.00161, 82.390199]], "timestamp open high low close volume"),
    ([[1570752011620, "13519807", None, "sell", 0.00141342, 23.0, 0.03250866],
      [1570752017964, "13519809", None, "sell", 0.00141266, 8.0, 0.01130128]],
     "timestamp id type side price amount cost"),
])
def test_a_json_array_of_arrays_is_refused_with_a_conversion_that_names_its_columns(
        tmp_path: Path, rows: list[list[object]], names: str) -> None:
    """freqtrade's ``--data-format-ohlcv json`` candles and trades are arrays without field names. The refusal's line,
    ``pd.read_json(FILE).to_csv('ticks.csv', index=False)``, writes their columns as ``0,1,2,…``, which name no time
    or price, so the converted file was refused as one without a header line: the line now names the columns, and the
    file it writes is read at the right time and price."""
    path = write(tmp_path, json.dumps(rows), "UNITTEST_BTC-1m.json")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    message = str(exc.value)
    assert message.startswith(f"{path}:1: JSON, not CSV") and "no time column" not in message
    header = re.search(r"header='([^']*)'\.split\(\)", message)
    assert header is not None and header[1] == names
    # the file as the message's pandas line writes it: the named columns, then each array's fields
    fields = [["" if v is None else str(v) for v in row] for row in rows]
    csv_path = write(tmp_path, "\n".join([",".join(header[1].split()), *(",".join(f) for f in fields)]) + "\n",
                     "UNITTEST_BTC-1m.csv")
    data = load_csv_files([csv_path])
    assert data.bad_rows == 0
    assert data.markets[0].timestamp.tolist() == [row[0] for row in rows]
    assert data.markets[0].price.tolist() == [row[4] for row in rows]  # close of a candle, price of a trade
    assert data.markets[0].volume.tolist() == [row[5] for row in rows]


def test_a_json_array_of_arrays_of_an_unknown_width_is_told_to_name_its_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "[[1509836520000, 0.00162, 108.1], [1509836580000, 0.00161, 82.4]]", "x.json")
    with pytest.raises(DataError, match=r"arrays of 3 unnamed fields: name them"):
        load_csv_files([path])


@pytest.mark.parametrize(("head", "name", "reader"), [
    # freqtrade's default candle format (tests/testdata/*.feather): Arrow IPC, 'ARROW1', two NULs, then flatbuffers
    (b"ARROW1\x00\x00\xff\xff\xff\xff\xf1\x01\x00\x00\x10\x00", "Feather", "pd.read_feather(FILE)"),
    (b"PAR1\x15\x04\x15\x80\x01\x15\x84\x01L\x15\x10\x15\x00", "Parquet", "pd.read_parquet(FILE)"),
    (b"\x89HDF\r\n\x1a\n\x00\x00\x00\x00\x00\x08\x08\x00", "HDF5", "pd.read_hdf(FILE)"),
    (b"\x80\x05\x95\x8c\x02\x00\x00\x00\x00\x00\x00\x8c\x11pandas", "pickle", "pd.read_pickle(FILE)"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1\x00\x00\x00\x00", "Excel 97-2003", "pd.read_excel(FILE)"),
])
def test_a_binary_table_is_refused_naming_its_format_and_the_conversion(
        tmp_path: Path, head: bytes, name: str, reader: str) -> None:
    """A Feather file (freqtrade's candles) was refused as a CSV file whose header is "not UTF-8 text (byte 0xf1);
    save the file as UTF-8", which no tool does to a Feather file: the refusal names the format and the pandas line
    that writes it as CSV (with its index, which the reader takes as the time or ignores as row numbers)."""
    path = tmp_path / "ADA_BTC-5m.feather"
    path.write_bytes(head + bytes(range(256)) * 4)
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    message = str(exc.value)
    assert message.startswith(f"{path}:1: ") and name in message and "UTF-8" not in message
    assert f"{reader}.to_csv('ticks.csv')" in message


@pytest.mark.parametrize(("members", "name"), [
    # the parts of an .xlsx that Excel and openpyxl write, and of an .ods (LibreOffice)
    (("[Content_Types].xml", "_rels/.rels", "xl/workbook.xml", "xl/worksheets/sheet1.xml", "xl/styles.xml"),
     "an Excel workbook (.xlsx)"),
    (("mimetype", "content.xml", "styles.xml", "meta.xml", "META-INF/manifest.xml"), "an OpenDocument spreadsheet (.ods)"),
])
def test_a_spreadsheet_workbook_is_refused_as_one(tmp_path: Path, members: tuple[str, ...], name: str) -> None:
    """A workbook is a zip archive: it was refused as one that holds several files, "unpack it and name its files",
    which gives XML, no tick file."""
    path = tmp_path / "prices.xlsx"
    with zipfile.ZipFile(path, "w") as archive:
        for member in members:
            archive.writestr(member, "<?xml version=\"1.0\"?><x/>")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    message = str(exc.value)
    assert message.startswith(f"{path}: {name}, not CSV") and "unpack" not in message
    assert "save the sheet as CSV" in message and ".to_csv('ticks.csv'" in message


def test_a_csv_header_starting_like_a_binary_format_is_read_as_csv(tmp_path: Path) -> None:
    path = write(tmp_path, "PAR1,time,close\nx,2020-01-02,1.5\n")
    assert load_csv_files([path]).markets[0].price.tolist() == [1.5]


def test_a_csv_header_in_brackets_is_not_taken_for_json(tmp_path: Path) -> None:
    path = write(tmp_path, "[time],close\n2020-01-02,1\n")
    with pytest.raises(DataError, match=r"no time column"):
        load_csv_files([path])


def test_a_time_column_named_timestamp_utc(tmp_path: Path) -> None:
    """nautilus_trader's CME bars (``tests/test_data/xcme/6EH4.XCME_1min_bars_20240101_20240131.csv.gz``,
    ``timestamp_utc,open,high,low,close,volume``): the name of `timestamp (utc)` written as one word was no time
    column, so the file was refused."""
    for name in ("timestamp_utc", "time_utc", "datetime_utc", "Date_UTC"):
        path = write(tmp_path, f"{name},open,high,low,close,volume\n2024-01-01 23:01:00,1.1076,1.10785,1.1076,1.1078,205\n"
                               "2024-01-01 23:02:00,1.10775,1.1078,1.1077,1.10775,86\n", "6EH4.XCME.csv")
        data = load_csv_files([path])
        assert data.markets[0].timestamp.tolist() == [utc_ms(2024, 1, 1, 23, 1), utc_ms(2024, 1, 1, 23, 2)], name
        assert data.markets[0].price.tolist() == [1.1078, 1.10775] and data.markets[0].volume.tolist() == [205, 86]


def test_tardis_trades_and_quotes_read_their_amounts_as_volume(tmp_path: Path) -> None:
    """nautilus_trader's ``tests/test_data/tardis/bitmex_trades_XBTUSD.csv`` and ``huobi-dm-swap_quotes_BTC-USD.csv``
    (Tardis' CSV): the quantity traded is ``amount`` (``bid_amount`` and ``ask_amount`` in quotes), which was no
    volume column, so every tick had volume 0."""
    trades = write(tmp_path, "exchange,symbol,timestamp,local_timestamp,id,side,price,amount\n"
                             "bitmex,XBTUSD,1583020803145000,1583020803307160,ccc3c1fa,sell,8531.5,2152\n"
                             "bitmex,XBTUSD,1583020803276000,1583020803460000,2f1a0b7e,buy,8532,7\n", "trades.csv")
    data = load_csv_files([trades])
    assert data.markets[0].market_id == "XBTUSD" and data.markets[0].volume.tolist() == [2152, 7]
    assert f"{trades}: volume from 'amount'" in data.notes
    quotes = write(tmp_path, "exchange,symbol,timestamp,local_timestamp,ask_amount,ask_price,bid_price,bid_amount\n"
                             "huobi-dm-swap,BTC-USD,1588291201099000,1588291201234268,5494,8629.3,8629.2,806\n", "q.csv")
    tick = load_csv_files([quotes]).markets[0]
    assert tick.price.tolist() == [8629.25] and tick.volume.tolist() == [806 + 5494]


def test_a_volume_column_is_read_before_an_amount(tmp_path: Path) -> None:
    """stockstats' ``test_data/002032.csv``: ``amount`` is the turnover beside ``volume``, which stays the volume."""
    path = write(tmp_path, "date,amount,close,high,low,open,volume\n20040817,90923240.0,11.2,12.21,11.03,12.21,7877900\n")
    assert load_csv_files([path]).markets[0].volume.tolist() == [7877900]


@pytest.mark.parametrize("newest_first", [False, True])
def test_a_history_that_starts_before_1970_is_read_from_1970_on(tmp_path: Path, newest_first: bool) -> None:
    """A weekly gold fixing from 1968 (pyalgotrade's Quandl sample, newest first), a FRED series from the 1960s: its
    rows before 1970-01-01 were bad rows, 4 % of the file, so the whole file was refused (> 1 % bad) with no word on
    what to do. They are skipped, counted in a note, and the history is read from 1970 on; a two-digit year read a
    century back (``02-Jan-27`` as 1927) stays a bad row, as does a time in ms before 1970 (tests/training/test_data.py)."""
    weeks = [datetime(1968, 1, 7, tzinfo=UTC) + timedelta(weeks=k) for k in range(150)]
    rows = [f"{w:%Y-%m-%d},{35.0 + 0.1 * k:.2f}" for k, w in enumerate(weeks)]
    path = write(tmp_path, "Date,USD\n" + "\n".join(reversed(rows) if newest_first else rows) + "\n")
    data = load_csv_files([path])
    before = sum(w.year < 1970 for w in weeks)
    assert before == 104 and data.bad_rows == 0 and data.skipped_rows == before
    assert data.markets[0].timestamp.tolist() == [int(w.timestamp() * 1000) for w in weeks if w.year >= 1970]
    assert data.markets[0].price[0] == pytest.approx(35.0 + 0.1 * before)
    assert any(f"{before} rows skipped: dated before 1970-01-01" in n for n in data.notes)


def test_a_date_time_column_named_with_a_blank_is_the_time(tmp_path: Path) -> None:
    """pyalgotrade's bar files (its generic CSV feed, ``30min-bitstampUSD-2.csv``) name the time ``Date Time``, which
    was no time column name: the file was refused."""
    path = write(tmp_path, "Date Time,Open,High,Low,Close,Volume,Adj Close\n2014-06-23 22:00:00,585.46,588.5,585.14,"
                           "586.54,30.63408917,\n2014-06-23 22:30:00,588.24,588.5,585.79,588.5,24.74637228,\n")
    data = load_csv_files([path])
    assert data.bad_rows == 0 and data.formats[0].time == "Date Time"
    assert data.markets[0].timestamp.tolist() == [utc_ms(2014, 6, 23, 22), utc_ms(2014, 6, 23, 22, 30)]
    assert data.markets[0].price.tolist() == [586.54, 588.5]
