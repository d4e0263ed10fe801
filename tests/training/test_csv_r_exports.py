"""Market files as R writes them: ``write.zoo`` of a zoo or xts series (its dates in a column named ``Index``),
quantmod's columns named after their symbol (``MSFT.Close``), ``write.csv`` with quoted names and row names (each
test names the R call its lines come from)."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_helpers import utc_ms
from training_helpers import write_text_file as write

from cerebellar_norse.errors import DataError
from cerebellar_norse.training.data import load_csv_files

# timeSeries' MSFT data set (R package timeSeries 4021.105), its first three days
MSFT_DAYS = ['"2000-09-27",63.4375,63.5625,59.8125,60.625,53077800',
             '"2000-09-28",60.8125,61.875,60.625,61.3125,26180200',
             '"2000-09-29",61,61.3125,58.625,60.3125,37026800']
MSFT_TIMES = [utc_ms(2000, 9, 27), utc_ms(2000, 9, 28), utc_ms(2000, 9, 29)]


def test_write_zoo_index_column_is_the_time(tmp_path: Path) -> None:
    """``write.zoo(as.xts(MSFT), "MSFT.csv", sep = ",")`` names the dates' column ``"Index"``, which was no time
    column: the file was refused."""
    path = write(tmp_path, '"Index","Open","High","Low","Close","Volume"\n' + "\n".join(MSFT_DAYS) + "\n", "MSFT.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0
    assert data.markets[0].timestamp.tolist() == MSFT_TIMES
    assert data.markets[0].price.tolist() == [60.625, 61.3125, 60.3125]
    assert data.markets[0].volume.tolist() == [53077800, 26180200, 37026800]
    assert any("first column 'Index' used as the time" in n for n in data.notes)


def test_quantmod_columns_prefixed_by_their_symbol(tmp_path: Path) -> None:
    """``write.zoo(getSymbols("MSFT", auto.assign = FALSE), "MSFT.csv", sep = ",")``: quantmod names each column
    ``MSFT.Open``, …, ``MSFT.Adjusted``, none of them a price column, so the file was refused; it is read at
    ``Close`` (Yahoo's, adjusted for splits) with the symbol as its market."""
    header = '"Index","MSFT.Open","MSFT.High","MSFT.Low","MSFT.Close","MSFT.Volume","MSFT.Adjusted"'
    rows = [f"{r},{r.split(',')[4]}" for r in MSFT_DAYS]  # Adjusted: the close again, as in the data set's years
    path = write(tmp_path, header + "\n" + "\n".join(rows) + "\n", "prices.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0 and [m.market_id for m in data.markets] == ["MSFT"]
    assert data.markets[0].timestamp.tolist() == MSFT_TIMES
    assert data.markets[0].price.tolist() == [60.625, 61.3125, 60.3125]
    assert data.markets[0].volume.tolist() == [53077800, 26180200, 37026800]


def test_columns_of_several_symbols_are_not_stripped(tmp_path: Path) -> None:
    """``merge(Cl(MSFT), Cl(AAPL))`` has columns of two symbols: no one market, so no prefix is taken off; it is a
    table of closes, each column a market of its own."""
    path = write(tmp_path, '"Index","MSFT.Close","AAPL.Close"\n"2000-09-27",60.625,25.1\n"2000-09-28",61.3,25.4\n',
                 "m.csv")
    data = load_csv_files([path])
    assert sorted(m.market_id for m in data.markets) == ["AAPL.Close", "MSFT.Close"]


@pytest.mark.parametrize("name", ['"Index"', "index"])
def test_an_index_column_that_counts_rows_is_refused_as_such(tmp_path: Path, name: str) -> None:
    """An ``index`` column of row numbers (pandas' ``reset_index()`` of a RangeIndex) is no time: refused saying it
    counts the rows, as an unnamed one is, not read as ms of 1970."""
    path = write(tmp_path, f"{name},close\n0,1.5\n1,1.6\n2,1.7\n")
    with pytest.raises(DataError, match=r"the first column '[Ii]ndex' counts the rows \(0, 1, 2"):
        load_csv_files([path])


def test_write_csv_row_names_are_named_as_such(tmp_path: Path) -> None:
    """``write.csv(EuStockMarkets, "EuStockMarkets.csv")``: a ts object has no dates, and its row names count the
    rows from 1; the refusal names R's row names beside pandas' RangeIndex."""
    path = write(tmp_path, '"","DAX","SMI","CAC","FTSE"\n"1",1628.75,1678.1,1772.8,2443.6\n'
                           '"2",1613.63,1688.5,1750.5,2460.2\n"3",1606.51,1678.6,1718,2448.2\n')
    with pytest.raises(DataError, match=r"counts the rows \(1, 2, 3, …: a pandas RangeIndex, R's row names\)"):
        load_csv_files([path])


def test_decimal_years_are_named_as_such(tmp_path: Path) -> None:
    """``write.csv(data.frame(time = time(EuStockMarkets), EuStockMarkets), row.names = FALSE)``: a ts object's times
    are years with a fraction; each row was bad with the hint to multiply seconds by 1000, which was no help."""
    rows = "".join(f"{1991.49615384615 + i / 260:.11f},{1628.75 + i},{1678.1 + i}\n" for i in range(50))
    path = write(tmp_path, '"time","DAX","SMI"\n' + rows, "EuStockMarkets.csv")
    with pytest.raises(DataError) as exc:
        load_csv_files([path])
    message = str(exc.value)
    assert f"{path}:2: time '1991.49615384615' is not a whole number of ms since epoch; it looks like a decimal year" \
        in message
    assert "write the dates themselves" in message and "multiply them by 1000" not in message


def test_r_missing_values_written_na_are_no_values(tmp_path: Path) -> None:
    """R writes a missing value as ``NA`` (``write.zoo`` of an xts series with days without a value, ``write.csv``
    of a table of closes of tickers not yet listed); each such row was bad (``Close 'NA' is not a number``) and a
    few of them refused the file. A row of NA only, and a series' NA in a table of series, are skipped as pandas'
    NaN and empty fields are; an NA price beside values is still a bad row."""
    bars = write(tmp_path, '"Index","Open","High","Low","Close"\n"2007-01-05",50.37,50.37,50.22,50.33\n'
                           '"2007-01-06",NA,NA,NA,NA\n"2007-01-07",NA,NA,NA,NA\n"2007-01-08",50.03,50.10,49.97,49.99\n'
                           '"2007-01-09",49.99,49.99,49.80,NA\n', "sample_matrix.csv")
    data = load_csv_files([bars], max_bad_fraction=0.5)
    assert data.markets[0].timestamp.tolist() == [utc_ms(2007, 1, 5), utc_ms(2007, 1, 8)]
    assert data.skipped_rows == 2 and data.bad_rows == 1
    assert any("Close 'NA' is not a number" in r for r in data.report)
    table = write(tmp_path, '"","Date","AAPL","MSFT"\n"1",2020-01-01,1,NA\n"2",2020-01-02,2,2\n"3",2020-01-03,NA,3\n',
                  "closes.csv")
    data = load_csv_files([table])
    assert data.bad_rows == 0 and data.skipped_rows == 2
    by_market = {m.market_id: m.timestamp.tolist() for m in data.markets}
    assert by_market == {"AAPL": [utc_ms(2020, 1, 1), utc_ms(2020, 1, 2)],
                         "MSFT": [utc_ms(2020, 1, 2), utc_ms(2020, 1, 3)]}


def test_write_table_row_names_without_a_name_in_the_header(tmp_path: Path) -> None:
    """``write.table(as.data.frame(MSFT), "MSFT.csv", sep = ",")``: R writes the row names (the dates) as a first
    field that the header does not name, so the header named no time column and the file was refused."""
    path = write(tmp_path, '"Open","High","Low","Close","Volume"\n' + "\n".join(MSFT_DAYS) + "\n", "MSFT.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0
    assert data.markets[0].timestamp.tolist() == MSFT_TIMES
    assert data.markets[0].price.tolist() == [60.625, 61.3125, 60.3125]
    assert data.markets[0].volume.tolist() == [53077800, 26180200, 37026800]
    assert any("every row has one field more than the header names" in n for n in data.notes)


def test_a_header_with_a_time_column_and_one_name_missing_is_still_refused(tmp_path: Path) -> None:
    """A header that names its time but misses another name (backtrader's minute bars lack ``Time``) is no file of
    row names: refused as before, naming the missing column name."""
    path = write(tmp_path, "Date,Open,Close\n2006-01-02,09:01:00,3578.73,3580.0\n2006-01-02,09:02:00,3580.0,3581.5\n")
    with pytest.raises(DataError, match="a column name is missing from the header"):
        load_csv_files([path])


# TTR's ttrc data set (R package TTR 0.24), its first three days, as write.table(ttrc) writes them with its defaults:
# fields separated by single blanks, names quoted, the row numbers as an unnamed first column
TTRC_HEADER = '"Date" "Open" "High" "Low" "Close" "Volume"'
TTRC_DAYS = ['"1" 1985-01-02 3.18 3.18 3.08 3.08 1870906', '"2" 1985-01-03 3.09 3.15 3.09 3.11 3099506',
             '"3" 1985-01-04 3.11 3.12 3.08 3.09 2274157']
TTRC_TIMES = [utc_ms(1985, 1, 2), utc_ms(1985, 1, 3), utc_ms(1985, 1, 4)]


@pytest.mark.parametrize(("lines", "row_names"), [
    ([TTRC_HEADER, *TTRC_DAYS], True),  # write.table(ttrc)
    ([TTRC_HEADER, *(d.split(" ", 1)[1] for d in TTRC_DAYS)], False),  # write.table(ttrc, row.names = FALSE)
    (['"Index" "Open" "High" "Low" "Close" "Volume"',  # write.zoo(zoo(ttrc[, -1], ttrc$Date))
      *(f'"{d.split(" ")[1]}" ' + " ".join(d.split(" ")[2:]) for d in TTRC_DAYS)], False),
])
def test_write_table_default_blank_separator(tmp_path: Path, lines: list[str], row_names: bool) -> None:
    """R's ``write.table`` and ``write.zoo`` separate fields by single blanks unless told ``sep = ","``: such a file
    was read as one column and refused (no time column: the header ``"Date" "Open" …`` is one name). Its fields are
    split at the blanks (noted), the row numbers ``write.table`` writes beside a named time column are its row names,
    not a missing column name."""
    path = write(tmp_path, "\n".join(lines) + "\n", "ttrc.txt")
    data = load_csv_files([path])
    assert data.bad_rows == 0 and data.formats[0].separator == "blank"
    assert data.markets[0].timestamp.tolist() == TTRC_TIMES
    assert data.markets[0].price.tolist() == [3.08, 3.11, 3.09]
    assert data.markets[0].volume.tolist() == [1870906, 3099506, 2274157]
    assert any("fields separated by single blanks" in n for n in data.notes)
    assert any("every row has one field more than the header names" in n for n in data.notes) is row_names


def test_write_table_row_numbers_beside_a_named_time_column_with_commas(tmp_path: Path) -> None:
    """``write.table(ttrc, sep = ",")``: the row numbers beside the ``Date`` column made every row one field longer
    than the header, refused as a missing column name; rising whole numbers in that field are row names."""
    path = write(tmp_path, TTRC_HEADER.replace(" ", ",") + "\n" + "\n".join(d.replace(" ", ",") for d in TTRC_DAYS)
                 + "\n", "ttrc.csv")
    data = load_csv_files([path])
    assert data.bad_rows == 0 and data.markets[0].timestamp.tolist() == TTRC_TIMES
    assert data.markets[0].price.tolist() == [3.08, 3.11, 3.09]


def test_blank_separated_date_times_without_quotes_are_refused_saying_how_to_save(tmp_path: Path) -> None:
    """``write.table(d)`` of a data frame with a POSIXct column writes its date-times without quotes, so the blank
    inside each splits it in two fields: refused naming the date-time and the R call that writes the file readably,
    not as a missing column name."""
    path = write(tmp_path, '"time" "close"\n"1" 2020-01-02 09:30:00 99.37\n"2" 2020-01-02 09:31:00 99.55\n', "m.txt")
    with pytest.raises(DataError, match=r"the date-time '2020-01-02 09:30:00' is written without quotes.*"
                                        r"save it with write.csv\(x\)"):
        load_csv_files([path])


def test_a_line_of_words_is_not_taken_for_blank_separated_fields(tmp_path: Path) -> None:
    """A title line of words above a comma-separated header is still a title skipped (its blanks are no separator)."""
    path = write(tmp_path, "Prices from the exchange\ndate,close\n2020-01-02,1.5\n2020-01-03,1.6\n", "t.csv")
    data = load_csv_files([path])
    assert data.formats[0].separator == "," and data.markets[0].price.tolist() == [1.5, 1.6]
