"""Training data: CSV headers, aliases and time formats, the bad-row report, labels, class warnings, file names."""

from __future__ import annotations

import math
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from training_helpers import ConfigFactory

from cerebellar_norse.errors import DataError, InputError
from cerebellar_norse.training.data import (
    MIN_SAMPLES_PER_CLASS,
    DataFileNotFoundError,
    class_counts,
    class_warnings,
    load_csv_files,
    resolve_data_file,
)
from cerebellar_norse.training.jobs import run_training
from cerebellar_norse.training.labels import LabelSpec, label_series

T0 = 1_640_995_200_000
HEADER = "timestamp,market_id,price,volume"


def write(tmp_path: Path, text: str, name: str = "ticks.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def good_rows(n: int, market: str = "A", start: int = 0) -> list[str]:
    return [f"{T0 + 1000 * (start + k)},{market},{100.0 + k},{10.0 + k}" for k in range(n)]


# --------------------------------------------------------------------------------------
# Header and columns
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["", f"{T0},A,100.0,10.0", "open,high,low,close,volume", "date,open,volume",
                                    "timestamp,market_id,price,PRICE", "Time,Symbol,Close,Ticker,symbol"])
def test_missing_or_wrong_header_is_refused_naming_line_1(tmp_path: Path, header: str) -> None:
    path = write(tmp_path, "\n".join([header, *good_rows(3)]) + "\n" if header else "")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert f"{path}:1:" in str(exc.value) or f"{path}:1:" in "\n".join(exc.value.report)
    assert exc.value.report and exc.value.report[0].startswith(f"{path}:1:")


def test_columns_in_any_order(tmp_path: Path) -> None:
    rows = [f"{100.0 + k},{10.0 + k},B,{T0 + 1000 * k}" for k in range(5)]
    path = write(tmp_path, "\n".join([" Price,Volume,market_id,TIMESTAMP", *rows]) + "\n")
    data = load_csv_files([path])
    assert data.rows == 5 and data.bad_rows == 0 and data.report == []
    (m,) = data.markets
    assert m.market_id == "B"
    np.testing.assert_array_equal(m.price, [100.0, 101.0, 102.0, 103.0, 104.0])
    np.testing.assert_array_equal(m.volume, [10.0, 11.0, 12.0, 13.0, 14.0])
    np.testing.assert_array_equal(m.timestamp, [T0 + 1000 * k for k in range(5)])


def test_missing_time_or_price_column_names_what_is_expected(tmp_path: Path) -> None:
    path = write(tmp_path, "Date,Open,Volume\n2020-01-02,1,2\n")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    msg = f"{path}:1: no price column (expected one of price, close, last, mid, close/last, adj close, adj_close, adj. close, adjclose, adjusted_close, adjusted close, or a bid and an ask column); header is Date,Open,Volume"
    assert str(exc.value) == msg and exc.value.report == [msg]
    path = write(tmp_path, "Symbol,Close\nA,1\n")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert str(exc.value) == (f"{path}:1: no time column (expected one of timestamp, unix, time, date, datetime, date_time, date time, gmt time, utc time,"
                              " local time, open time, open_time, time (utc), timestamp (utc), date (utc), datetime (utc),"
                              " timestamp_utc, time_utc, datetime_utc, date_utc, transact_time, window_start, datum, ts_recv, ts_event, sip_timestamp, participant_timestamp,"
                              " time_exchange, time_key, dt, day, ts, t, observation_date); header is Symbol,Close")


def test_a_header_with_control_characters_is_echoed_with_them_escaped(tmp_path: Path) -> None:
    """A NUL byte after each name (a file written by a tool padding its fields) or a terminal's escape sequence in the
    header was echoed raw into the message: NULs in the journal and on the terminal, colours and cursor moves the
    file's bytes chose, and names that looked right but matched no column."""
    path = tmp_path / "padded.csv"
    path.write_bytes(b"timestamp\x00,price\x1b[2J,volume\n1640995200000,1,2\n")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    msg = str(exc.value)
    assert msg.endswith(r"header is timestamp\x00,price\x1b[2J,volume"), msg
    assert msg.isprintable() and exc.value.report == [msg]


@pytest.mark.parametrize("closed", [False, True], ids=["never closed", "closed 30 lines later"])
def test_a_quote_left_open_in_a_row_names_the_line_it_opens_on_and_the_lines_it_swallowed(tmp_path: Path,
                                                                                          closed: bool) -> None:
    """A stray quote opening a field read every line after it (to the next quote, or the end of the file) into that
    field: half a file's ticks went missing as one bad row reported at the last line ("expected 4 fields, got 2"), or,
    in the first row, as "the header names 4 columns but every row has 2 fields: a column name is one too many"."""
    rows = good_rows(100)
    rows[40] = rows[40].replace(",A,", ',"A,')  # file line 42
    if closed:
        rows[70] = rows[70].replace(",A,", ',A",')  # line 72
    path = write(tmp_path, "\n".join(["timestamp,market_id,price,volume", *rows]) + "\n")
    with pytest.raises(DataError) as exc:  # every line swallowed is a bad row: far above max_bad_row_fraction
        load_csv_files([path])
    end, swallowed = (72, 30) if closed else (101, 59)
    assert str(exc.value).startswith(f"{1 + swallowed} of 100 rows are bad")
    data = load_csv_files([path], max_bad_fraction=1.0)
    assert data.report == [f"{path}:42: a quote (\") opens a field that is not closed before the end of the line: the next "
                           f"{swallowed} lines (to line {end}) were read into that field, not as rows; remove the quote, or"
                           " close it in its field"]
    assert data.bad_rows == 1 + swallowed and sum(len(m.price) for m in data.markets) == 100 - 1 - swallowed
    path = write(tmp_path, "\n".join(["timestamp,market_id,price,volume", rows[40], *good_rows(5)]) + "\n", "first.csv")
    with pytest.raises(DataError) as exc:  # in the first row: no longer taken for a header one name too long
        load_csv_files([path])
    assert exc.value.report == [f"{path}:2: a quote (\") opens a field that is not closed before the end of the line: the "
                                "next 5 lines (to line 7) were read into that field, not as rows; remove the quote, or "
                                "close it in its field"]


def test_a_file_without_a_header_line_is_told_to_add_one(tmp_path: Path) -> None:
    """As Binance's kline files are written: data from the first line."""
    path = write(tmp_path, "1502942400000,4261.48,4485.39,4200.74,4285.08,795.150377,1503028799999\n", "BTCUSDT-1d.csv")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert str(exc.value).startswith(f"{path}:1: no time column (expected one of ")
    assert str(exc.value).endswith("(the first line looks like data: add a header line naming the columns)")


def test_a_huge_header_line_is_refused_quickly_and_not_echoed_whole(tmp_path: Path) -> None:
    """Fuzzed: a 10 MB header line (5,000,000 names) without a time column took 30 s to refuse, each name read as a
    possible time, and the refusal echoed the whole 10 MB line back."""
    names = 200_000
    path = write(tmp_path, "a," * names + "Close\n1,2\n")
    t0 = time.monotonic()
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert time.monotonic() - t0 < 5  # each name was read as a possible time (1,000,000 names: 8 s)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:1: no time column (expected one of ") and len(msg) < 1200
    assert msg.endswith(f"header is {'a,' * 250}… ({names + 1} names, {2 * names + 5} characters)")
    assert exc.value.report == [msg]
    path = write(tmp_path, "1," * names + "2\n1,2\n")  # a first line of data is still told so
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert str(exc.value).endswith("(the first line looks like data: add a header line naming the columns)")


def test_a_used_column_named_twice_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "Date,Close,Open,close\n2020-01-02,1,2,3\n")
    with pytest.raises(DataError, match=r":1: price column 'close' appears 2 times in the header \(columns 2, 4\)"):
        load_csv_files([path])
    # an ignored column twice, or two different aliases, is fine: the preferred one is used
    path = write(tmp_path, "Date,Open,Open,Close,Price,timestamp\n2020-01-02,1,2,3,4,1\n")
    (m,) = load_csv_files([path]).markets
    assert m.price.tolist() == [4.0] and m.timestamp.tolist() == [1.0]


def test_columns_by_alias_in_any_order_give_the_same_ticks(tmp_path: Path) -> None:
    rows = [("2022-01-01T00:00:00Z", "BTC-USD", 46210.5, 0.25), ("2022-01-01T00:00:00.250Z", "ETH-USD", 3683.1, 1.5),
            ("2022-01-01T00:00:00.410Z", "BTC-USD", 46211.0, 0.1)]
    a = write(tmp_path, "\n".join(["Time,Ticker,Last,Qty", *(f"{t},{m},{p},{v}" for t, m, p, v in rows)]) + "\n", "a.csv")
    b = write(tmp_path, "\n".join(["SIZE , Mid,Note, Instrument,DateTime", *(f"{v},{p},hello,{m},{t}" for t, m, p, v in rows)]),
              "b.csv")
    da, db = load_csv_files([a]), load_csv_files([b])
    assert da.notes == db.notes == [] and da.report == db.report == []
    for ma, mb in zip(da.markets, db.markets, strict=True):
        assert ma.market_id == mb.market_id
        for name in ("timestamp", "price", "volume"):
            np.testing.assert_array_equal(getattr(ma, name), getattr(mb, name))
    assert [m.market_id for m in da.markets] == ["BTC-USD", "ETH-USD"]
    np.testing.assert_array_equal(da.markets[0].timestamp, [T0, T0 + 410])
    np.testing.assert_array_equal(da.markets[0].volume, [0.25, 0.1])


def test_classic_four_column_file_has_no_notes(tmp_path: Path) -> None:
    path = write(tmp_path, "\n".join([HEADER, *good_rows(3)]) + "\n")
    data = load_csv_files([path])
    assert data.notes == [] and data.ticks == 3


# --------------------------------------------------------------------------------------
# Files as quants have them: daily OHLC, FX without volume, ISO times
# --------------------------------------------------------------------------------------

YF_DAILY = """Date,Open,High,Low,Close,Adj Close,Volume
2020-01-02,74.06,75.15,73.80,75.09,73.15,135480400
2020-01-03,74.29,75.14,74.13,74.36,n/a,146322800
2020-01-06,73.45,74.99,73.19,74.95,73.02,118387200
"""


def utc_ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    return round(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp() * 1000)


def test_daily_ohlc_file_with_iso_dates_and_no_market_column(tmp_path: Path) -> None:
    path = write(tmp_path, YF_DAILY, "AAPL.csv")
    data = load_csv_files([path])
    assert data.rows == 3 and data.bad_rows == 0 and data.report == []  # 'n/a' in Adj Close is not read
    (m,) = data.markets
    assert m.market_id == "AAPL"
    np.testing.assert_array_equal(m.price, [75.09, 74.36, 74.95])  # Close, not Adj Close
    np.testing.assert_array_equal(m.volume, [135480400, 146322800, 118387200])
    np.testing.assert_array_equal(m.timestamp, [utc_ms(2020, 1, 2), utc_ms(2020, 1, 3), utc_ms(2020, 1, 6)])
    assert m.timestamp[0] == 1_577_923_200_000
    assert data.notes == [f"{path}: no market column; market id 'AAPL' (from the file name) used"]


def test_adj_close_is_the_price_only_without_close(tmp_path: Path) -> None:
    path = write(tmp_path, "date,adj_close\n2020-01-02,73.15\n", "X.csv")
    (m,) = load_csv_files([path]).markets
    assert m.price.tolist() == [73.15]


def test_fx_file_without_volume_gets_volume_zero_and_a_note(tmp_path: Path) -> None:
    text = """Datetime,Open,High,Low,Close
2021-03-01 00:00:00+00:00,1.20750,1.20920,1.20700,1.20880
2021-03-01 01:00:00+00:00,1.20880,1.20910,1.20800,1.20820
2021-03-01 02:00:00+00:00,1.20820,1.20860,1.20630,1.20660
"""
    path = write(tmp_path, text, "EURUSD.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert m.market_id == "EURUSD" and data.report == []
    np.testing.assert_array_equal(m.volume, [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(m.price, [1.2088, 1.2082, 1.2066])
    np.testing.assert_array_equal(m.timestamp, [utc_ms(2021, 3, 1, h) for h in range(3)])
    assert data.notes == [f"{path}: no volume column; volume 0 used",
                          f"{path}: no market column; market id 'EURUSD' (from the file name) used"]
    # with a symbol column only the volume note remains
    path = write(tmp_path, "time,symbol,bid,ask,mid\n2021-03-01T00:00Z,GBPUSD,1.39,1.40,1.395\n", "fx.csv")
    data = load_csv_files([path])
    assert data.notes == [f"{path}: no volume column; volume 0 used"]
    assert data.markets[0].market_id == "GBPUSD" and data.markets[0].price.tolist() == [1.395]


def test_market_id_from_the_file_name_is_made_valid(tmp_path: Path) -> None:
    for name, market in [("EUR USD€ 1h.csv", "EUR USD_ 1h"), ("x" * 80 + ".csv", "x" * 64), ("BRK.B.csv", "BRK.B")]:
        path = write(tmp_path, "date,close\n2020-01-02,1\n", name)
        assert [m.market_id for m in load_csv_files([path]).markets] == [market]


def test_files_without_market_column_are_separate_markets(tmp_path: Path) -> None:
    a = write(tmp_path, YF_DAILY, "AAPL.csv")
    b = write(tmp_path, YF_DAILY.replace("2020-", "2019-"), "MSFT.csv")  # earlier times: another market, fine
    data = load_csv_files([a, b])
    assert [m.market_id for m in data.markets] == ["AAPL", "MSFT"] and data.ticks == 6 and data.report == []


def test_timestamps_from_1970_on_are_accepted(tmp_path: Path) -> None:
    t1975 = 157_766_400_000  # 1975-01-01T00:00:00Z
    path = write(tmp_path, f"timestamp,market_id,price,volume\n{t1975},A,1,1\n{t1975 + 1000},A,2,1\n")
    early = write(tmp_path, "timestamp,market_id,price,volume\n0,B,1,1\n", "early.csv")
    data = load_csv_files([path, early])
    assert data.report == [] and data.markets[0].timestamp.tolist() == [t1975, t1975 + 1000]
    assert data.markets[1].timestamp.tolist() == [0]
    path = write(tmp_path, "Date,Close\n1975-01-01,1\n1975-06-30T12:00,2\n", "old.csv")
    (m,) = load_csv_files([path]).markets
    assert m.timestamp.tolist() == [t1975, utc_ms(1975, 6, 30, 12)]


def test_ms_integers_and_iso_times_with_offsets_give_the_same_ms(tmp_path: Path) -> None:
    iso = ["2022-01-01T01:00:00+01:00", "2021-12-31T19:00:00.250-05:00", "2022-01-01 00:00:00.500",
           "2022-01-01T00:00:00.750Z", "2022-01-01T00:00:01", "2022-01-01T05:30:01.999+05:30"]
    want = [T0, T0 + 250, T0 + 500, T0 + 750, T0 + 1000, T0 + 1999]
    a = write(tmp_path, "timestamp,price\n" + "".join(f"{t},1\n" for t in want), "a.csv")
    b = write(tmp_path, "date_time,price\n" + "".join(f"{t},1\n" for t in iso), "b.csv")
    c = write(tmp_path, "time,price\n" + "".join(f"{float(t):.12e},1\n" for t in want), "c.csv")  # 1.6409952e+12 etc.
    for path in (a, b, c):
        data = load_csv_files([path])
        assert data.report == []
        assert data.markets[0].timestamp.tolist() == want, path


def test_z_and_zero_offset_are_the_same_time(tmp_path: Path) -> None:
    path = write(tmp_path, "time,market,price\n2022-01-01T00:00:00Z,A,1\n2022-01-01T00:00:00+00:00,B,1\n"
                           "2022-01-01T00:00:00,C,1\n2022-01-01,D,1\n")
    data = load_csv_files([path])
    assert [m.timestamp.tolist() for m in data.markets] == [[T0]] * 4


def test_sub_millisecond_digits_are_dropped(tmp_path: Path) -> None:
    path = write(tmp_path, "time,price\n2022-01-01T00:00:00.123999Z,1\n")
    assert load_csv_files([path]).markets[0].timestamp.tolist() == [T0 + 123]


def test_a_column_may_mix_ms_and_iso_whatever_its_first_row(tmp_path: Path) -> None:
    for first, second in [(str(T0), "2022-01-01T00:00:01Z"), ("2022-01-01T00:00:00Z", str(T0 + 1000))]:
        path = write(tmp_path, f"time,price\n{first},1\n{second},2\n20220101,3\n")
        data = load_csv_files([path], max_bad_fraction=0.5)
        # an integer is ms, also in a column of dates: 20220101 ms is in 1970, before the rows above
        assert data.markets[0].timestamp.tolist() == [T0, T0 + 1000]
        assert data.report == [f"{path}:4: time '20220101' read as ms since epoch is before 1973-03-03, unlike the file's"
                               " first time: a time in another unit?" if first == str(T0) else
                               f"{path}:4: time goes backwards for market 'ticks' (1970-01-01T05:37:00.101Z <"
                               f" 2022-01-01T00:00:01Z; ms 20220101 < {T0 + 1000})"]


def test_bad_date_and_price_rows_name_the_header_column(tmp_path: Path) -> None:
    text = YF_DAILY + "2020-01-07,1,1,1,abc,1,5\n2020-13-01,1,1,1,75,1,5\n2020-01-08,1,1,1,-2,1,5\n2020-01-09,1,1,1,76,1\n"
    path = write(tmp_path, text, "ticks.csv")
    data = load_csv_files([path], max_bad_fraction=0.9)
    assert data.report == [f"{path}:5: Close 'abc' is not a number",
                           f"{path}:6: Date '2020-13-01' is not a time (ms since epoch or ISO 8601)",
                           f"{path}:7: Close -2.0 is not > 0",
                           f"{path}:8: expected 7 fields, got 6"]
    assert data.rows == 7 and data.bad_rows == 4 and data.ticks == 3


def test_bom_before_the_header_is_ignored(tmp_path: Path) -> None:
    for header in ("Date,Close", '"Date","Close"'):
        path = tmp_path / "bom.csv"
        path.write_bytes(b"\xef\xbb\xbf" + f"{header}\n2022-01-01,5\n".encode())
        data = load_csv_files([path])
        assert data.report == [] and data.markets[0].timestamp.tolist() == [T0]


def test_times_early_on_1970_01_01_as_ms_get_a_note(tmp_path: Path) -> None:
    path = write(tmp_path, "Timestamp,Symbol,Price,Vol\n99999000,A,1,0\n99999001,A,2,0\n")
    data = load_csv_files([path])
    assert data.markets[0].timestamp.tolist() == [99999000, 99999001]  # below 1e8: ms, as documented
    assert data.notes == [f"{path}:2: Timestamp 99999000 read as ms since epoch is 1970-01-02;"
                          " if the file's times are seconds, multiply them by 1000"]


UNIT_FILES = {  # the unit of numeric times, from the file's first time: (first two times, unit word)
    "seconds": (("1640995200", "1640995201.25"), "seconds"),
    "seconds as floats": (("1640995200.0", "1.640995201e9"), "seconds"),
    "µs": (("1640995200000000", "1640995201250999"), "µs"),
    "ns": (("1640995200000000000", "1640995201250999999"), "ns"),
}


@pytest.mark.parametrize("kind", sorted(UNIT_FILES))
def test_numeric_times_are_read_in_the_unit_their_first_value_shows(tmp_path: Path, kind: str) -> None:
    (first, second), word = UNIT_FILES[kind]
    path = write(tmp_path, f"unix,Symbol,Price,Vol\n{first},A,1,0\n{second},A,2,0\n")
    data = load_csv_files([path])
    assert data.markets[0].timestamp.tolist() == [T0, T0 + (1000 if kind == "seconds as floats" else 1250)]
    assert data.notes == [f"{path}: unix read as {word} since the epoch (the first, {first}, is 2022-01-01 00:00:00 UTC)"]
    assert data.formats[0].time_unit == {"seconds": "s", "seconds as floats": "s"}.get(kind, kind)


def test_a_time_of_another_unit_in_a_seconds_file_is_a_bad_row(tmp_path: Path) -> None:
    rows = "".join(f"{1640995200 + k},A,{100 + k % 3},1\n" for k in range(300))
    path = write(tmp_path, f"timestamp,market_id,price,volume\n{rows}{T0 + 400_000},A,1,1\n1640995600,A,1,x1\n")
    data = load_csv_files([path])
    assert data.report == [f"{path}:302: timestamp '{T0 + 400_000}' read as seconds since epoch (the file's unit) is not"
                           " in 1970-01-01 .. 2100-01-01", f"{path}:303: volume 'x1' is not a number"]
    assert data.ticks == 300 and data.markets[0].timestamp[-1] == T0 + 299_000


def test_bytes_that_are_not_utf8_cost_only_their_row(tmp_path: Path) -> None:
    rows = good_rows(1000)
    path = tmp_path / "latin1.csv"
    path.write_bytes(("Comment," + HEADER + "\n").encode()
                     + b"".join((b"gr\xfcn," if k == 10 else b"ok,") + r.encode() + b"\n" for k, r in enumerate(rows[:600]))
                     + f"x,{T0 + 600_000},A\xff,1,1\n".encode("latin-1")
                     + "".join(f"ok,{r}\n" for r in rows[600:]).encode())
    data = load_csv_files([path], max_bad_fraction=0.01)
    assert data.rows == 1001 and data.ticks == 1000  # the byte in the ignored Comment column (line 12) is harmless
    assert data.report == [f"{path}:602: unreadable row: not UTF-8 text (byte 0xff)"]
    path.write_bytes(b"timestamp,market_id,pr\xe9ce,volume\n" + f"{T0},A,1,1\n".encode())
    with pytest.raises(DataError, match=r":1: unreadable header: not UTF-8 text \(byte 0xe9\)"):
        load_csv_files([path])


def test_one_million_rows_load(tmp_path: Path) -> None:
    n = 1_000_000
    path = tmp_path / "big.csv"
    path.write_text(HEADER + "\n" + "".join(f"{T0 + 10 * k},{'ABCD'[k % 4]},{100 + (k % 997) / 100},{k % 13}\n"
                                            for k in range(n)), encoding="utf-8")
    start = time.perf_counter()
    data = load_csv_files([path])
    seconds = time.perf_counter() - start
    assert data.rows == n and data.bad_rows == 0 and data.ticks == n
    assert [m.market_id for m in data.markets] == ["A", "B", "C", "D"] and [len(m) for m in data.markets] == [n // 4] * 4
    d = data.markets[3]
    assert d.timestamp[-1] == T0 + 10 * (n - 1) and d.price[-1] == 100 + ((n - 1) % 997) / 100
    assert seconds < 60, seconds  # about 3 s on 2 cores; the bound only catches a pathological slowdown



# --------------------------------------------------------------------------------------
# Bad rows
# --------------------------------------------------------------------------------------

BAD_ROWS = {
    "missing field": (f"{T0 + 500},A,100.5", "expected 4 fields, got 3"),
    "price not a number": (f"{T0 + 500},A,abc,10", "price 'abc' is not a number"),
    "volume not a number": (f"{T0 + 500},A,100,ten", "volume 'ten' is not a number"),
    "price with a decimal comma": (f'{T0 + 500},A,"1,5",10', "price '1,5' is not a number (a comma is read only between "
                                   "groups of three digits, as in 1,234.5: write decimals with a point)"),
    "price with misplaced digit groups": (f'{T0 + 500},A,"12,34,567.5",10', "price '12,34,567.5' is not a number"),
    "volume with an unknown suffix": (f"{T0 + 500},A,100,1.5X", "volume '1.5X' is not a number"),
    "extra field": (f"{T0 + 500},A,100.5,10,x", "expected 4 fields, got 5"),
    "timestamp not a whole number of ms": (f"{T0 + 0.5},A,100,10", f"timestamp '{T0 + 0.5}' is not a whole number of ms"),
    "timestamp not a time": ("yesterday,A,100,10", "timestamp 'yesterday' is not a time (ms since epoch or ISO 8601)"),
    "date not a date": ("2022-13-01,A,100,10", "timestamp '2022-13-01' is not a time (ms since epoch or ISO 8601)"),
    "market id too long": (f"{T0 + 500},{'M' * 65},100,10", "market_id 'MMMM"),
    "price not finite": (f"{T0 + 500},A,inf,10", "price 'inf' is not finite"),
    "volume not finite": (f"{T0 + 500},A,100,nan", "volume 'nan' is not finite"),
    "negative volume": (f"{T0 + 500},A,100,-1", "volume -1.0 is negative"),
    "zero price": (f"{T0 + 500},A,0,10", "price 0.0 is not > 0"),
    "negative price": (f"{T0 + 500},A,-3,10", "price -3.0 is not > 0"),
    "negative timestamp": ("-1,A,100,10", "timestamp '-1' is before 1970-01-01 (negative ms since epoch)"),
    "date before 1970": ("1969-12-31T23:59:59Z,A,100,10", "timestamp '1969-12-31T23:59:59Z' is before 1970-01-01"),
    "timestamp in microseconds": (f"{T0 * 1000},A,100,10", "is not a plausible time in ms since epoch (1970-01-01 .. "
                                  "2100-01-01); if the file's times are µs or ns, divide them by 1000 or 1000000"),
    "timestamp in nanoseconds": (f"{T0 * 1000_000 + 7},A,100,10", "if the file's times are µs or ns, divide them"),
    "timestamp in seconds with a fraction": ("1640995200.25,A,100,10", "timestamp '1640995200.25' is not a whole number "
                                             "of ms since epoch; if the file's times are seconds, multiply them by 1000"),
    "date from 2100": ("2100-01-01,A,100,10", "timestamp '2100-01-01' is not before 2100-01-01"),
    "time going backwards": (f"{T0 - 1},A,100,10", "time goes backwards for market 'A'"),
}


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_each_bad_row_kind_is_reported_with_file_and_line(tmp_path: Path, kind: str) -> None:
    bad, reason = BAD_ROWS[kind]
    # line 1 header, lines 2-3 good, line 4 bad, lines 5.. good (later times)
    rows = [*good_rows(2), bad, *good_rows(3, start=2)]
    path = write(tmp_path, "\n".join([HEADER, *rows]) + "\n")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.rows == 6 and data.bad_rows == 1
    assert len(data.report) == 1
    line = data.report[0]
    assert line.startswith(f"{path}:4: "), line
    assert reason in line, line
    assert data.ticks == 5


def test_time_going_backwards_is_per_market_interleaved_markets_are_fine(tmp_path: Path) -> None:
    rows = [
        f"{T0 + 1000},A,100,1",
        f"{T0 + 0},B,50,1",  # earlier than A's last tick: another market, fine
        f"{T0 + 2000},A,101,1",
        f"{T0 + 500},B,51,1",
        f"{T0 + 1500},A,102,1",  # A goes backwards: line 6
        f"{T0 + 500},B,52,1",  # equal time is not backwards
    ]
    path = write(tmp_path, "\n".join([HEADER, *rows]) + "\n")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.report == [f"{path}:6: time goes backwards for market 'A' (2022-01-01T00:00:01.500Z <"
                           f" 2022-01-01T00:00:02Z; ms {T0 + 1500} < {T0 + 2000})"]
    by_id = {m.market_id: m for m in data.markets}
    np.testing.assert_array_equal(by_id["A"].price, [100.0, 101.0])
    np.testing.assert_array_equal(by_id["B"].price, [50.0, 51.0, 52.0])


def test_several_files_report_their_own_names_and_lines(tmp_path: Path) -> None:
    a = write(tmp_path, "\n".join([HEADER, *good_rows(3), f"{T0 + 9000},A,x,1"]) + "\n", "a.csv")
    b = write(tmp_path, "\n".join([HEADER, f"{T0 + 10_000},B,0,1", *good_rows(3, "B", start=11)]) + "\n", "b.csv")
    data = load_csv_files([a, b], max_bad_fraction=0.5)
    assert data.report == [f"{a}:5: price 'x' is not a number", f"{b}:2: price 0.0 is not > 0"]


def test_blank_lines_are_skipped_and_line_numbers_stay_true(tmp_path: Path) -> None:
    path = write(tmp_path, "\n".join([HEADER, good_rows(1)[0], "", " , , , ", f"{T0 + 5000},A,-1,1"]) + "\n")
    data = load_csv_files([path], max_bad_fraction=0.9)
    assert data.rows == 2 and data.bad_rows == 1
    assert data.report == [f"{path}:5: price -1.0 is not > 0"]


def test_too_many_bad_rows_fail_with_the_report(tmp_path: Path) -> None:
    # 100 rows, 3 bad: 3% > 2%
    rows = [*good_rows(97), f"{T0 + 10 ** 8},A,0,1", f"{T0 + 10 ** 8},A,nan,1", f"{T0 + 10 ** 8},A,1"]
    path = write(tmp_path, "\n".join([HEADER, *rows]) + "\n")
    with pytest.raises(DataError) as exc:
        load_csv_files([path], max_bad_fraction=0.02)
    msg = str(exc.value)
    assert "3 of 100 rows are bad" in msg and "max_bad_row_fraction" in msg
    assert f"{path}:99: price 0.0 is not > 0" in msg
    assert exc.value.report == [f"{path}:99: price 0.0 is not > 0", f"{path}:100: price 'nan' is not finite",
                                f"{path}:101: expected 4 fields, got 3"]


def test_training_job_fails_above_the_fraction_with_the_report(tmp_path: Path, make_config: ConfigFactory) -> None:
    rows = [*good_rows(97), f"{T0 + 10**8},A,0,1", f"{T0 + 10**8},A,nan,1", f"{T0 + 10**8},A,1"]
    path = write(tmp_path, "\n".join([HEADER, *rows]) + "\n")
    cfg = make_config(training={"max_bad_row_fraction": 0.02})
    with pytest.raises(DataError) as exc:
        run_training(cfg, [path], 1, lambda d: None, None)
    assert exc.value.report[0] == f"{path}:99: price 0.0 is not > 0" and len(exc.value.report) == 3
    assert not (tmp_path / "state" / "models").exists()


def test_bad_rows_below_the_fraction_pass(tmp_path: Path) -> None:
    rows = [*good_rows(97), f"{T0 + 10 ** 8},A,0,1", f"{T0 + 10 ** 8},A,nan,1", f"{T0 + 10 ** 8},A,1"]
    path = write(tmp_path, "\n".join([HEADER, *rows]) + "\n")
    data = load_csv_files([path], max_bad_fraction=0.03)  # 3% is not above 3%
    assert data.bad_rows == 3 and data.ticks == 97 and len(data.report) == 3


def test_default_fraction_is_one_percent(tmp_path: Path) -> None:
    rows = [*good_rows(98), f"{T0 + 10 ** 8},A,0,1", f"{T0 + 10 ** 8},A,0,1"]
    path = write(tmp_path, "\n".join([HEADER, *rows]) + "\n")
    with pytest.raises(DataError, match="2 of 100 rows are bad"):
        load_csv_files([path])


def test_file_without_good_rows_fails(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "\n")
    with pytest.raises(DataError, match="no valid tick rows") as exc:
        load_csv_files([path])
    assert str(exc.value).endswith("no data rows after the header")


def test_file_of_bad_rows_only_fails_saying_why(tmp_path: Path) -> None:
    rows = [f"2020-01-{d:02d},A,x{d},1" for d in range(1, 31)]
    path = write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    lines = str(exc.value).splitlines()
    assert lines[0] == f"no valid tick rows in {path}: all 30 rows are bad:"
    assert lines[1] == f"{path}:2: price 'x1' is not a number" and len(lines) == 31


def test_a_spreadsheet_export_separated_by_semicolons_with_decimal_commas(tmp_path: Path) -> None:
    """As a spreadsheet with a European locale saves CSV: ';' between fields, decimal commas, day-first dates."""
    path = write(tmp_path, "\ufeffDatum;Date;Close;Volume\nx;13.01.2020;1.234,50;1.000\ny;14.01.2020;1,5;2,5K\n"
                           "z;15.01.2020;7;0\n", "DAX.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert data.report == [] and m.price.tolist() == [1234.5, 1.5, 7.0] and m.volume.tolist() == [1000.0, 2500.0, 0.0]
    assert m.timestamp.tolist() == [utc_ms(2020, 1, 13), utc_ms(2020, 1, 14), utc_ms(2020, 1, 15)]
    assert f"{path}: fields separated by ';'; decimal commas read, '.' between digit groups" in data.notes
    points = write(tmp_path, "date;price;volume\n2020-01-02;1.000;5\n2020-01-03;1.5;6\n", "points.csv")
    data = load_csv_files([points])  # no comma in any number: points are decimal points
    assert data.report == [] and data.markets[0].price.tolist() == [1.0, 1.5]
    assert data.notes[-1] == f"{points}: fields separated by ';'"
    mixed = write(tmp_path, "date;price\n2020-01-02;1,5\n2020-01-03;1.5\n", "mixed.csv")
    data = load_csv_files([mixed], max_bad_fraction=0.5)
    assert data.markets[0].price.tolist() == [1.5] and data.report == [f"{mixed}:3: price '1.5' is not a number"]


def test_tab_and_pipe_separated_files(tmp_path: Path) -> None:
    for sep, named in (("\t", "tabs"), ("|", "'|'")):
        rows = [sep.join(["timestamp", "market_id", "price", "volume"])] + [sep.join(r.split(",")) for r in good_rows(3)]
        path = write(tmp_path, "\n".join(rows) + "\n", f"t{len(named)}.csv")
        data = load_csv_files([path])
        assert data.report == [] and data.markets[0].price.tolist() == [100.0, 101.0, 102.0]
        assert data.notes == [f"{path}: fields separated by {named}"]


def test_a_comma_file_keeps_its_points_and_a_semicolon_file_its_commas(tmp_path: Path) -> None:
    comma = write(tmp_path, 'date,price\n2020-01-02,"1,5"\n2020-01-03,2.5\n', "c.csv")
    data = load_csv_files([comma], max_bad_fraction=0.5)
    assert data.markets[0].price.tolist() == [2.5] and "a comma is read only between groups" in data.report[0]
    semi = write(tmp_path, "date;price\n2020-01-02;1,2,3\n2020-01-03;2,5\n", "s.csv")
    data = load_csv_files([semi], max_bad_fraction=0.5)
    assert data.markets[0].price.tolist() == [2.5] and data.report == [f"{semi}:2: price '1,2,3' is not a number"]
    tiny = write(tmp_path, "date;price\n2020-01-02;-\n2020-01-03;,\n2020-01-04;2,5\n", "t.csv")
    data = load_csv_files([tiny], max_bad_fraction=1.0)
    assert data.markets[0].price.tolist() == [2.5] and len(data.report) == 2


DATE_AND_TIME_FILES = {  # a <DATE> column completed by a <TIME> column: (file name, text, market, times, prices, volumes)
    # MetaTrader 5's "Export Bars": tab-separated, <NAMES> in angle brackets, 2020.01.02 and 00:00:00 apart
    "metatrader": ("EURUSD_H1.csv", "<DATE>\t<TIME>\t<OPEN>\t<HIGH>\t<LOW>\t<CLOSE>\t<TICKVOL>\t<VOL>\t<SPREAD>\n"
                   "2020.01.02\t00:00:00\t1.12122\t1.12257\t1.12003\t1.12125\t3456\t0\t10\n"
                   "2020.01.02\t01:00:00\t1.12125\t1.12200\t1.12100\t1.12150\t2100\t0\t10\n", "EURUSD_H1",
                   [utc_ms(2020, 1, 2), utc_ms(2020, 1, 2, 1)], [1.12125, 1.1215], [3456, 2100]),
    # stooq's bulk files: <DATE> as YYYYMMDD, <TIME> as HHMMSS
    "stooq": ("aapl.us.txt", "<TICKER>,<PER>,<DATE>,<TIME>,<OPEN>,<HIGH>,<LOW>,<CLOSE>,<VOL>,<OPENINT>\n"
              "AAPL.US,5,20080102,153500,1,1,1,7.5,100,0\nAAPL.US,5,20080102,154000,1,1,1,7.6,90,0\n"
              "AAPL.US,5,20080103,093000,1,1,1,7.7,80,0\n", "AAPL.US",
              [utc_ms(2008, 1, 2, 15) + 2_100_000, utc_ms(2008, 1, 2, 15) + 2_400_000, utc_ms(2008, 1, 3, 9) + 1_800_000],
              [7.5, 7.6, 7.7], [100, 90, 80]),
}


@pytest.mark.parametrize("source", sorted(DATE_AND_TIME_FILES))
def test_a_date_column_completed_by_a_time_column(tmp_path: Path, source: str) -> None:
    name, text, market, times, prices, volumes = DATE_AND_TIME_FILES[source]
    path = write(tmp_path, text, name)
    data = load_csv_files([path])
    (m,) = data.markets
    assert data.report == [] and m.market_id == market and m.price.tolist() == prices
    assert m.timestamp.tolist() == times and m.volume.tolist() == volumes
    assert f"{path}: time from the <DATE> and <TIME> columns" in data.notes


def test_year_first_dates_with_dots_or_slashes(tmp_path: Path) -> None:
    path = write(tmp_path, "date,price\n2020.01.02,1\n2020/01/03 12:30,2\n2020.02.30,3\n")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.markets[0].timestamp.tolist() == [utc_ms(2020, 1, 2), utc_ms(2020, 1, 3, 12) + 1_800_000]
    assert data.report == [f"{path}:4: date '2020.02.30' is not a time (ms since epoch or ISO 8601)"]


def test_a_time_column_of_full_times_beside_a_date_column_stays_the_time(tmp_path: Path) -> None:
    path = write(tmp_path, "date,time,price\n2020-01-02,2020-01-02T10:00:00,1\n2020-01-02,2020-01-02T11:00:00,2\n")
    (m,) = load_csv_files([path]).markets
    assert m.timestamp.tolist() == [utc_ms(2020, 1, 2, 10), utc_ms(2020, 1, 2, 11)]


YF_MULTI_LEVEL = """Price,Close,High,Low,Open,Volume
Ticker,AAPL,AAPL,AAPL,AAPL,AAPL
Date,,,,,
2020-01-02,72.71,72.77,71.46,71.72,135480400
2020-01-03,72.01,72.99,71.84,71.94,146322800
2020-01-06,72.58,72.62,70.88,71.13,118387200
"""


def test_a_yfinance_download_with_its_three_header_lines(tmp_path: Path) -> None:
    """``yf.download("AAPL").to_csv(...)`` (yfinance 0.2.51 on): Price, Ticker and Date lines before the data."""
    path = write(tmp_path, YF_MULTI_LEVEL, "download.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert data.report == [] and data.rows == 3 and m.market_id == "AAPL"
    assert m.price.tolist() == [72.71, 72.01, 72.58] and m.volume.tolist() == [135480400, 146322800, 118387200]
    assert m.timestamp.tolist() == [utc_ms(2020, 1, 2), utc_ms(2020, 1, 3), utc_ms(2020, 1, 6)]
    assert data.notes == [f"{path}: market id 'AAPL' from the header's Ticker row"]
    lines = YF_MULTI_LEVEL.splitlines(keepends=True)
    newest = write(tmp_path, "".join(lines[:3] + lines[3:][::-1]), "newest.csv")
    assert load_csv_files([newest]).markets[0].timestamp.tolist() == m.timestamp.tolist()  # same header, rows reversed


def test_a_yfinance_download_saved_after_reset_index_is_not_read_at_its_row_numbers(tmp_path: Path) -> None:
    """``yf.download("AAPL").reset_index().to_csv(...)``: the first column, headed by the level name ``Price``, counts
    the rows; the date is a column of its own and the price is Close (the row numbers were read as the prices)."""
    path = write(tmp_path, "Price,Date,Close,High,Low,Open,Volume\nTicker,,AAPL,AAPL,AAPL,AAPL,AAPL\n"
                           "0,2020-01-02,72.71,72.77,71.46,71.72,135480400\n1,2020-01-03,72.01,72.99,71.84,71.94,146322800\n"
                           "2,2020-01-06,72.58,72.62,70.88,71.13,118387200\n", "download.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert data.report == [] and data.rows == 3 and m.market_id == "AAPL"
    assert m.price.tolist() == [72.71, 72.01, 72.58] and m.volume.tolist() == [135480400, 146322800, 118387200]
    assert m.timestamp.tolist() == [utc_ms(2020, 1, 2), utc_ms(2020, 1, 3), utc_ms(2020, 1, 6)]
    assert data.formats[0].price == "Close" and data.formats[0].header_lines == 2
    several = write(tmp_path, "Price,Date,Close,Close\nTicker,,AAPL,MSFT\n0,2020-01-02,1,2\n", "two.csv")
    with pytest.raises(DataError, match=r"two.csv:2: a download of 2 tickers \(AAPL, MSFT\); save one ticker per file"):
        load_csv_files([several])


def test_a_yfinance_download_of_several_tickers_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    path = write(tmp_path, "Price,Close,Close,Volume,Volume\nTicker,AAPL,MSFT,AAPL,MSFT\nDate,,,,\n"
                           "2020-01-02,72.71,160.62,135480400,22622100\n")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert str(exc.value) == (f"{path}:2: a download of 2 tickers (AAPL, MSFT); save one ticker per file "
                              "(yf.download(ticker).to_csv(...))")


def test_a_price_column_named_price_is_still_the_price(tmp_path: Path) -> None:
    path = write(tmp_path, "Price,Date,Volume\n10.5,2020-01-02,3\nTicker,2020-01-03,4\n")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.markets[0].price.tolist() == [10.5] and len(data.report) == 1


def test_quote_site_export_with_grouped_prices_suffixed_volumes_and_no_volume(tmp_path: Path) -> None:
    """As investing.com writes it: newest first, M/D/YYYY, quoted digit groups, volumes as 1.23M, '-' for none."""
    text = ('"Date","Price","Open","High","Low","Vol.","Change %"\n'
            '"01/15/2020","3,289.29","3,282.27","3,298.66","3,280.69","1.23M","0.19%"\n'
            '"01/14/2020","3,283.15","3,285.35","3,294.25","3,277.19","456.5K","-0.15%"\n'
            '"01/13/2020","3,288.13","3,271.13","3,288.13","3,268.43","-","0.70%"\n'
            '"01/10/2020","3,265.35","3,281.81","3,282.99","3,260.86","2B","-0.29%"\n')
    path = write(tmp_path, text, "SPX.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert data.report == [] and m.market_id == "SPX"
    assert m.timestamp.tolist() == [utc_ms(2020, 1, 10), utc_ms(2020, 1, 13), utc_ms(2020, 1, 14), utc_ms(2020, 1, 15)]
    assert m.price.tolist() == [3265.35, 3288.13, 3283.15, 3289.29]
    assert m.volume.tolist() == [2e9, 0.0, 456.5e3, 1.23e6]
    assert f"{path}: 1 row without a volume (Vol. empty or '-'); volume 0 used" in data.notes
    assert f"{path}: rows run newest first; read in reverse" in data.notes


# --------------------------------------------------------------------------------------
# Files whose rows run newest first
# --------------------------------------------------------------------------------------


def test_a_file_whose_rows_run_newest_first_is_read_oldest_first(tmp_path: Path) -> None:
    rows = [f"2020-01-{d:02d},{100 + d},{d}" for d in range(1, 31)]
    forward = write(tmp_path, "Date,Close,Volume\n" + "\n".join(rows) + "\n", "fwd.csv")
    newest = write(tmp_path, "Date,Close,Volume\n" + "\n".join(rows[::-1]) + "\n", "new.csv")
    a, b = load_csv_files([forward]), load_csv_files([newest])
    assert b.report == [] and f"{newest}: rows run newest first; read in reverse" in b.notes
    assert not any("newest first" in n for n in a.notes)
    for field in ("timestamp", "price", "volume"):
        np.testing.assert_array_equal(getattr(a.markets[0], field), getattr(b.markets[0], field))


def test_interleaved_markets_newest_first_and_a_row_out_of_direction(tmp_path: Path) -> None:
    rows = [f"{T0 + 1000 * k},{m},{100 + k},1" for k in range(40) for m in ("A", "B")][::-1]
    rows.insert(10, f"{T0 + 1000 * 39 + 5},A,1,1")  # newer than the A row above it: against the file's direction
    path = write(tmp_path, "\n".join([HEADER, *rows]) + "\n")
    data = load_csv_files([path], max_bad_fraction=0.1)
    assert data.report == [f"{path}:12: time goes forwards for market 'A' in rows that run newest first "
                           f"(2022-01-01T00:00:39.005Z > 2022-01-01T00:00:35Z; ms {T0 + 39_005} > {T0 + 35_000})"]
    for m in data.markets:
        assert m.timestamp.tolist() == [T0 + 1000 * k for k in range(40)] and m.price.tolist() == [100 + k for k in range(40)]


def test_markets_in_blocks_newest_first(tmp_path: Path) -> None:
    """All of A, then all of B, each block newest first (as per-symbol downloads concatenated)."""
    rows = [f"{T0 + 1000 * k},{m},{100 + k},1" for m in ("A", "B") for k in reversed(range(30))]
    path = write(tmp_path, "\n".join([HEADER, *rows]) + "\n")
    data = load_csv_files([path])
    assert data.report == [] and f"{path}: rows run newest first; read in reverse" in data.notes
    assert [m.timestamp.tolist() for m in data.markets] == [[T0 + 1000 * k for k in range(30)]] * 2


def test_a_forward_file_with_an_older_row_at_either_end_stays_forward(tmp_path: Path) -> None:
    for glitch_at in (1, 30):
        rows = [f"{T0 + 1000 * k},A,{100 + k},1" for k in range(30)]
        rows.insert(glitch_at, f"{T0 - 5000},A,1,1")
        path = write(tmp_path, "\n".join([HEADER, *rows]) + "\n")
        data = load_csv_files([path], max_bad_fraction=0.1)
        assert len(data.report) == 1 and "time goes backwards" in data.report[0] and data.ticks == 30, glitch_at


def test_a_newest_first_file_continues_an_earlier_file_only_after_it(tmp_path: Path) -> None:
    old = write(tmp_path, "\n".join([HEADER, *good_rows(20)]) + "\n", "old.csv")
    later = write(tmp_path, "\n".join([HEADER, *good_rows(20, start=20)[::-1]]) + "\n", "later.csv")
    data = load_csv_files([old, later])
    assert data.report == [] and data.markets[0].timestamp.tolist() == [T0 + 1000 * k for k in range(40)]
    overlap = write(tmp_path, "\n".join([HEADER, *good_rows(20, start=15)[::-1]]) + "\n", "overlap.csv")
    data = load_csv_files([old, overlap], max_bad_fraction=0.5)
    assert len(data.report) == 4 and all("in an earlier file" in r for r in data.report)
    assert data.markets[0].timestamp.tolist() == [T0 + 1000 * k for k in range(20)] + [T0 + 1000 * k for k in range(19, 35)]


# --------------------------------------------------------------------------------------
# Dates written with slashes
# --------------------------------------------------------------------------------------


def test_month_first_slash_dates_are_read_when_the_column_shows_the_order(tmp_path: Path) -> None:
    """arch's S&P 500 file writes its dates M/D/YYYY."""
    path = write(tmp_path, "Date,Open,High,Low,Close,Adj Close,Volume\n"
                           "1/12/1999,1,1,1,10,10,5\n1/13/1999,1,1,1,11,11,5\n2/1/1999,1,1,1,12,12,5\n", "SP500.csv")
    data = load_csv_files([path])
    assert data.report == [] and data.markets[0].timestamp.tolist() == [utc_ms(1999, 1, 12), utc_ms(1999, 1, 13),
                                                                        utc_ms(1999, 2, 1)]
    assert f"{path}: Date: dates read as month/day/year" in data.notes


def test_dukascopy_export_with_day_first_dotted_dates(tmp_path: Path) -> None:
    path = write(tmp_path, "Gmt time,Open,High,Low,Close,Volume\n01.01.2020 22:00:00.000,1.1,1.2,1.0,1.12,5.5\n"
                           "13.01.2020 22:00:00.000,1.1,1.2,1.0,1.13,6\n", "EURUSD_Candlestick_1_D_BID.csv")
    data = load_csv_files([path])
    assert data.report == [] and data.markets[0].timestamp.tolist() == [utc_ms(2020, 1, 1, 22), utc_ms(2020, 1, 13, 22)]
    assert f"{path}: Gmt time: dates read as day/month/year" in data.notes


def test_dotted_dates_that_do_not_show_the_order_are_day_first(tmp_path: Path) -> None:
    path = write(tmp_path, "Gmt time,Close\n02.01.2020 00:00:00.000,1\n03.01.2020 00:00:01.500,2\n")
    data = load_csv_files([path])
    assert data.markets[0].timestamp.tolist() == [utc_ms(2020, 1, 2), utc_ms(2020, 1, 3) + 1500]
    assert f"{path}: Gmt time: dates read as day/month/year" in data.notes


def test_dukascopy_local_times_with_a_gmt_offset(tmp_path: Path) -> None:
    path = write(tmp_path, "Local time,Open,High,Low,Close,Volume\n02.01.2020 00:00:00.000 GMT+0100,1,1,1,1.5,2\n"
                           "02.01.2020 01:00:00.000 GMT-0530,1,1,1,1.6,3\n03.01.2020 00:00:00.000 UTC,1,1,1,1.7,3\n")
    data = load_csv_files([path])
    assert data.report == []
    assert data.markets[0].timestamp.tolist() == [utc_ms(2020, 1, 1, 23), utc_ms(2020, 1, 2, 6) + 1_800_000,
                                                  utc_ms(2020, 1, 3)]


def test_quotes_are_read_as_the_mid_of_bid_and_ask_with_both_sides_volumes(tmp_path: Path) -> None:
    path = write(tmp_path, "Gmt time,Ask,Bid,AskVolume,BidVolume\n02.01.2020 00:00:00.123,1.12110,1.12100,1.5,2.25\n"
                           "02.01.2020 00:00:00.500,1.12120,1.12100,,0.75\n02.01.2020 00:00:01.000,1.1213,0,1,1\n"
                           "02.01.2020 00:00:02.000,1.1213,1.1212,1,-1\n", "EURUSD_Ticks.csv")
    data = load_csv_files([path], max_bad_fraction=0.5)
    (m,) = data.markets
    assert m.market_id == "EURUSD_Ticks" and m.timestamp.tolist() == [utc_ms(2020, 1, 2) + 123, utc_ms(2020, 1, 2) + 500]
    assert m.price.tolist() == [0.5 * (1.12110 + 1.12100), 0.5 * (1.12120 + 1.12100)] and m.volume.tolist() == [3.75, 0.75]
    assert data.report == [f"{path}:4: Bid 0.0 is not > 0", f"{path}:5: BidVolume -1.0 is negative"]
    assert f"{path}: price is the mid of 'Bid' and 'Ask'" in data.notes
    assert f"{path}: volume is 'BidVolume' + 'AskVolume'" in data.notes
    assert f"{path}: 1 row without a volume (BidVolume or AskVolume empty or '-'); volume 0 used" in data.notes
    f = data.formats[0]
    assert (f.price, f.ask, f.volume, f.ask_volume) == ("Bid", "Ask", "BidVolume", "AskVolume")


def test_a_metatrader_tick_export_is_read_as_quotes(tmp_path: Path) -> None:
    """MetaTrader 5's tick export: <LAST> and <VOLUME> empty for currencies, and only the side that changed written."""
    path = write(tmp_path, "<DATE>\t<TIME>\t<BID>\t<ASK>\t<LAST>\t<VOLUME>\t<FLAGS>\n"
                           "2020.01.02\t00:00:00.123\t1.12100\t1.12110\t\t\t6\n"
                           "2020.01.02\t00:00:00.500\t1.12102\t\t\t\t2\n"
                           "2020.01.02\t00:00:01.000\t\t1.12120\t\t\t4\n", "EURUSD_ticks.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert data.report == [] and m.timestamp.tolist() == [utc_ms(2020, 1, 2) + 123, utc_ms(2020, 1, 2) + 500,
                                                          utc_ms(2020, 1, 2) + 1000]
    assert m.price.tolist() == [0.5 * (1.12100 + 1.12110), 0.5 * (1.12102 + 1.12110), 0.5 * (1.12102 + 1.12120)]
    assert f"{path}: <LAST> is empty; price is the mid of '<BID>' and '<ASK>' (an empty side keeps its previous value)" \
        in data.notes
    first_empty = write(tmp_path, "time,bid,ask\n2022-01-01,1,\n2022-01-02,1,2\n", "q.csv")
    assert load_csv_files([first_empty], max_bad_fraction=0.5).report == [
        f"{first_empty}:2: ask is empty and market 'q' has no earlier ask to keep"]


def test_a_price_column_is_used_before_bid_and_ask_and_one_side_is_not_enough(tmp_path: Path) -> None:
    path = write(tmp_path, "time,bid,ask,price,volume\n2022-01-01,1,3,7,1\n")
    data = load_csv_files([path])
    assert data.markets[0].price.tolist() == [7.0] and data.formats[0].ask is None
    path = write(tmp_path, "time,bid,bid size\n2022-01-01,1,3\n")
    with pytest.raises(DataError, match=r"no price column \(expected one of .*, or a bid and an ask column\)"):
        load_csv_files([path])


def test_date_times_written_as_twelve_or_fourteen_digits_are_not_ms_of_1976(tmp_path: Path) -> None:
    # 202401020930 (YYYYMMDDHHMM) is also a plausible ms time (1976-05-31): it must not be read as one
    path = write(tmp_path, "time,close\n202401020930,1\n202401020931,2\n202401021000,3\n202401023099,4\n", "m1.csv")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.markets[0].timestamp.tolist() == [utc_ms(2024, 1, 2, 9, 30), utc_ms(2024, 1, 2, 9, 31),
                                                  utc_ms(2024, 1, 2, 10, 0)]
    assert data.formats[0].time_unit == "datetime" and len(data.report) == 1 and "'202401023099'" in data.report[0]
    assert any("read as date-times written YYYYMMDDHHMM[SS]" in n for n in data.notes)
    path = write(tmp_path, "time,close\n20240102093000,1\n20240102093015,2\n", "s1.csv")
    data = load_csv_files([path])
    assert data.markets[0].timestamp.tolist() == [utc_ms(2024, 1, 2, 9, 30), utc_ms(2024, 1, 2, 9, 30, 15)]
    # 12-digit ms of 1990 are not date-times (year 6311): still ms
    path = write(tmp_path, "timestamp,close\n631152000000,1\n631152060000,2\n", "ms.csv")
    data = load_csv_files([path])
    assert data.markets[0].timestamp.tolist() == [631152000000, 631152060000]


def test_date_hours_written_as_ten_digits_are_not_seconds_of_2034(tmp_path: Path) -> None:
    # 2024010209 (YYYYMMDDHH) is also a plausible time in seconds (2034-02-20): hourly exports write it so
    hours = "".join(f"{2024010200 + h},{100 + h}\n" for h in range(24))
    path = write(tmp_path, f"time,close\n{hours}2024010300,1\n", "h1.csv")
    data = load_csv_files([path])
    assert data.report == [] and data.formats[0].time_unit == "datehour"
    assert data.markets[0].timestamp.tolist() == [utc_ms(2024, 1, 2, h) for h in range(24)] + [utc_ms(2024, 1, 3)]
    assert f"{path}: time read as date-hours written YYYYMMDDHH (the first, 2024010200, is 2024-01-02 00:00 UTC; as" \
        " seconds since the epoch it would be a time still to come)" in data.notes
    # a float column (2024010209.0) too; in a file of date-hours a later row that is none is a bad row
    path = write(tmp_path, "time,close\n2024010209.0,1\n2024010210.0,2\n", "h2.csv")
    assert load_csv_files([path]).markets[0].timestamp.tolist() == [utc_ms(2024, 1, 2, 9), utc_ms(2024, 1, 2, 10)]


def test_ten_digit_seconds_stay_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # genuine seconds of 2024 (1.7e9) are no date-hour (year 1704): seconds, as before
    secs = "".join(f"{1704186000 + 3600 * h},{100 + h}\n" for h in range(24))
    path = write(tmp_path, f"timestamp,close\n{secs}", "s.csv")
    data = load_csv_files([path])
    assert data.formats[0].time_unit == "s" and data.markets[0].timestamp[0] == utc_ms(2024, 1, 2, 9)
    # ten digits that are a date-hour but whose later times are not: seconds (of 2034), as the column shows
    mixed = "".join(f"{2024010209 + 3600 * h},{100 + h}\n" for h in range(5))
    path = write(tmp_path, f"timestamp,close\n{mixed}", "m.csv")
    data = load_csv_files([path])
    assert data.formats[0].time_unit == "s" and data.markets[0].timestamp[0] == 2024010209000
    # once a date-hour read as seconds is no longer a time to come, it may be seconds: then seconds
    from cerebellar_norse.training import csvformat
    monkeypatch.setattr(csvformat, "_now_ms", lambda: 2_100_000_000_000)  # 2036-07-18
    path = write(tmp_path, "timestamp,close\n2024010209,1\n2024010210,2\n", "late.csv")
    data = load_csv_files([path])
    assert data.formats[0].time_unit == "s" and data.markets[0].timestamp[0] == 2024010209000


def test_an_unnamed_first_column_that_counts_rows_is_not_read_as_times(tmp_path: Path) -> None:
    # df[["Close", "Volume"]].to_csv(...) writes a RangeIndex 0, 1, 2, ...: not ms times of 1970-01-01
    for head in ("", "Unnamed: 0"):
        path = write(tmp_path, f"{head},Close,Volume\n0,100,1\n1,101,1\n2,102,1\n", "x.csv")
        with pytest.raises(DataError, match=r"x.csv:1: the unnamed first column counts the rows \(0, 1, 2, …"):
            load_csv_files([path])
    path = write(tmp_path, ",Close\n2020-01-02,1\n2020-01-03,2\n", "y.csv")
    assert len(load_csv_files([path]).markets[0]) == 2


def test_a_placeholder_first_time_does_not_decide_how_the_column_is_read(tmp_path: Path) -> None:
    # a first "nan" / "N/A" must not make a file of seconds read as ms (1970-01-20), nor hide its slash dates
    secs = "".join(f"{1704067200 + 60 * i},{100 + i % 7}\n" for i in range(300))
    for junk in ("nan", "N/A", "null", "-"):
        path = write(tmp_path, f"timestamp,price\n{junk},100\n{secs}", "s.csv")
        data = load_csv_files([path])
        assert data.markets[0].timestamp[0] == utc_ms(2024, 1, 1) and data.bad_rows == 1
        assert data.formats[0].time_unit == "s"
    days = "".join(f"1/{d}/2020,{d}\n" for d in range(1, 29))
    path = write(tmp_path, f"Date,Close\nnull,1\n{days}", "d.csv")
    data = load_csv_files([path], max_bad_fraction=0.05)
    assert data.markets[0].timestamp[-1] == utc_ms(2020, 1, 28) and data.bad_rows == 1


def test_dates_written_as_eight_digits(tmp_path: Path) -> None:
    path = write(tmp_path, "date,close\n20040817,1\n20040818,2\n20041301,3\n1092700800000,4\n", "002032.csv")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.markets[0].timestamp.tolist() == [utc_ms(2004, 8, 17), utc_ms(2004, 8, 18)]
    assert data.report == [f"{path}:4: date '20041301' is not a date written YYYYMMDD (as the file's first time is)",
                           f"{path}:5: date '1092700800000' is not a date written YYYYMMDD (as the file's first time is)"]
    assert f"{path}: date read as dates written YYYYMMDD (the first, 20040817)" in data.notes
    assert data.formats[0].time_unit == "date"
    # the same column as a float column writes it (pandas, when the column had a gap): still dates, not 1970 ms
    path = write(tmp_path, "date,close\n19991110.0,1\n19991111.0,2\n19991112.5,3\n", "987654.csv")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.markets[0].timestamp.tolist() == [utc_ms(1999, 11, 10), utc_ms(1999, 11, 11)]
    assert data.formats[0].time_unit == "date" and len(data.report) == 1 and "'19991112.5'" in data.report[0]


def test_spreadsheet_times_after_slash_dates(tmp_path: Path) -> None:
    path = write(tmp_path, "Date,Close\n1/2/2020 0:15,1\n1/2/2020 1:00:00 PM,2\n1/13/2020 12:00:00 AM,3\n", "ES.csv")
    data = load_csv_files([path])
    assert data.report == [] and data.markets[0].timestamp.tolist() == [
        utc_ms(2020, 1, 2) + 900_000, utc_ms(2020, 1, 2, 13), utc_ms(2020, 1, 13)]


def test_an_empty_time_of_day_is_a_bad_row(tmp_path: Path) -> None:
    rows = "".join(f"2020-01-{d:02d},10:00:00,{d}\n" for d in range(1, 10))
    path = write(tmp_path, f"Date,Time,Close\n{rows}2020-01-10,,1\n")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.report == [f"{path}:11: Time is empty (a time of day is needed beside Date)"] and data.ticks == 9
    assert not data.formats[0].newest_first


def test_times_rounded_by_scientific_notation_are_bad_rows(tmp_path: Path) -> None:
    """Spreadsheets save 13-digit ms as 1.57784E+12: the ticks would collapse onto a few times."""
    path = write(tmp_path, "timestamp,price\n1577836800123,1\n1.57784E+12,2\n1.577836801123e12,3\n")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.report == [f"{path}:3: timestamp '1.57784E+12' keeps 6 significant digits (scientific notation, as"
                           " spreadsheets save long numbers): save the column as a number with all its digits"]
    assert data.markets[0].timestamp.tolist() == [1577836800123, 1577836801123]  # every digit kept: read


def test_a_time_of_another_unit_in_a_newest_first_file_is_a_bad_row(tmp_path: Path) -> None:
    """CryptoDataDownload's unix column switched from seconds to ms: read newest first, the seconds are not 1970."""
    rows = [f"{1593561600000 - 3_600_000 * k},BTC,{9000 + k}" for k in range(40)]
    rows += [f"{1593561600 - 3600 * k},BTC,{9000 + k}" for k in range(40, 42)]
    path = write(tmp_path, "unix,symbol,close\n" + "\n".join(rows) + "\n")
    data = load_csv_files([path], max_bad_fraction=0.1)
    assert data.formats[0].newest_first and data.ticks == 40
    assert data.report[0] == (f"{path}:42: unix '{1593561600 - 3600 * 40}' read as ms since epoch is before 1973-03-03,"
                              " unlike the file's first time: a time in another unit?")


def test_trading_platforms_date_times(tmp_path: Path) -> None:
    """Interactive Brokers (a zone name after the time, blanks repeated) and NinjaTrader (100 ns after a blank)."""
    ib = write(tmp_path, "date,close\n20231002 09:30:00 US/Eastern,1\n20231002  09:31:00 US/Eastern,2\n", "SPY.csv")
    assert load_csv_files([ib]).markets[0].timestamp.tolist() == [utc_ms(2023, 10, 2, 13) + 1_800_000,
                                                                  utc_ms(2023, 10, 2, 13) + 1_860_000]
    nt = write(tmp_path, "time;last;volume\n20200102 093000 1230000;3230.25;1\n20200102 093001 0000000;3230.5;2\n",
               "ES.csv")
    assert load_csv_files([nt]).markets[0].timestamp.tolist() == [utc_ms(2020, 1, 2, 9) + 1_800_123,
                                                                  utc_ms(2020, 1, 2, 9) + 1_801_000]
    bad = write(tmp_path, "date,close\n20231002 09:30:00 Mars/Base,1\n20231002 09:31:00 US/Eastern,2\n", "x.csv")
    assert load_csv_files([bad], max_bad_fraction=0.5).report == [
        f"{bad}:2: date '20231002 09:30:00 Mars/Base' is not a time (ms since epoch or ISO 8601)"]


def test_a_header_that_does_not_match_any_row_says_so(tmp_path: Path) -> None:
    """backtrader's sample minute file: the header lacks its Time column, so every row has one field more."""
    path = write(tmp_path, "Date,Open,High,Low,Close,Volume,OpenInterest\n"
                           "2006-01-02,09:01:00,3602.0,3603.0,3597.0,3599.0,79,0\n2006-01-02,09:02:00,3599,3601,3598,3600,62,0\n")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert str(exc.value) == (f"{path}:1: the header names 7 columns but every row has 8 fields: a column name is missing"
                              " from the header")
    few = write(tmp_path, "time,price,volume\n2022-01-01,1\n2022-01-02,2,3\n", "few.csv")  # not every row: bad rows
    assert load_csv_files([few], max_bad_fraction=0.5).report == [f"{few}:2: expected 3 fields, got 2"]


def test_a_nasdaq_download_with_dollar_prices(tmp_path: Path) -> None:
    path = write(tmp_path, "Date,Close/Last,Volume,Open,High,Low\n01/30/2024,$184.25,58414460,$184.22,$185.88,$183.43\n"
                           "01/29/2024,\"$1,185.64\",82488670,$187.15,$188.44,$183.885\n", "AAPL.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert data.report == [] and m.price.tolist() == [1185.64, 184.25] and data.formats[0].price == "Close/Last"


def test_a_site_name_above_the_header_is_skipped(tmp_path: Path) -> None:
    path = write(tmp_path, "https://www.CryptoDataDownload.com\nunix,date,symbol,open,high,low,close,Volume BTC,Volume USDT\n"
                           "1577923200000,2020-01-02 00:00:00,BTC/USDT,1,1,1,7200.5,10.5,75600\n"
                           "1577836800000,2020-01-01 00:00:00,BTC/USDT,1,1,1,7100.25,11,78100\n", "Binance_BTCUSDT_d.csv")
    data = load_csv_files([path])
    (m,) = data.markets
    assert m.market_id == "BTC/USDT" and m.timestamp.tolist() == [utc_ms(2020, 1, 1), utc_ms(2020, 1, 2)]
    assert m.price.tolist() == [7100.25, 7200.5] and m.volume.tolist() == [11.0, 10.5]
    assert data.notes == [f"{path}: volume from 'Volume BTC'", f"{path}: 1 line before the header skipped",
                          f"{path}: rows run newest first; read in reverse"]
    assert data.formats[0].header_lines == 2 and data.formats[0].time == "unix"
    bad = write(tmp_path, "title\n\nDate,Close\n2020-01-02,x\n2020-01-03,1\n", "bad.csv")
    assert load_csv_files([bad], max_bad_fraction=0.5).report == [f"{bad}:4: Close 'x' is not a number"]


def test_day_first_slash_dates_with_times_are_read_when_the_column_shows_the_order(tmp_path: Path) -> None:
    path = write(tmp_path, "time,price\n02/03/2021 15:30,1\n25/03/2021T09:00:00.250,2\n01/04/2021,3\n")
    (m,) = load_csv_files([path]).markets
    assert m.timestamp.tolist() == [utc_ms(2021, 3, 2) + 55_800_000, utc_ms(2021, 3, 25) + 32_400_250, utc_ms(2021, 4, 1)]


@pytest.mark.parametrize(("dates", "problem"), [
    (["1/2/2020", "3/4/2020"], "could be month/day or day/month"),
    (["1/13/2020", "13/1/2020"], "mixes day-first ('13/1/2020') and month-first ('1/13/2020') dates"),
])
def test_slash_dates_of_unknown_order_are_refused_naming_the_file(tmp_path: Path, dates: list[str], problem: str) -> None:
    path = write(tmp_path, "date,price\n" + "".join(f"{d},1\n" for d in dates))
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert str(exc.value).startswith(f"{path}: date ") and problem in str(exc.value)


def test_a_slash_date_that_is_no_date_costs_its_row(tmp_path: Path) -> None:
    rows = [f"1/{d}/2020,{d}" for d in range(1, 31)] + ["2/30/2020,1", "3/1/2020,1"]
    path = write(tmp_path, "date,price\n" + "\n".join(rows) + "\n")
    data = load_csv_files([path], max_bad_fraction=0.1)
    assert data.report == [f"{path}:32: date '2/30/2020' is not a valid date read as M/D/YYYY"] and data.ticks == 31


def test_missing_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot open"):
        load_csv_files([tmp_path / "nope.csv"])


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A file checked by POST /training and replaced by a FIFO before the job reads it: the job fails naming it,
    rather than waiting forever for a writer (and holding the one job slot until it is cancelled)."""
    import threading

    fifo = tmp_path / "ticks.csv"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_csv_files([fifo])
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(30.0)
    if reader.is_alive():  # let the blocked open go on, so the thread ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert outcome, "load_csv_files waited on the FIFO for a writer"
    assert isinstance(outcome[0], DataError) and "not a regular file" in str(outcome[0]), outcome


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_file_without_line_breaks_is_refused_without_reading_it_whole(tmp_path: Path, gzipped: bool) -> None:
    """A data file that is no CSV (a disk image, a sparse file of NUL bytes): its first "line" was read into memory
    whole, twice its size in the job process (a 10 GB file, 20 GB), before the csv module's field limit refused it.
    It is refused after the first 1 MiB of it, naming it."""
    import gzip
    import tracemalloc

    size = 16 << 20
    path = tmp_path / "image.csv"
    path.write_bytes(gzip.compress(bytes(size)) if gzipped else bytes(size))
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as exc:
            load_csv_files([path])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size // 2, f"{peak} bytes held to refuse a file of {size}"
    assert str(exc.value).startswith(f"{path}: a line of more than") and "without a line break" in str(exc.value)


def test_rows_after_a_line_longer_than_the_line_bound_keep_their_line_numbers(tmp_path: Path) -> None:
    """A 2.6 MB line was read in 1 MiB pieces, each a bad row with a line number of its own: every row after it was
    named two lines too far on, and counted twice more."""
    lines = ["timestamp,price,volume,market_id"] + [f"{1_640_995_200_000 + k * 1000},{100 + k * 0.01},1,A"
                                                    for k in range(100)]
    lines.insert(5, "1640995204500," + "9" * 2_600_000 + ",1,A")
    lines.insert(20, "1640995219500,abc,1,A")
    path = tmp_path / "long.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    message = str(exc.value)
    assert "2 of 102 rows are bad" in message, message
    assert f"{path}:6: unreadable row" in message and f"{path}:21: price 'abc'" in message, message


# --------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------


def horizon_labels(price: np.ndarray, horizon: int, flat_band: float) -> np.ndarray:
    """Labels of a fixed band over a tick horizon (the shared labels module)."""
    spec = LabelSpec(horizon_ticks=horizon, volatility_band=False, flat_band=flat_band)
    return label_series(np.arange(float(price.shape[0])), price, spec).labels


def test_labels_over_the_horizon_with_the_flat_band() -> None:
    # horizon 2, flat band 0.01 (log return):
    # t0: log(102/100) = +0.0198 -> up;  t1: log(99.5/101) = -0.0150 -> down
    # t2: log(102.5/102) = +0.0049 -> flat; t3: log(95/99.5) = -0.0463 -> down
    # t4: log(95.5/102.5) = -0.0707 -> down; t5, t6: no label
    price = np.array([100.0, 101.0, 102.0, 99.5, 102.5, 95.0, 95.5])
    labels = horizon_labels(price, horizon=2, flat_band=0.01)
    assert labels.tolist() == [2, 0, 1, 0, 0, -1, -1]
    assert labels.dtype == np.int64


def test_flat_band_edges() -> None:
    band = 0.01
    price = np.array([100.0, 100.0 * math.exp(band), 100.0 * math.exp(band) * math.exp(-band * 1.0001)])
    # exactly +band is flat (|r| <= band); just below -band is down
    assert horizon_labels(price, 1, band).tolist() == [1, 0, -1]
    assert horizon_labels(price, 1, 0.0).tolist() == [2, 0, -1]


def test_last_horizon_ticks_have_no_label_and_short_series_none() -> None:
    price = np.linspace(100, 110, 20)
    labels = horizon_labels(price, horizon=7, flat_band=0.0)
    assert (labels[-7:] == -1).all() and (labels[:-7] == 2).all()
    assert horizon_labels(price[:7], 7, 0.0).tolist() == [-1] * 7
    assert horizon_labels(price[:3], 7, 0.0).tolist() == [-1] * 3


def test_class_counts_and_warnings_under_the_minimum() -> None:
    counts = class_counts([np.array([0, 0, 1, -1, 2]), np.array([1, 1, -1])])
    assert counts.tolist() == [2, 3, 1]
    warnings = class_warnings(np.array([MIN_SAMPLES_PER_CLASS - 1, MIN_SAMPLES_PER_CLASS, 50_000]))
    assert warnings == [f"class down has {MIN_SAMPLES_PER_CLASS - 1} samples, fewer than the recommended 10000"]
    assert MIN_SAMPLES_PER_CLASS == 10_000
    assert len(class_warnings(counts)) == 3
    assert class_warnings(np.array([10_000, 10_000, 10_000])) == []


# --------------------------------------------------------------------------------------
# Data file names (the jobs API takes names relative to paths.data_dir)
# --------------------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    (d / "a.csv").write_text(HEADER + "\n", encoding="utf-8")
    (d / "sub" / "b.csv").write_text(HEADER + "\n", encoding="utf-8")
    (tmp_path / "secret.csv").write_text(HEADER + "\n", encoding="utf-8")
    return d


def test_resolve_accepts_names_inside_the_data_dir(data_dir: Path) -> None:
    assert resolve_data_file(data_dir, "a.csv") == (data_dir / "a.csv").resolve()
    assert resolve_data_file(data_dir, "sub/b.csv") == (data_dir / "sub" / "b.csv").resolve()
    assert resolve_data_file(data_dir, "./sub/b.csv") == (data_dir / "sub" / "b.csv").resolve()


@pytest.mark.parametrize("name", ["/etc/passwd", "\\etc\\passwd", "../secret.csv", "sub/../../secret.csv", "..", "",
                                  "a.csv\x00", "\ud800.csv", "ok\udfff"])
def test_resolve_refuses_absolute_and_dotdot(data_dir: Path, name: str) -> None:
    with pytest.raises(InputError) as exc:
        resolve_data_file(data_dir, name)
    assert exc.value.field == "files"
    assert not isinstance(exc.value, DataError)


def test_resolve_refuses_absolute_path_even_inside_the_data_dir(data_dir: Path) -> None:
    with pytest.raises(InputError, match="relative to the data dir"):
        resolve_data_file(data_dir, str(data_dir / "a.csv"))


def test_resolve_refuses_symlinks_leading_outside(data_dir: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path / "secret.csv", data_dir / "link.csv")
    os.symlink(tmp_path, data_dir / "up")
    for name in ("link.csv", "up/secret.csv"):
        with pytest.raises(InputError, match="resolves outside the data dir") as exc:
            resolve_data_file(data_dir, name)
        assert exc.value.field == "files"
    os.symlink(data_dir / "sub" / "b.csv", data_dir / "inner.csv")  # a link within the data dir is fine
    assert resolve_data_file(data_dir, "inner.csv") == (data_dir / "sub" / "b.csv").resolve()


def test_resolve_refuses_missing_files_and_directories(data_dir: Path) -> None:
    for name in ("missing.csv", "sub", "."):
        with pytest.raises(InputError) as exc:
            resolve_data_file(data_dir, name)
        assert exc.value.field == "files"
    with pytest.raises(InputError, match="does not exist"):
        resolve_data_file(data_dir, "missing.csv")
    with pytest.raises(DataFileNotFoundError, match=r"'sub' in the data dir .* is a directory: training reads regular files"):
        resolve_data_file(data_dir, "sub")
    with pytest.raises(DataFileNotFoundError, match=r"no such file can exist in the data dir \(File name too long\)"):
        resolve_data_file(data_dir, "a" * 300 + ".csv")
    os.mkfifo(data_dir / "pipe.csv")
    with pytest.raises(DataFileNotFoundError, match=r"'pipe.csv' in the data dir .* is not a regular file \(a FIFO"):
        resolve_data_file(data_dir, "pipe.csv")


def test_unnamed_pandas_index_is_the_time_column(tmp_path: Path) -> None:
    f = tmp_path / "GOOG.csv"
    f.write_text(",Open,High,Low,Close,Volume\n2004-08-19,100,104.06,95.96,100.34,22351900\n"
                 "2004-08-20,101.01,109.08,100.5,108.31,11428600\n", encoding="utf-8")
    data = load_csv_files([f])
    m = data.markets[0]
    assert m.market_id == "GOOG" and m.price.tolist() == [100.34, 108.31]
    assert m.timestamp.tolist() == [1092873600000, 1092960000000]
    assert any("unnamed first column" in n for n in data.notes)
    bad = tmp_path / "x.csv"
    bad.write_text("a,Close\n1,2\n", encoding="utf-8")
    with pytest.raises(DataError, match="no time column"):
        load_csv_files([bad])


def test_a_date_with_a_fraction_in_the_first_row_is_named_as_such(tmp_path: Path) -> None:
    path = write(tmp_path, "date,close\n20080102.5,1\n20080102.75,2\n20080103.25,3\n", "frac.csv")
    with pytest.raises(DataError, match=r"date '20080102\.5' is a date YYYYMMDD with a fraction, which is no time format"
                                         r" read here: write the time of day in its own column"):
        load_csv_files([path])
    # ms since the epoch with a fraction keep their own message
    path = write(tmp_path, "time,close\n1577836800000.5,1\n", "ms.csv")
    with pytest.raises(DataError, match=r"is not a whole number of ms since epoch"):
        load_csv_files([path])


def test_lines_that_end_with_a_separator_are_read_with_a_note(tmp_path: Path) -> None:
    path = write(tmp_path, "date;close;volume\n2024-01-02;100,5;5;\n2024-01-03;101;6;\n2024-01-04;102;7\n", "eu.csv")
    data = load_csv_files([path])
    assert data.markets[0].price.tolist() == [100.5, 101.0, 102.0] and data.bad_rows == 0
    assert f"{path}: 2 rows end with a separator; the empty last field is ignored" in data.notes
    # an extra field that holds a value is no trailing separator: the header is off
    path = write(tmp_path, "date,close,volume\n2024-01-02,100,5,x\n2024-01-03,101,6,y\n", "off.csv")
    with pytest.raises(DataError, match="a column name is missing from the header"):
        load_csv_files([path])


@pytest.mark.parametrize("name", ["Time (UTC)", "transact_time", "window_start", "Datum"])
def test_vendor_time_headers(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, f"{name},close\n2024-01-02T09:30:00Z,1\n2024-01-02T09:31:00Z,2\n", "v.csv")
    data = load_csv_files([path])
    assert data.markets[0].timestamp.tolist() == [utc_ms(2024, 1, 2, 9, 30), utc_ms(2024, 1, 2, 9, 31)]


@pytest.mark.parametrize("newest_first", [False, True])
def test_loading_holds_a_few_numbers_per_row_not_python_objects(tmp_path: Path, newest_first: bool) -> None:
    """The loader's peak memory (traced, numpy arrays included) per row of a 40,000-row file stays near the ~65 bytes
    its 8-byte fields take while read and once sorted into markets: it was ~150 bytes with a Python object and a pointer per
    field of every row (a 5-million-row file held 0.7 GB more); the bound leaves room either way."""
    import tracemalloc

    n = 40_000
    path = tmp_path / "bars.csv"
    order = range(n - 1, -1, -1) if newest_first else range(n)
    path.write_text("timestamp,symbol,close,volume\n" + "".join(
        f"{1_600_000_000_000 + 60_000 * i},{'EURUSD' if i % 2 else 'GBPUSD'},{1.1 + (i % 977) * 1e-5:.5f},{i % 500}\n"
        for i in order))
    load_csv_files([path])  # warm the caches of the first load (the csv, time and number readers)
    tracemalloc.start()
    try:
        data = load_csv_files([path])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert data.ticks == n and all(np.all(np.diff(m.timestamp) > 0) for m in data.markets)
    assert peak / n < 100, f"{peak / n:.0f} bytes per row"


def test_slash_dates_without_a_day_above_12_are_read_in_the_order_that_makes_them_days_apart(tmp_path: Path) -> None:
    """mplfinance's ``examples/data/SP500_NOV2019_IDay.csv`` (minutes of 5-8 November 2019 written ``11/5/2019 9:30``)
    was refused: no day above 12 tells the order. Read day first its successive dates are a month apart (May 11, June
    11, …), month first a day apart, as days of bars are: it is read month first, noted; a day-first file of the same
    days is read day first."""
    minutes = ["9:30", "9:31", "15:59"]
    rows = [f"11/{d}/2019 {t},{3080 + d}" for d in (5, 6, 7, 8) for t in minutes]
    path = write(tmp_path, "Date,Close\n" + "\n".join(rows) + "\n", "SP500.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0 and data.markets[0].timestamp.tolist()[::3] == [
        utc_ms(2019, 11, d, 9, 30) for d in (5, 6, 7, 8)]
    assert (f"{path}: Date: no day above 12, but read as day/month its successive dates would be a month or more apart"
            " ('11/5/2019 9:30' and the next), read the other way days apart") in data.notes
    assert f"{path}: Date: dates read as month/day/year" in data.notes
    rows = [f"{d:02d}/11/2019 {t},{3080 + d}" for d in (5, 6, 7, 8) for t in minutes]
    path = write(tmp_path, "Date,Close\n" + "\n".join(rows) + "\n", "DAX.csv")
    assert load_csv_files([path]).markets[0].timestamp.tolist()[::3] == [utc_ms(2019, 11, d, 9, 30) for d in (5, 6, 7, 8)]
    path = write(tmp_path, "date,price\n01/03/2020,1\n02/03/2020,2\n03/03/2020,3\n04/03/2020,4\n", "d.csv")  # 1-4 March
    assert load_csv_files([path]).markets[0].timestamp.tolist() == [utc_ms(2020, 3, d) for d in (1, 2, 3, 4)]


@pytest.mark.parametrize("dates", [
    ["01/03/2020", "02/03/2020"],  # two dates: too few to tell
    ["01/03/2020", "03/05/2020", "05/07/2020"],  # months apart read either way
    ["01/01/2020", "02/02/2020", "03/03/2020"],  # a month apart read either way
])
def test_slash_dates_whose_gaps_do_not_tell_the_order_are_still_refused(tmp_path: Path, dates: list[str]) -> None:
    path = write(tmp_path, "date,price\n" + "".join(f"{d},1\n" for d in dates))
    with pytest.raises(DataError, match="could be month/day or day/month") as refused:
        load_csv_files([path])
    assert "training.date_order (or --date-order day-first|month-first)" in str(refused.value)


def test_a_given_date_order_reads_dates_that_cannot_tell_it(tmp_path: Path) -> None:
    """``training.date_order``: quotes of one day (``02/03/2010 16:53:50``, backtrader's bidask.csv) read either way."""
    path = write(tmp_path, "datetime,bid,ask\n02/03/2010 16:53:50,0.5,0.6\n02/03/2010 16:53:51,0.51,0.61\n", "bidask.csv")
    with pytest.raises(DataError, match="could be month/day or day/month"):
        load_csv_files([path])
    day = load_csv_files([path], day_first=True)
    assert day.markets[0].timestamp.tolist() == [utc_ms(2010, 3, 2, 16, 53) + 50_000, utc_ms(2010, 3, 2, 16, 53) + 51_000]
    assert f"{path}: datetime: dates read as day/month/year (training.date_order)" in day.notes
    month = load_csv_files([path], day_first=False)
    assert month.markets[0].timestamp.tolist() == [utc_ms(2010, 2, 3, 16, 53) + 50_000, utc_ms(2010, 2, 3, 16, 53) + 51_000]
    dots = write(tmp_path, "date,price\n03.04.2020,1\n04.04.2020,2\n", "dots.csv")  # dots alone say day first
    assert load_csv_files([dots], day_first=False).markets[0].timestamp.tolist() == [utc_ms(2020, 3, 4), utc_ms(2020, 4, 4)]


@pytest.mark.parametrize(("day_first", "date", "order"), [(True, "02/13/2010", "day/month"),
                                                          (False, "13/02/2010", "month/day")])
def test_a_given_date_order_that_a_date_contradicts_is_refused(tmp_path: Path, day_first: bool, date: str,
                                                               order: str) -> None:
    path = write(tmp_path, f"date,price\n01/02/2010,1\n{date},2\n")
    with pytest.raises(DataError, match=f"date '{date}' cannot be read as {order}"):
        load_csv_files([path], day_first=day_first)
    assert load_csv_files([path]).bad_rows == 0  # read from the column, the same file is read whole
