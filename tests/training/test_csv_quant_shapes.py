"""Shapes of files a quant brings: vendors' daily prices not adjusted for splits beside their adjusted close."""

from __future__ import annotations

import json
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from training_helpers import tiny_cli_environ
from training_helpers import write_text_file as write

from cerebellar_norse.cli import main
from cerebellar_norse.errors import DataError
from cerebellar_norse.training.data import load_csv_files
from cerebellar_norse.training.datacheck import market_checks

# --------------------------------------------------------------------------------------
# Unadjusted closes beside a split ratio column and an adjusted close
# --------------------------------------------------------------------------------------

# a 7:1 split on the third day: the unadjusted close falls from 630 to 91, the adjusted one runs on
WIKI = ("Date,Open,High,Low,Close,Volume,Ex-Dividend,Split Ratio,Adj. Open,Adj. High,Adj. Low,Adj. Close,Adj. Volume\n"
        "2014-06-05,647.35,649.86,645.48,647.35,10000,0.0,1.0,92.48,92.84,92.21,92.48,70000\n"
        "2014-06-06,649.90,651.26,644.47,645.57,12000,0.0,1.0,92.22,93.04,92.07,92.22,84000\n"
        "2014-06-09,92.70,93.88,91.75,93.70,75000,0.0,7.0,92.70,93.88,91.75,93.70,75000\n")
TIINGO = ("date,close,high,low,open,volume,adjClose,adjHigh,adjLow,adjOpen,adjVolume,divCash,splitFactor\n"
          "2014-06-05T00:00:00.000Z,647.35,649.86,645.48,647.35,10000,92.48,92.84,92.21,92.48,70000,0.0,1.0\n"
          "2014-06-06T00:00:00.000Z,645.57,651.26,644.47,649.90,12000,92.22,93.04,92.07,92.84,84000,0.0,1.0\n"
          "2014-06-09T00:00:00.000Z,93.70,93.88,91.75,92.70,75000,93.70,93.88,91.75,92.70,75000,0.0,7.0\n")
ALPHA_VANTAGE = ("timestamp,open,high,low,close,adjusted_close,volume,dividend_amount,split_coefficient\n"
                 "2014-06-09,92.70,93.88,91.75,93.70,93.70,75000,0.0000,7.0\n"
                 "2014-06-06,649.90,651.26,644.47,645.57,92.22,12000,0.0000,1.0\n"
                 "2014-06-05,647.35,649.86,645.48,647.35,92.48,10000,0.0000,1.0\n")


@pytest.mark.parametrize(("text", "close", "adjusted", "split"), [
    (WIKI, "Close", "Adj. Close", "Split Ratio"),
    (TIINGO, "close", "adjClose", "splitFactor"),
    (ALPHA_VANTAGE, "close", "adjusted_close", "split_coefficient"),
])
def test_a_close_beside_a_split_ratio_column_gives_way_to_the_adjusted_close(
        tmp_path: Path, text: str, close: str, adjusted: str, split: str) -> None:
    path = write(tmp_path, text, "AAPL.csv")
    data = load_csv_files([path])
    assert data.markets[0].price.tolist() == pytest.approx([92.48, 92.22, 93.70])  # not 647.35, 645.57, 93.70
    assert data.formats[0].price == adjusted
    assert f"{path}: price from {adjusted!r}, not {close!r}: a file with a split ratio column ({split!r}) writes" \
           f" {close!r} not adjusted for splits, so a split would read as a fall of its ratio (2:1 as -50 %)" \
           in data.notes


@pytest.mark.parametrize(("text", "volumes", "adjusted"), [
    (WIKI, [70000, 84000, 75000], "Adj. Volume"),
    (TIINGO, [70000, 84000, 75000], "adjVolume"),
    (ALPHA_VANTAGE, [10000, 12000, 75000], None),  # no adjusted volume: the volume as traded
])
def test_the_volume_adjusted_for_splits_goes_with_the_adjusted_close(
        tmp_path: Path, text: str, volumes: list[int], adjusted: str | None) -> None:
    """zipline's Quandl sample (``tests/resources/quandl_samples/QUANDL_ARCHIVE.zip``, WIKI's table with AAPL's 7:1
    split of 2014-06-09): the price was the adjusted close but the volume the one as traded, which jumps 7-fold at the
    split where the price runs on; the adjusted volume (Quandl's, Tiingo's) goes with the adjusted close."""
    path = write(tmp_path, text, "AAPL.csv")
    data = load_csv_files([path])
    assert data.markets[0].price.tolist() == pytest.approx([92.48, 92.22, 93.70])
    assert data.markets[0].volume.tolist() == volumes
    assert any(n.startswith(f"{path}: volume from {adjusted!r}") for n in data.notes) == (adjusted is not None)


def test_a_split_ratio_column_without_an_adjusted_close_is_told(tmp_path: Path) -> None:
    path = write(tmp_path, "Date,Close,Split Ratio\n2014-06-06,645.57,1.0\n2014-06-09,93.70,7.0\n", "AAPL.csv")
    data = load_csv_files([path])
    assert data.markets[0].price.tolist() == pytest.approx([645.57, 93.70])
    assert any("'Close' is not adjusted for splits in a file with a split ratio column ('Split Ratio'), and the"
               " file has no adjusted close" in n for n in data.notes)


def test_without_a_split_ratio_column_the_close_stays_the_price(tmp_path: Path) -> None:
    # Yahoo's Close is adjusted for splits already; its Adj Close also for dividends
    path = write(tmp_path, "Date,Close,Adj Close\n2020-01-02,75.09,73.15\n2020-01-03,74.36,72.44\n", "AAPL.csv")
    data = load_csv_files([path])
    assert data.markets[0].price.tolist() == pytest.approx([75.09, 74.36])
    assert not any("adjusted for splits" in n for n in data.notes)


# --------------------------------------------------------------------------------------
# Local times without an offset across the hour the clocks repeat, read in UTC
# --------------------------------------------------------------------------------------

CLOCKS_BACK_HINT = ("; the time has no offset and was read in UTC: if the file's times are local times, this may be the"
                    " hour repeated when the clocks go back; give the file's time zone (--timezone,"
                    " training.data_timezone, or data_timezone in POST /training)")


def test_a_time_going_back_within_an_hour_without_an_offset_says_it_may_be_local_time(tmp_path: Path) -> None:
    # minute bars of Frankfurt in local time: 02:00-02:59 comes twice on 2024-10-27
    walls = ["02:57", "02:58", "02:59", "02:00", "02:01"] + [f"03:{m:02d}" for m in range(60)]
    rows = [f"2024-10-27 {w},{100 + k * 0.01:.2f},1" for k, w in enumerate(walls)]
    path = write(tmp_path, "time,close,volume\n" + "\n".join(rows) + "\n", "DAX.csv")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.report == [
        f"{path}:5: time goes backwards for market 'DAX' (2024-10-27T02:00:00Z < 2024-10-27T02:59:00Z;"
        f" ms 1729994400000 < 1729997940000){CLOCKS_BACK_HINT}",
        f"{path}:6: time goes backwards for market 'DAX' (2024-10-27T02:01:00Z < 2024-10-27T02:59:00Z;"
        f" ms 1729994460000 < 1729997940000){CLOCKS_BACK_HINT}"]
    # read in the zone they were written in, they are the repeated hour's second run
    data = load_csv_files([path], zone=ZoneInfo("Europe/Berlin"))
    assert data.bad_rows == 0


def test_a_time_going_back_that_local_time_does_not_explain_gets_no_hint(tmp_path: Path) -> None:
    # with an offset of its own, by more than an hour, or a number since the epoch: no word of local time
    texts = {"z.csv": "2024-10-27T02:59:00Z,1\n2024-10-27T02:00:00Z,2\n",
             "far.csv": "2024-10-27 02:59,1\n2024-10-27 01:30,2\n",
             "ms.csv": "1729997940000,1\n1729994400000,2\n"}
    for name, text in texts.items():
        path = write(tmp_path, "time,close\n" + text + "2024-10-27T04:00:00Z,3\n", name)
        report = load_csv_files([path], max_bad_fraction=0.5).report
        assert len(report) == 1 and "time goes backwards" in report[0] and "local" not in report[0], report


# --------------------------------------------------------------------------------------
# A footer after the ticks: a total row, a disclaimer
# --------------------------------------------------------------------------------------

def _daily(n: int) -> str:
    return "".join(f"2020-{1 + k // 28:02d}-{1 + k % 28:02d},{100 + k}.00,{100 + k}.50,1000\n" for k in range(n))


def test_a_total_row_and_a_disclaimer_after_the_ticks_are_skipped_as_the_footer(tmp_path: Path) -> None:
    # 60 daily rows: two bad rows would be 3 % of them, over the 1 % a load allows
    footer = 'Total,,,60000\n"Data provided by Example Corp, for information only."\n'
    path = write(tmp_path, "Date,Open,Close,Volume\n" + _daily(60) + footer, "X.csv")
    data = load_csv_files([path])
    assert data.rows == 60 and data.bad_rows == 0 and data.report == []
    assert data.markets[0].price.shape == (60,)
    assert (f"{path}: 2 lines after the last tick, without a time, skipped as the file's footer (a total, a"
            f" disclaimer): lines 62 'Total,,,60000', 63 'Data provided by Example Corp, for information only.'"
            in data.notes)


def test_rows_without_a_time_elsewhere_or_a_row_cut_short_at_the_end_stay_bad(tmp_path: Path) -> None:
    # a total between ticks is a bad row; so is a last row cut short after its time, and six lines of footer
    rows = _daily(40).splitlines(keepends=True)
    text = "Date,Open,Close,Volume\n" + "".join(rows[:30]) + "Total,,,1\n" + "".join(rows[30:]) + "2020-02-15,1\n"
    path = write(tmp_path, text, "cut.csv")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert [r.split(": ", 1)[0] for r in data.report] == [f"{path}:32", f"{path}:43"]
    path = write(tmp_path, "Date,Open,Close,Volume\n" + _daily(60) + "Note\n" * 6, "long.csv")
    assert load_csv_files([path], max_bad_fraction=0.5).bad_rows == 6


# --------------------------------------------------------------------------------------
# An unadjusted split without a split ratio column: the labels after it
# --------------------------------------------------------------------------------------

def test_an_outsized_move_says_how_many_labels_after_it_are_flat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in tiny_cli_environ(tmp_path).items():
        monkeypatch.setenv(k, v)
    rng = np.random.default_rng(4)
    price = 400.0 * np.exp(np.cumsum(rng.normal(0, 0.012, 800)))
    price[500:] /= 10.0  # a 10:1 split, the close not adjusted: -90 % in one day
    days = np.datetime64("2018-01-01") + np.arange(800)
    write(tmp_path, "Date,Close\n" + "".join(f"{d},{p:.2f}\n" for d, p in zip(days, price, strict=True)), "X.csv")
    # read as written (by default the split is taken out of the prices: test_stock_splits.py)
    assert main(["inspect-data", "X.csv", "--json", "--no-split-adjust"]) == 0
    (market,) = json.loads(capsys.readouterr().out)["markets"]
    (move,) = [c for c in market["checks"] if c.startswith("a move of -90.")]
    # the band scales with a running volatility of 100 ticks' memory, which the split's square dwarfs for hundreds
    # (the last 5 of the 300 ticks after it, within the tiny config's horizon, have no label)
    assert " The flat band scales with the running volatility, which the move inflates: 100% of the 295 labels of" \
           " the 300 ticks from it on are flat, against " in move, move
    # without the labels' spec (or where the labels after a move are no flatter) the check says only the move
    data = load_csv_files([tmp_path / "X.csv"])
    assert market_checks(data.markets[0])[-1].endswith("a bad print, an unadjusted split or a futures roll?")


# --------------------------------------------------------------------------------------
# A series as FRED writes it: a date and one column named after the series, '.' for no value
# --------------------------------------------------------------------------------------

FRED = ("observation_date,DCOILWTICO\n2020-04-16,19.87\n2020-04-17,18.27\n2020-04-20,-36.98\n2020-04-21,8.91\n"
        "2020-04-22,13.64\n2020-05-25,.\n2020-05-26,34.35\n")


def test_a_fred_series_is_read_at_its_one_column_and_skips_days_without_a_value(tmp_path: Path) -> None:
    path = write(tmp_path, FRED, "DCOILWTICO.csv")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert data.markets[0].price.tolist() == [19.87, 18.27, 8.91, 13.64, 34.35]
    assert data.formats[0].time == "observation_date" and data.formats[0].price == "DCOILWTICO"
    assert f"{path}: price from 'DCOILWTICO', the one column beside the time (a series as FRED writes it)" in data.notes
    assert data.skipped_rows == 1 and (f"{path}: 1 row skipped: the price is '.', as FRED marks a day without a value"
                                       " (a holiday)") in data.notes
    # WTI's close of 2020-04-20 is below 0: no log return reaches it, a bad row
    assert data.report == [f"{path}:4: DCOILWTICO -36.98 is not > 0"]
    # the older downloads' DATE header reads the same
    path = write(tmp_path, FRED.replace("observation_date", "DATE"), "WTI.csv")
    assert load_csv_files([path], max_bad_fraction=0.5).markets[0].price.tolist() == [19.87, 18.27, 8.91, 13.64, 34.35]


def test_a_time_beside_a_column_that_is_no_price_is_still_refused(tmp_path: Path) -> None:
    # (a column of returns, as pyfolio's benchmark files hold them, is no price either)
    for header in ("Date,Volume", "Date,Open", "Date,Symbol", "Date,Bid", "date,return", "Date,Change %", "dt,ret"):
        path = write(tmp_path, f"{header}\n2020-01-02,5\n", "x.csv")
        with pytest.raises(DataError, match="no price column"):
            load_csv_files([path])


def test_hourly_bars_of_local_time_read_in_utc_say_two_bars_share_a_time(tmp_path: Path) -> None:
    # New York's hourly bars in local time: 01:00 comes twice on 2024-11-03, 02:00 never on 2024-03-10
    walls = [f"2024-11-02 {h:02d}:00" for h in range(20, 24)] + [f"2024-11-03 {h:02d}:00" for h in (0, 1, 1, 2, 3)]
    text = "time,close,volume\n" + "".join(f"{w},{100 + k},1\n" for k, w in enumerate(walls))
    path = write(tmp_path, text, "SPY.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0  # read in UTC, the second 01:00 is a tick at the same time: nothing to refuse
    assert market_checks(data.markets[0]) == [
        "1 tick shares its time with the previous one but not its price or volume (the first at 2024-11-03T01:00:00Z),"
        " though the median gap is 01:00:00: two bars at one time, as bars stamped in local time give in the hour the"
        " clocks go back (01:00 twice, which no time zone tells apart), or two sources merged?"]
    # read in their zone the two 01:00 are still one time (the first occurrence): told all the same
    (check,) = market_checks(load_csv_files([path], zone=ZoneInfo("America/New_York")).markets[0])
    assert "(the first at 2024-11-03T05:00:00Z)" in check
    # ticks of a trade feed at one time are no bars and say nothing
    ticks = "".join(f"2024-11-03T01:{s // 60:02d}:{s % 60:02d}Z,{100 + s % 3},{k}\n" for s in range(0, 600, 20)
                    for k in (1, 2))
    path = write(tmp_path, "time,close,volume\n" + ticks, "feed.csv")
    assert not any("share" in c for c in market_checks(load_csv_files([path]).markets[0]))


# --------------------------------------------------------------------------------------
# Intraday bars of a market closed at weekends: the weekend is no gap to tell
# --------------------------------------------------------------------------------------

def _minute_bars(days: list[str]) -> str:
    return "".join(f"{d} {9 + m // 60:02d}:{m % 60:02d},{100 + m % 7},1\n" for d in days for m in range(0, 390, 5))


def test_a_weekend_in_intraday_bars_is_no_gap_but_a_missing_week_still_is(tmp_path: Path) -> None:
    weekdays = [f"2024-01-{d:02d}" for d in range(1, 32) if (d - 1) % 7 < 5]  # 2024-01-01 was a Monday
    path = write(tmp_path, "time,close,volume\n" + _minute_bars(weekdays), "ES.csv")
    (market,) = load_csv_files([path]).markets
    assert not any("gap" in c for c in market_checks(market))  # each Friday 15:25 to Monday 09:00
    # the third week missing: the gap is told, with its length less the weekends it spans
    path = write(tmp_path, "time,close,volume\n" + _minute_bars([d for d in weekdays if not "15" <= d[-2:] <= "19"]),
                 "ES2.csv")
    (market,) = load_csv_files([path]).markets
    (gap,) = [c for c in market_checks(market) if "gap" in c]
    assert gap.startswith("a gap of 9d 17:35:00 before 2024-01-22T09:00:00Z, 2803 times the median gap (00:05:00),"
                          " 5d 17:35:00 without the Saturdays and Sundays it spans, on which the market has no ticks")
    # a market trading every day (crypto) keeps its weekend gaps
    days = [f"2024-01-{d:02d}" for d in range(1, 32) if d not in (13, 14)]
    path = write(tmp_path, "time,close,volume\n" + _minute_bars(days), "BTC.csv")
    (market,) = load_csv_files([path]).markets
    (gap,) = [c for c in market_checks(market) if "gap" in c]
    assert gap.startswith("a gap of 2d 17:35:00 before 2024-01-15T09:00:00Z") and "without" not in gap


# --------------------------------------------------------------------------------------
# TrueFX's headerless tick files
# --------------------------------------------------------------------------------------

def test_a_headerless_truefx_file_is_read_as_its_quotes(tmp_path: Path) -> None:
    rows = [f"EUR/USD,20240102 00:00:{k:02d}.071,{1.10425 + k * 1e-5:.5f},{1.10430 + k * 1e-5:.5f}\n" for k in range(60)]
    path = write(tmp_path, "".join(rows), "EURUSD-2024-01.csv")
    data = load_csv_files([path])
    (market,) = data.markets
    assert market.market_id == "EUR/USD" and data.rows == 60 and data.bad_rows == 0
    assert market.timestamp[0] == 1_704_153_600_071 and market.price[0] == pytest.approx(1.104275)
    assert f"{path}: no header line; read as TrueFX's tick file (pair,time,bid,ask; times in UTC)" in data.notes
    # a row that is no TrueFX quote among the first 50: a file without a header line, told to add one
    path = write(tmp_path, "".join(rows[:10]) + "EUR/USD,20240102,1.1,1.1\n" + "".join(rows[10:]), "odd.csv")
    with pytest.raises(DataError, match="add a header line naming the columns"):
        load_csv_files([path])


# --------------------------------------------------------------------------------------
# A series at or below 0 (a calendar spread): refused saying why and what to do
# --------------------------------------------------------------------------------------

def test_a_spread_below_0_is_refused_saying_prices_need_to_be_above_0(tmp_path: Path) -> None:
    settles = [0.42, 0.15, -0.08, -0.31, 0.05, -0.12, 0.0, 0.33, -0.5, -0.2]
    path = write(tmp_path, "Date,Close\n" + "".join(f"2024-11-{k + 1:02d},{s}\n" for k, s in enumerate(settles)),
                 "CLZ4-CLF5.csv")
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    assert f"{path}:4: Close -0.08 is not > 0" in str(err.value)
    assert str(err.value).endswith(
        "\n6 of the bad rows have a price of 0 or below: returns are log returns, which no price of 0 or below has; a"
        " series that goes there (a spread, power prices, a contract that traded below 0) cannot be read as it is:"
        " give its legs, or add a constant you choose to every price")
    # bad rows of other kinds say nothing of it
    path = write(tmp_path, "Date,Close\n2024-11-01,1\n2024-11-02,x\n2024-11-03,-1\n2024-11-04,y\n", "X.csv")
    with pytest.raises(DataError) as err:
        load_csv_files([path])
    assert "log returns" not in str(err.value)


def test_a_close_beside_eodhds_adjusted_close_gives_way_to_it(tmp_path: Path) -> None:
    # EODHD's end-of-day prices: Close as traded, Adjusted_close for splits and dividends, no split ratio column
    text = ("Date,Open,High,Low,Close,Adjusted_close,Volume\n2020-08-28,504.05,505.77,498.31,499.23,124.19,46907479\n"
            "2020-08-31,127.58,131.00,126.00,129.04,128.36,225702700\n")
    path = write(tmp_path, text, "AAPL.US.csv")
    data = load_csv_files([path])
    assert data.markets[0].price.tolist() == [124.19, 128.36]  # not a fall of 74 % from 499.23 to 129.04
    assert (f"{path}: price from 'Adjusted_close', not 'Close': beside 'Adjusted_close' (EODHD's and Alpha Vantage's"
            " name) 'Close' is not adjusted for splits, so a split would read as a fall of its ratio (2:1 as -50 %)"
            in data.notes)
