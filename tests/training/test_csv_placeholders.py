"""Time columns that must not crash the reader or be read as times: digits int() refuses, a sliced RangeIndex."""

from __future__ import annotations

from pathlib import Path

import pytest

from cerebellar_norse.errors import DataError
from cerebellar_norse.training.data import load_csv_files


def test_superscript_digits_are_bad_rows_not_a_crash(tmp_path: Path) -> None:
    p = tmp_path / "sup.csv"
    p.write_text("timestamp,close,volume\n²,1.0,1\n³,1.1,1\n¹,1.2,1\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"sup\.csv:2: timestamp '²' is not a time"):
        load_csv_files([p])


@pytest.mark.parametrize("start", [5, 1000])
def test_a_range_index_of_a_sliced_frame_is_no_time_column(tmp_path: Path, start: int) -> None:
    p = tmp_path / "sliced.csv"
    p.write_text(",close,volume\n" + "".join(f"{i},{1 + i / 1000:.3f},1\n" for i in range(start, start + 600)))
    with pytest.raises(DataError, match="counts the rows"):
        load_csv_files([p])


@pytest.mark.parametrize(("times", "first"), [
    ([f"202001{d:02d}" for d in range(1, 29)], 1577836800000),  # YYYYMMDD dates
    ([f"2024010209{m:02d}" for m in range(28)], 1704186000000),  # YYYYMMDDHHMM
    ([str(1700000000 + i) for i in range(28)], 1700000000000),  # seconds
])
@pytest.mark.parametrize("zero", ["0", "0.0", "00000000"])
def test_a_zero_first_time_is_a_placeholder_not_the_unit(tmp_path: Path, times: list[str], first: int, zero: str) -> None:
    p = tmp_path / "z.csv"
    p.write_text("timestamp,close,volume\n" + f"{zero},1.0,1\n" + "".join(f"{t},{1 + i / 100:.2f},1\n" for i, t in enumerate(times)))
    data = load_csv_files([p], max_bad_fraction=0.5)
    assert int(data.markets[0].timestamp[0]) == first, data.report


def test_spreadsheet_serial_dates_are_named_as_such_not_as_seconds(tmp_path: Path) -> None:
    # a date column saved as numbers (45293 is 2024-01-02): the hint was to multiply them by 1000, as seconds
    path = tmp_path / "serial.csv"
    path.write_text("Date,Close\n45293,1\n45294,2\n45294.5,3\n", encoding="utf-8")
    data = load_csv_files([path], max_bad_fraction=0.5)
    assert any("Date 45293 read as ms since epoch is 1970-01-01; if the file's times are spreadsheet serial dates"
               " (days since 1899-12-30: this one is 2024-01-02 00:00:00), format the column as dates" in n
               for n in data.notes)
    assert data.report == [f"{path}:4: Date '45294.5' is not a whole number of ms since epoch; if the file's times are"
                           " spreadsheet serial dates (days since 1899-12-30: this one is 2024-01-03 12:00:00), format"
                           " the column as dates (YYYY-MM-DD HH:MM:SS) before saving it"]


def test_numbers_with_unquoted_digit_groups_are_named_as_the_cause(tmp_path: Path) -> None:
    # 1,234.50 without quotes is two fields: the report said only that a column name is missing from the header
    path = tmp_path / "grouped.csv"
    path.write_text("Date,Close,Volume\n2024-01-02,1,234.50,10\n2024-01-03,1,235.50,10\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"every row has 4 fields: a column name is missing from the header, or a number"
                                        r" with digit groups written without quotes, such as 1,234.50, is split at its"
                                        r" comma: quote such numbers or save them without digit groups"):
        load_csv_files([path])
    path.write_text("Date,Close,Volume\n2024-01-02,999.5,10\n2024-01-03,1,000.5,10\n", encoding="utf-8")
    assert load_csv_files([path], max_bad_fraction=0.5).report == [
        f"{path}:3: expected 3 fields, got 4 (a number with digit groups written without quotes, such as 1,000.5, is"
        " split at its comma: quote such numbers or save them without digit groups)"]
