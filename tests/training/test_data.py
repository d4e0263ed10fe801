"""Training data: CSV header and columns, the bad-row report, labels, class warnings, data file names."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
from training_helpers import ConfigFactory

from cerebellar_norse.errors import DataError, InputError
from cerebellar_norse.training.data import (
    MIN_SAMPLES_PER_CLASS,
    class_counts,
    class_warnings,
    horizon_labels,
    load_csv_files,
    resolve_data_file,
)
from cerebellar_norse.training.jobs import run_training

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


@pytest.mark.parametrize("header", ["", "timestamp,market_id,price", "time,market,price,volume",
                                    "timestamp,market_id,price,volume,extra", f"{T0},A,100.0,10.0"])
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


# --------------------------------------------------------------------------------------
# Bad rows
# --------------------------------------------------------------------------------------

BAD_ROWS = {
    "missing field": (f"{T0 + 500},A,100.5", "expected 4 fields, got 3"),
    "price not a number": (f"{T0 + 500},A,abc,10", "price 'abc' is not a number"),
    "volume not a number": (f"{T0 + 500},A,100,ten", "volume 'ten' is not a number"),
    "timestamp not an integer": (f"{T0 + 0.5},A,100,10", "is not an integer"),
    "price not finite": (f"{T0 + 500},A,inf,10", "price 'inf' is not finite"),
    "volume not finite": (f"{T0 + 500},A,100,nan", "volume 'nan' is not finite"),
    "negative volume": (f"{T0 + 500},A,100,-1", "volume -1.0 is negative"),
    "zero price": (f"{T0 + 500},A,0,10", "price 0.0 is not > 0"),
    "negative price": (f"{T0 + 500},A,-3,10", "price -3.0 is not > 0"),
    "timestamp in seconds": ("1640995200,A,100,10", "is not a plausible time in ms since epoch"),
    "timestamp in microseconds": (f"{T0 * 1000},A,100,10", "is not a plausible time in ms since epoch"),
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
    assert data.report == [f"{path}:6: time goes backwards for market 'A' ({T0 + 1500} < {T0 + 2000})"]
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
    with pytest.raises(DataError, match="no valid tick rows"):
        load_csv_files([path])


def test_missing_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot open"):
        load_csv_files([tmp_path / "nope.csv"])


# --------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------


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
                                  "a.csv\x00"])
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
