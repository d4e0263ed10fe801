"""Trading platforms' exports as quants bring them: MetaTrader 4's history and NinjaTrader's (HistData's) text
files without a header line, Kaggle's Bitstamp minutes with rows of NaN for minutes without trades, tables of several
series as columns, and holidays beside weekends in intraday bars."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from datetime import timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from training_helpers import utc_ms
from training_helpers import write_text_file as write

from cerebellar_norse.errors import DataError
from cerebellar_norse.training.data import MarketSeries, load_csv_files
from cerebellar_norse.training.datacheck import market_checks

# --------------------------------------------------------------------------------------
# MetaTrader 4's history export and NinjaTrader's text export: no header line
# --------------------------------------------------------------------------------------

LOOKS_LIKE_DATA = "(the first line looks like data: add a header line naming the columns)"


def mt4_bars(n: int) -> list[str]:
    """``n`` hourly MetaTrader 4 bars from 2020-01-02 00:00, close 1.1213 + k * 1e-4."""
    return [f"2020.01.{2 + k // 24:02d},{k % 24:02d}:00,{1.1212 + k * 1e-4:.4f},{1.1216 + k * 1e-4:.4f},"
            f"{1.1210 + k * 1e-4:.4f},{1.1213 + k * 1e-4:.4f},{100 + k}" for k in range(n)]


def test_a_metatrader4_history_export_is_read_by_its_layout(tmp_path: Path) -> None:
    path = write(tmp_path, "\r\n".join(mt4_bars(60)) + "\r\n", "EURUSD60.csv")
    data = load_csv_files([path])
    (market,) = data.markets
    assert market.market_id == "EURUSD60" and data.rows == 60 and data.bad_rows == 0
    assert market.timestamp[:2].tolist() == [utc_ms(2020, 1, 2), utc_ms(2020, 1, 2, 1)]
    assert market.timestamp[-1] == utc_ms(2020, 1, 4, 11)
    assert market.price[0] == pytest.approx(1.1213) and market.price[59] == pytest.approx(1.1272)  # the close
    assert market.volume[:2].tolist() == [100, 101]
    assert data.formats[0].header_lines == 0
    assert (f"{path}: no header line; read as MetaTrader 4's history export (date,time,open,high,low,close,volume;"
            " times in the broker's time zone, read in UTC: give that zone if it is not)") in data.notes


@pytest.mark.parametrize("lines", [
    [b.rsplit(",", 1)[0] for b in mt4_bars(3)],  # no volume: 6 fields
    mt4_bars(3)[::-1],  # times going back
    [b.replace("1.1216", "1.1200", 1) for b in mt4_bars(3)],  # a high below the close: no bar
    [b.replace("2020.01.", "2020-01-", 1) for b in mt4_bars(3)],  # another date
])
def test_rows_near_the_metatrader4_layout_are_still_told_to_add_a_header(tmp_path: Path, lines: list[str]) -> None:
    path = write(tmp_path, "\n".join(lines) + "\n", "EURUSD60.csv")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert str(exc.value).endswith(LOOKS_LIKE_DATA)


@pytest.mark.parametrize(("rows", "prices", "volumes", "first"), [
    # bars, as NinjaTrader exports them and HistData ships its ASCII minutes
    ([f"20200102 0{k}0000;3200.25;3210.00;3199.50;{3200.50 + k};{10 + k}" for k in range(5)],
     [3200.5, 3201.5, 3202.5, 3203.5, 3204.5], [10, 11, 12, 13, 14], utc_ms(2020, 1, 2)),
    # NinjaTrader 7's ticks: last and volume
    ([f"20200102 09300{k};{3200.25 + k / 4};{k + 1}" for k in range(5)],
     [3200.25, 3200.5, 3200.75, 3201.0, 3201.25], [1, 2, 3, 4, 5], utc_ms(2020, 1, 2, 9, 30)),
    # NinjaTrader 8's ticks: 100 ns after the seconds, last, bid, ask and volume
    ([f"20200102 093000 {k}000000;{3200.25 + k / 4};{3200.0 + k / 4};{3200.5 + k / 4};{k + 1}" for k in range(5)],
     [3200.25, 3200.5, 3200.75, 3201.0, 3201.25], [1, 2, 3, 4, 5], utc_ms(2020, 1, 2, 9, 30)),
])
def test_a_ninjatrader_text_export_is_read_by_its_layout(tmp_path: Path, rows: list[str], prices: list[float],
                                                           volumes: list[int], first: int) -> None:
    path = write(tmp_path, "\n".join(rows) + "\n", "ES 03-20.Last.txt")
    data = load_csv_files([path])
    (market,) = data.markets
    assert data.bad_rows == 0 and market.market_id == "ES 03-20.Last"
    assert market.price.tolist() == prices and market.volume.tolist() == volumes
    assert market.timestamp[0] == first
    assert any(n.startswith(f"{path}: no header line; read as NinjaTrader's (or HistData's) text export (time;")
               for n in data.notes)


def test_ninjatrader_s_100_ns_are_read_and_other_semicolon_rows_are_refused(tmp_path: Path) -> None:
    rows = [f"20200102 093000 {k}500000;3200.25;3200.0;3200.5;1" for k in range(3)]
    data = load_csv_files([write(tmp_path, "\n".join(rows) + "\n", "ES.txt")])
    assert data.markets[0].timestamp.tolist() == [utc_ms(2020, 1, 2, 9, 30) + 50 + 100 * k for k in range(3)]
    for lines in (["20200102;3200.25;1", "20200103;3200.5;2"],  # a date without a time of day
                  ["20200102 093000;3200.25;3200.5;3200.0;1"]):  # a bid above the ask
        path = write(tmp_path, "\n".join(lines) + "\n", "odd.txt")
        with pytest.raises(DataError) as exc:
            load_csv_files([path])
        assert str(exc.value).endswith(LOOKS_LIKE_DATA)


def test_a_histdata_tick_file_is_read_by_its_layout(tmp_path: Path) -> None:
    rows = [f"20190101 1700{k:02d}587,{1.14648 + k * 1e-5:.6f},{1.14668 + k * 1e-5:.6f},0" for k in range(60)]
    path = write(tmp_path, "\n".join(rows) + "\n", "DAT_ASCII_EURUSD_T_201901.csv")
    data = load_csv_files([path], zone=timezone(timedelta(hours=-5)))
    (market,) = data.markets
    assert data.bad_rows == 0 and market.timestamp[0] == utc_ms(2019, 1, 1, 22) + 587
    assert market.price[0] == pytest.approx(1.14658) and market.volume[0] == 0
    assert (f"{path}: no header line; read as HistData's tick file (time,bid,ask,volume; times in EST, UTC-05:00 all"
            " year, read in UTC-05:00: give -05:00 if they are not)") in data.notes
    # a bid above the ask among the first 50 rows: no proof of the layout
    path = write(tmp_path, "\n".join([*rows[:5], "20190101 170100587,1.2,1.1,0", *rows[5:]]) + "\n", "odd.csv")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert str(exc.value).endswith(LOOKS_LIKE_DATA)


# --------------------------------------------------------------------------------------
# Kaggle's Bitstamp minutes: a row of NaN for a minute without trades
# --------------------------------------------------------------------------------------

BITSTAMP = "Timestamp,Open,High,Low,Close,Volume_(BTC),Volume_(Currency),Weighted_Price\n"


def test_rows_of_nan_for_minutes_without_trades_are_skipped_not_bad(tmp_path: Path) -> None:
    rows = []
    for k in range(100):
        t = 1_325_317_920 + 60 * k
        rows.append(f"{t},NaN,NaN,NaN,NaN,NaN,NaN,NaN" if k % 3 == 0 else f"{t},4.39,4.39,4.39,{4 + k / 100},0.5,2.2,4.39")
    path = write(tmp_path, BITSTAMP + "\n".join(rows) + "\n", "bitstampUSD_1-min_data.csv")
    data = load_csv_files([path])  # 34 % of the rows: as bad rows they refused the file
    (market,) = data.markets
    assert data.bad_rows == 0 and data.skipped_rows == 34 and data.ticks == 66
    assert market.timestamp[:2].tolist() == [1_325_317_980_000, 1_325_318_040_000]
    assert market.price[:2].tolist() == [4.01, 4.02]
    assert (f"{path}: 34 rows skipped: every field but the time is NaN, NA or empty, as a bar without trades is"
            " written (Kaggle's Bitstamp minutes) and R writes a missing value") in data.notes
    # a row with a value beside its NaN price, or a NaN price in a file of no other columns, is still bad
    path = write(tmp_path, BITSTAMP + "1325317920,4.39,4.39,4.39,NaN,0.5,2.2,4.39\n"
                 "1325317980,4.39,4.39,4.39,4.39,0.5,2.2,4.39\n", "half.csv")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.report == [f"{path}:2: Close 'NaN' is not finite"] and data.skipped_rows == 0


# --------------------------------------------------------------------------------------
# Tables of several series as columns: each column its own market
# --------------------------------------------------------------------------------------

def test_a_table_of_closes_as_columns_is_read_one_market_per_column(tmp_path: Path) -> None:
    # df.to_csv() of closes: GOOG starts a day later (an empty field), MSFT has no value on one day (NaN)
    text = ("Date,AAPL,MSFT,GOOG\n2020-01-02,75.09,160.62,\n2020-01-03,74.36,NaN,1360.66\n"
            "2020-01-06,74.95,159.03,1394.21\n2020-01-07,74.60,157.58,1393.34\n")
    path = write(tmp_path, text, "closes.csv")
    data = load_csv_files([path])
    by_id = {m.market_id: m for m in data.markets}
    assert sorted(by_id) == ["AAPL", "GOOG", "MSFT"] and data.bad_rows == 0
    assert by_id["AAPL"].price.tolist() == [75.09, 74.36, 74.95, 74.60]
    assert by_id["MSFT"].price.tolist() == [160.62, 159.03, 157.58]
    assert by_id["MSFT"].timestamp.tolist() == [utc_ms(2020, 1, 2), utc_ms(2020, 1, 6), utc_ms(2020, 1, 7)]
    assert by_id["GOOG"].price.tolist() == [1360.66, 1394.21, 1393.34]
    assert data.rows == 12 and data.skipped_rows == 2 and data.ticks == 10
    assert (f"{path}: 3 series as columns beside the time (AAPL, MSFT, GOOG): each read as its own market, named by"
            " its column, at its values (its rows counted once per series); a row whose value is empty, NaN, NA or"
            " '.' gives that market no tick") in data.notes
    assert [(f.price, f.default_market) for f in data.formats] == [("AAPL", "AAPL"), ("MSFT", "MSFT"), ("GOOG", "GOOG")]
    assert len(data.notes) == len(set(data.notes))


def test_fred_series_as_columns_newest_first_and_a_bad_value(tmp_path: Path) -> None:
    text = ("observation_date,DCOILWTICO,DCOILBRENTEU\n2020-04-22,13.78,13.77\n2020-04-21,8.91,.\n"
            "2020-04-20,x,17.36\n2020-04-17,18.27,21.20\n")
    path = write(tmp_path, text, "fredgraph.csv")
    data = load_csv_files([path], max_bad_fraction=0.2)
    wti, brent = (next(m for m in data.markets if m.market_id == k) for k in ("DCOILWTICO", "DCOILBRENTEU"))
    assert wti.price.tolist() == [18.27, 8.91, 13.78] and brent.price.tolist() == [21.20, 17.36, 13.77]
    assert brent.timestamp.tolist() == [utc_ms(2020, 4, 17), utc_ms(2020, 4, 20), utc_ms(2020, 4, 22)]
    assert data.report == [f"{path}:4: DCOILWTICO 'x' is not a number"]
    assert data.formats[0].newest_first and data.formats[1].newest_first


def test_a_table_saved_after_reset_index_ignores_its_unnamed_index(tmp_path: Path) -> None:
    text = ",Date,AAPL,MSFT\n0,2020-01-02,75.09,160.62\n1,2020-01-03,74.36,158.62\n"
    path = write(tmp_path, text, "closes.csv")
    data = load_csv_files([path])
    assert {m.market_id: m.price.tolist() for m in data.markets} == {"AAPL": [75.09, 74.36], "MSFT": [160.62, 158.62]}
    assert data.markets[0].timestamp.tolist() == [utc_ms(2020, 1, 2), utc_ms(2020, 1, 3)]
    assert any(n.endswith("; the unnamed first column (a pandas index) ignored") for n in data.notes)


def test_a_table_of_returns_is_refused_saying_it_was_read_as_series(tmp_path: Path) -> None:
    # Fama-French factors: returns, many below 0
    text = "Date,Mkt-RF,SMB,HML\n2020-01-02,0.86,-0.97,-0.34\n2020-01-03,-0.67,0.30,0.01\n2020-01-06,0.36,-0.21,-0.55\n"
    path = write(tmp_path, text, "F-F_Research_Data_Factors_daily.csv")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    assert f"{path}:2: SMB -0.97 is not > 0" in str(exc.value)
    assert (f"\n{path} was read as a table of 3 series as columns, each a market's prices: if its columns hold no"
            " prices (returns, factors, weather, …), it is no file of prices to train on") in str(exc.value)


@pytest.mark.parametrize("header", ["Date,AAPL,Transactions", "Date,Open,WTI", "Date,Brent,Brent", "Date,AAPL,",
                                    ",351,1419"])  # pyfolio's volumes by sid
def test_a_table_with_a_column_that_is_no_price_is_still_refused(tmp_path: Path, header: str) -> None:
    path = write(tmp_path, f"{header}\n2020-01-02,75.09,12\n2020-01-03,74.36,13\n", "t.csv")
    with pytest.raises(DataError, match=r"t\.csv:1: no price column"):
        load_csv_files([path])


# --------------------------------------------------------------------------------------
# Gaps in intraday bars: weekends that open on Sunday evening, holidays, lunch breaks, half days
# --------------------------------------------------------------------------------------

DAY = 86_400_000
MIN5 = 300_000


def bars(days: range, session: Callable[[int], list[tuple[float, float]]]) -> MarketSeries:
    """5-minute bars (UTC) over ``days`` (days since the epoch), each day's ``session(weekday)``: (from, to) hours."""
    t = [day * DAY + int(h * 3_600_000) + k * MIN5 for day in days for start, end in session((day + 3) % 7)
         for h in (start,) for k in range(int((end - start) * 12))]
    ts = np.array(sorted(set(t)), dtype=np.float64)
    return MarketSeries("M", ts, 100 + np.sin(np.arange(ts.size)) / 10, np.ones(ts.size))


def gap_checks(series: MarketSeries) -> list[str]:
    return [c for c in market_checks(series) if c.startswith("a gap")]


JAN_2024 = utc_ms(2024, 1, 1) // DAY  # a Monday
HALF_YEAR = range(JAN_2024, JAN_2024 + 182)


def futures(weekday: int) -> list[tuple[float, float]]:
    """CME's hours in UTC (winter): Sunday 23:00 to Friday 22:00, a break 22:00-23:00."""
    return {5: [], 6: [(23, 24)], 4: [(0, 22)]}.get(weekday, [(0, 22), (23, 24)])


def equities(weekday: int) -> list[tuple[float, float]]:
    """NYSE's regular session in UTC (winter), weekdays."""
    return [(14.5, 21)] if weekday < 5 else []


def without(days: range, *missing: int) -> list[int]:
    return [d for d in days if d not in missing]


def test_a_weekend_that_opens_on_sunday_evening_is_no_gap(tmp_path: Path) -> None:
    assert gap_checks(bars(HALF_YEAR, futures)) == []  # each Friday 22:00 to Sunday 23:00
    fx = bars(HALF_YEAR, lambda wd: {5: [], 6: [(22, 24)], 4: [(0, 22)]}.get(wd, [(0, 24)]))
    assert gap_checks(fx) == []  # Friday 22:00 to Sunday 22:00: two days, one of them a Saturday
    # a week missing in futures is still told
    (gap,) = gap_checks(bars(without(HALF_YEAR, *range(JAN_2024 + 35, JAN_2024 + 42)), futures))
    assert gap.startswith("a gap of 7d 00:05:00 before 2024-02-12T00:00:00Z")


def test_holidays_beside_a_weekend_or_midweek_are_no_gap_but_a_missing_week_is(tmp_path: Path) -> None:
    # MLK day (Monday), Good Friday, Easter Monday beside it (a European exchange), Juneteenth (a Wednesday)
    holidays = [JAN_2024 + 14, utc_ms(2024, 3, 29) // DAY, utc_ms(2024, 4, 1) // DAY, utc_ms(2024, 6, 19) // DAY]
    assert gap_checks(bars(without(HALF_YEAR, *holidays), equities)) == []
    # a Christmas Eve half day (a Tuesday closing at 18:00 UTC) before Christmas Day
    dec = range(utc_ms(2024, 12, 2) // DAY, utc_ms(2025, 1, 31) // DAY)
    half = bars(without(dec, utc_ms(2024, 12, 25) // DAY),
                lambda wd: equities(wd))  # the half day: its bars end at 21:00 here; cut below
    cut = (half.timestamp < utc_ms(2024, 12, 24, 18)) | (half.timestamp >= utc_ms(2024, 12, 25))
    assert gap_checks(MarketSeries("M", half.timestamp[cut], half.price[cut], half.volume[cut])) == []
    # a week missing (2024-04-08 to 04-12) is told, with its length less the weekends
    (gap,) = gap_checks(bars(without(HALF_YEAR, *holidays, *range(JAN_2024 + 98, JAN_2024 + 103)), equities))
    assert gap.startswith("a gap of 9d 17:35:00 before 2024-04-15T14:30:00Z") and "5d 17:35:00 without" in gap
    # three days missing beside a weekend (Monday to Wednesday) are told
    (gap,) = gap_checks(bars(without(HALF_YEAR, *holidays, *range(JAN_2024 + 98, JAN_2024 + 101)), equities))
    assert gap.startswith("a gap of 5d 17:35:00 before 2024-04-11T14:30:00Z")
    # a day missing every week (Monday, then Tuesday, …) is data missing, not holidays: more than an exchange closes
    # in a year
    day_a_week = [d for d in HALF_YEAR if (d + 3) % 7 == (d - JAN_2024) // 7 % 5]
    assert len(day_a_week) == 26
    (gap,) = gap_checks(bars(without(HALF_YEAR, *day_a_week), equities))
    assert gap.startswith("a gap of 4d 17:35:00 before 2024-06-25T14:30:00Z")


def test_a_lunch_break_or_a_golden_week_of_holidays_beside_a_weekend(tmp_path: Path) -> None:
    def tokyo(weekday: int) -> list[tuple[float, float]]:
        return [(0, 2.5), (3.5, 6)] if weekday < 5 else []  # 09:00-11:30 and 12:30-15:00 JST

    golden = [utc_ms(2024, 4, 29) // DAY, utc_ms(2024, 5, 3) // DAY, utc_ms(2024, 5, 6) // DAY]
    assert gap_checks(bars(without(HALF_YEAR, *golden), tokyo)) == []
    # a market that trades every day keeps a missing day as a gap
    crypto = bars(without(HALF_YEAR, JAN_2024 + 50), lambda wd: [(0, 24)])
    (gap,) = gap_checks(crypto)
    assert gap.startswith("a gap of 1d 00:05:00 before") and "without" not in gap


def test_kraken_trades_without_a_header_are_read_by_their_layout(tmp_path: Path) -> None:
    """Kraken's downloadable trading history (time and sales), one headerless file per pair, as freqtrade's
    ``tests/testdata/kraken/trades_csv/BCHEUR.csv`` holds it: ``timestamp,price,volume`` in whole seconds. It was
    refused as a file whose first line looks like data."""
    rows = [(1672531436 + 35 * i, 90.54 - 0.01 * (i % 7), 1.1044842 + i) for i in range(60)]
    path = write(tmp_path, "".join(f"{t},{p:.6f},{v:.8f}\n" for t, p, v in rows), "BCHEUR.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0 and [m.market_id for m in data.markets] == ["BCHEUR"]
    assert data.markets[0].timestamp.tolist() == [t * 1000 for t, _, _ in rows]
    assert np.allclose(data.markets[0].price, [round(p, 6) for _, p, _ in rows])
    assert np.allclose(data.markets[0].volume, [round(v, 8) for _, _, v in rows])
    assert any("read as Kraken's downloadable trades" in n for n in data.notes)


def test_kraken_ohlcvt_bars_without_a_header_are_read_at_their_close(tmp_path: Path) -> None:
    """Kraken's OHLCVT downloads (``XBTUSD_1.csv``: time, open, high, low, close, volume, trades)."""
    path = write(tmp_path, "1381095240,122.0,122.0,122.0,122.0,0.1,1\n1381179000,123.61,123.61,123.61,123.61,0.1,1\n"
                           "1381201080,123.91,124.19,123.9,124.18,3.99,4\n", "XBTUSD_1.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0
    assert data.markets[0].timestamp.tolist() == [1381095240000, 1381179000000, 1381201080000]
    assert data.markets[0].price.tolist() == [122.0, 123.61, 124.18]
    assert data.markets[0].volume.tolist() == [0.1, 0.1, 3.99]


@pytest.mark.parametrize("text", [
    "1672531436000,90.54,1.1\n1672531471000,90.45,1.0\n",  # ms: no Kraken file
    "1672531436,90.54,1.1\n1672531400,90.45,1.0\n",  # time goes back
    "1672531436,90.54,1.1,7\n1672531471,90.45,1.0,8\n",  # four fields
])
def test_other_headerless_numbers_are_still_refused_asking_for_a_header(tmp_path: Path, text: str) -> None:
    with pytest.raises(DataError, match=r"the first line looks like data: add a header line"):
        load_csv_files([write(tmp_path, text, "x.csv")])


def _lean_days(n: int) -> list[str]:
    """``n`` QuantConnect Lean daily bars of an equity from 1998-01-02 (its prices in 1/10,000 of a dollar)."""
    days = np.arange(np.datetime64("1998-01-02"), np.datetime64("1998-12-31"))
    days = days[np.is_busday(days)][:n]
    return [f"{str(d).replace('-', '')} 00:00,{973100 + 100 * k},{975300 + 100 * k},{965300 + 100 * k},"
            f"{973600 + 100 * k},{2150000 + k}" for k, d in enumerate(days)]


def test_a_lean_daily_or_hour_bar_file_is_read_by_its_layout(tmp_path: Path) -> None:
    """QuantConnect Lean's daily and hour bars (``data/equity/usa/daily/spy.zip``, unzipped to ``spy.csv``) have no
    header line: the file was refused, telling to add one. A file whose first 50 rows are Lean bars with times going
    forward is read with the columns ``time,open,high,low,close,volume`` (noted: times in the exchange's zone, prices
    as Lean stores them); a row that breaks the layout leaves the file refused as before."""
    rows = _lean_days(60)
    path = write(tmp_path, "\n".join(rows) + "\n", "spy.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0 and data.rows == 60 and [m.market_id for m in data.markets] == ["spy"]
    assert data.markets[0].timestamp.tolist()[:2] == [utc_ms(1998, 1, 2), utc_ms(1998, 1, 5)]
    assert data.markets[0].price.tolist()[:2] == [973600.0, 973700.0]
    assert data.markets[0].volume.tolist()[:2] == [2150000.0, 2150001.0]
    assert any("read as QuantConnect Lean's daily or hour bars (time,open,high,low,close,volume; times in the"
               " exchange's zone" in n for n in data.notes)
    fields = rows[10].split(",")
    broken = [*rows[:10], ",".join([*fields[:2], "1", *fields[3:]]), *rows[11:]]  # a high below the close
    with pytest.raises(DataError, match="add a header line"):
        load_csv_files([write(tmp_path, "\n".join(broken) + "\n", "spy2.csv")])


def _lean_minutes(n: int, start_ms: int = 0, step_ms: int = 60_000) -> list[str]:
    """``n`` Lean trade bars (ms since midnight, open, high, low, close, volume), ``step_ms`` apart from ``start_ms``;
    the close ``19650.02 + k``."""
    return [f"{start_ms + step_ms * k},{19650 + k},{19651 + k},{19649 + k},{19650.02 + k},{61.34 + k}" for k in range(n)]


def test_a_lean_minute_trade_file_is_read_at_the_date_in_its_name(tmp_path: Path) -> None:
    """Lean's minute and second files (``20171217_btcusd_minute_trade.csv``) hold ms since midnight of the date in
    their name, no date of their own, and no header line. Such a file is read with the columns
    ``time,open,high,low,close,volume``, each time that date's midnight plus its ms, its market the symbol in the
    name; a note says so and asks for the exchange's zone. (It was refused, naming the pandas lines that write the
    times out.)"""
    path = write(tmp_path, "\n".join(_lean_minutes(30)) + "\n", "20171217_btcusd_minute_trade.csv")
    data = load_csv_files([path])
    (market,) = data.markets
    assert market.market_id == "btcusd" and data.rows == 30 and data.bad_rows == 0
    assert market.timestamp.tolist() == [utc_ms(2017, 12, 17) + 60_000 * k for k in range(30)]
    assert market.price.tolist() == [19650.02 + k for k in range(30)] and market.volume[0] == pytest.approx(61.34)
    assert any("read as QuantConnect Lean's minute trade bars (time,open,high,low,close,volume; times in ms after"
               " midnight of 2017-12-17, the date in the file's name, in the exchange's zone" in n for n in data.notes)
    assert data.formats[0].time == "time (ms after 2017-12-17 00:00)"


def test_a_lean_quote_file_is_read_at_the_mid_of_its_closing_bid_and_ask(tmp_path: Path) -> None:
    """Quote bars (11 numbers: ms, the bid's open, high, low, close and size, then the ask's) are read at the mid of
    the closes, the volume the two sizes; their market is the symbol's with ``-second`` and ``-quote``, apart from
    its trade bars."""
    rows = [f"{1000 * k},19650,19651,19649,{19650 + k},0.5,19650.5,19651.5,19649.5,{19651 + k},1.5" for k in range(10)]
    path = write(tmp_path, "\n".join(rows) + "\n", "20171217_btcusd_second_quote.csv")
    data = load_csv_files([path])
    (market,) = data.markets
    assert market.market_id == "btcusd-second-quote" and data.bad_rows == 0
    assert market.timestamp.tolist() == [utc_ms(2017, 12, 17) + 1000 * k for k in range(10)]
    assert market.price.tolist() == [19650.5 + k for k in range(10)] and market.volume.tolist() == [2.0] * 10


def test_a_lean_quote_bar_with_a_side_not_quoted_keeps_that_sides_latest_quote(tmp_path: Path) -> None:
    """A minute with no quote on one side is written with that side's bar empty (FOXA's first minute of 2013-07-01:
    ``14400000,270000,270000,270000,270000,100,,,,,0``): the file is still read as Lean's, its rows before both sides
    were quoted skipped (noted), the others at the mid of each side's latest close."""
    rows = ["14400000,270000,270000,270000,270000,100,,,,,0",
            "26160000,270000,270000,270000,270000,100,291500,291500,291500,291500,200",
            "26400000,,,,,0,291000,291500,291000,291000,300"]
    data = load_csv_files([write(tmp_path, "\n".join(rows) + "\n", "20130701_foxa_minute_quote.csv")])
    (market,) = data.markets
    assert market.market_id == "foxa-quote" and data.bad_rows == 0 and data.skipped_rows == 1
    assert market.price.tolist() == [(270000 + 291500) / 2, (270000 + 291000) / 2]
    assert market.volume.tolist() == [300.0, 300.0]


def test_lean_zipped_days_in_the_symbols_folder_are_one_market_in_the_exchanges_zone(tmp_path: Path) -> None:
    """Lean keeps an equity's minutes as one zip a day in the symbol's folder (``equity/usa/minute/spy/
    20131007_trade.zip`` holding ``20131007_spy_minute_trade.csv``): the days read one after the other as one
    market, their times in the zone given (New York: 09:30 is 13:30 UTC in October, 14:30 in December, daylight
    saving time over), as Lean writes them in the exchange's zone."""
    folder = tmp_path / "equity" / "usa" / "minute" / "spy"
    folder.mkdir(parents=True)
    paths = []
    for day in ("20131007", "20131008", "20131209"):
        paths.append(folder / f"{day}_trade.zip")
        with zipfile.ZipFile(paths[-1], "w") as z:
            z.writestr(f"{day}_spy_minute_trade.csv", "\r\n".join(_lean_minutes(390, 34_200_000)) + "\r\n")
    data = load_csv_files(paths, zone=ZoneInfo("America/New_York"))
    (market,) = data.markets
    assert market.market_id == "spy" and data.rows == 3 * 390 and data.bad_rows == 0
    starts = market.timestamp[::390].tolist()
    assert starts == [utc_ms(2013, 10, 7, 13, 30), utc_ms(2013, 10, 8, 13, 30), utc_ms(2013, 12, 9, 14, 30)]
    assert market.timestamp[389] == utc_ms(2013, 10, 7, 19, 59)  # 15:59 in New York, the day's last bar
    # a zip whose file's name does not name the symbol: the folder's name does
    other = tmp_path / "equity" / "usa" / "minute" / "aapl"
    other.mkdir(parents=True)
    with zipfile.ZipFile(other / "20131007_trade.zip", "w") as z:
        z.writestr("20131007.csv", "\n".join(_lean_minutes(5, 34_200_000)) + "\n")
    assert [m.market_id for m in load_csv_files([other / "20131007_trade.zip"]).markets] == ["aapl"]


def test_a_lean_time_that_is_no_ms_of_the_day_is_a_bad_row_naming_the_date(tmp_path: Path) -> None:
    """A row whose time is not ms within the day (86,400,000 or more, a number written otherwise) is a bad row whose
    reason names the day its times count from; the file's other rows are read."""
    rows = _lean_minutes(400)
    rows[150] = "86400000" + rows[150][rows[150].index(","):]
    rows[200] = "1.2e7" + rows[200][rows[200].index(","):]
    path = write(tmp_path, "\n".join(rows) + "\n", "20171217_btcusd_minute_trade.csv")
    data = load_csv_files([path], max_bad_fraction=0.05)
    assert data.rows == 400 and data.bad_rows == 2 and len(data.markets[0].timestamp) == 398
    report = "\n".join(data.report)
    assert "time '86400000' is not ms after midnight (0 to 86399999) of 2017-12-17, the date in the file's name" in report
    assert "time '1.2e7' is not ms after midnight" in report


@pytest.mark.parametrize(("name", "rows"), [
    ("btcusd_minute_trade.csv", _lean_minutes(5)),  # no date in the name
    ("20171217_btcusd_minute_trade.csv", _lean_minutes(5, 86_400_000)),  # no time within a day
    ("20171317_btcusd_minute_trade.csv", _lean_minutes(5)),  # no such date
    ("20171217_btcusd_minute_trade.csv", [r + ",1" for r in _lean_minutes(5)]),  # seven fields
])
def test_numbers_without_a_header_that_are_no_lean_day_are_refused_asking_for_one(tmp_path: Path, name: str,
                                                                                   rows: list[str]) -> None:
    with pytest.raises(DataError, match="add a header line"):
        load_csv_files([write(tmp_path, "\n".join(rows) + "\n", name)])


def test_lean_equity_tick_trades_are_read_without_the_ticks_lean_marks_suspicious(tmp_path: Path) -> None:
    """Lean's equity trade ticks (``20131007_spy_Trade_Tick.csv``: ms since midnight, price in 1/10,000 of a dollar,
    quantity, exchange, sale condition, suspicious flag) are read at their price and quantity, several to a ms; a
    tick flagged 1 is skipped, as Lean's algorithms skip it, and noted; the market is the symbol's ``-tick``."""
    rows = ["34200144,1692000,100,P,00000001,0", "34200144,1692100,300,Q,00000001,0", "34200150,1999900,5,D,00000001,1",
            "34200151,1692200,200,Z,00000000,0"]
    path = write(tmp_path, "\r\n".join(rows) + "\r\n", "20131007_spy_Trade_Tick.csv")
    data = load_csv_files([path], zone=ZoneInfo("America/New_York"))
    (market,) = data.markets
    assert market.market_id == "spy-tick" and data.rows == 4 and data.bad_rows == 0 and data.skipped_rows == 1
    nine_thirty = utc_ms(2013, 10, 7, 13, 30)
    assert market.timestamp.tolist() == [nine_thirty + 144, nine_thirty + 144, nine_thirty + 151]
    assert market.price.tolist() == [1692000.0, 1692100.0, 1692200.0] and market.volume.tolist() == [100.0, 300.0, 200.0]
    assert any("1 row skipped: marked suspicious (1 in its last field), as Lean marks ticks its algorithms skip" in n
               for n in data.notes)
    assert any("read as QuantConnect Lean's tick trades (time,price,quantity,exchange,sale_condition,suspicious;"
               in n for n in data.notes)


def test_lean_equity_tick_quotes_keep_each_sides_latest_quote(tmp_path: Path) -> None:
    """Lean's equity quote ticks quote one side at a time, the other written ``0,0``
    (``20131010_aig_Quote_Tick.csv``, zipped as ``aig/20131010_quote.zip``): the price is the mid of each side's
    latest quote from the first row both sides are known (rows before it skipped, noted), the volume the sizes
    written in the row."""
    rows = ["14400201,468700,100,0,0,P,1,0", "14400201,0,0,485700,3000,P,1,0", "14400300,470000,200,0,0,P,1,0",
            "14400400,0,0,480000,100,P,1,0", "14400500,471000,100,479000,100,P,1,0"]
    folder = tmp_path / "equity" / "usa" / "tick" / "aig"
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / "20131010_quote.zip", "w") as z:
        z.writestr("20131010_aig_Quote_Tick.csv", "\r\n".join(rows) + "\r\n")
    data = load_csv_files([folder / "20131010_quote.zip"])
    (market,) = data.markets
    assert market.market_id == "aig-tick-quote" and data.bad_rows == 0 and data.skipped_rows == 1
    assert market.price.tolist() == [(468700 + 485700) / 2, (470000 + 485700) / 2, (470000 + 480000) / 2,
                                     (471000 + 479000) / 2]
    assert market.volume.tolist() == [3000.0, 200.0, 100.0, 200.0]
    assert market.timestamp.tolist() == [utc_ms(2013, 10, 10, 4) + d for d in (201, 300, 400, 500)]
    assert any("1 row skipped: a quote before both sides of its market were quoted" in n for n in data.notes)


def test_lean_forex_tick_quotes_with_fractions_of_a_ms_are_read_at_the_ms(tmp_path: Path) -> None:
    """Lean's forex and CFD quote ticks (``20140501_xauusd_tick_quote.csv``: ms since midnight with a fraction, bid,
    ask) are read at the mid, each time the ms it falls in."""
    rows = ["43.142,1291.677,1292.033", "45.852,1291.652,1292.043", "79200976.26,1289.056,1290.606"]
    data = load_csv_files([write(tmp_path, "\n".join(rows) + "\n", "20140501_xauusd_tick_quote.csv")])
    (market,) = data.markets
    assert market.market_id == "xauusd-tick-quote" and data.bad_rows == 0
    assert market.timestamp.tolist() == [utc_ms(2014, 5, 1) + 43, utc_ms(2014, 5, 1) + 45, utc_ms(2014, 5, 1, 22) + 976]
    assert market.price.tolist() == pytest.approx([1291.855, 1291.8475, 1289.831])


@pytest.mark.parametrize(("name", "rows"), [
    ("20131007_spy_Trade_Tick.csv", ["34200144,1692000,100,P", "34200145,1692000,100,P"]),  # four fields
    ("20131007_spy_Trade_Tick.csv", ["34200144,P,100,P,0,0", "34200145,P,100,P,0,0"]),  # no price
    ("20131007_spy_tick.csv", ["34200144,1692000,100,P,0,0", "34200145,1692000,100,P,0,0"]),  # no kind named
])
def test_lean_named_tick_files_of_another_layout_are_refused_asking_for_a_header(tmp_path: Path, name: str,
                                                                                 rows: list[str]) -> None:
    with pytest.raises(DataError, match="add a header line"):
        load_csv_files([write(tmp_path, "\n".join(rows) + "\n", name)])


def test_lean_future_contracts_are_markets_of_their_own(tmp_path: Path) -> None:
    """A Lean future's daily zip holds one file per contract (``20131007_gc_minute_trade_201310.csv``, ``…_201312``):
    unpacked, each contract is its own market, named with its expiry, never one series of several contracts'
    prices."""
    paths = [write(tmp_path, "\n".join(_lean_minutes(20, 4_920_000)) + "\n", f"20131007_gc_minute_trade_{c}.csv")
             for c in ("201310", "201312")]
    data = load_csv_files(paths)
    assert sorted(m.market_id for m in data.markets) == ["gc-201310", "gc-201312"] and data.bad_rows == 0
