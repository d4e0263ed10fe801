"""Shapes of files a quant brings: vendors' daily prices not adjusted for splits beside their adjusted close."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_helpers import write_text_file as write

from cerebellar_norse.training.data import load_csv_files

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
