"""Stock splits in daily closes that are not adjusted for them: taken out of the prices (training.adjust_splits),
noted with the date and ratio; a crash that matches no split ratio, a bad print and an intraday move are left."""

from __future__ import annotations

import json
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pytest
from training_helpers import tiny_cli_environ

from cerebellar_norse.cli import main
from cerebellar_norse.training.data import load_csv_files

DAYS = 300
SPLIT_AT = 200  # the first day at the new level
DAY_MOVE = 0.003  # the split day's own move besides the split (+0.3 %)


def _trading_days(n: int) -> list[date]:
    days, d = [], date(2018, 1, 2)
    while len(days) < n:
        if d.weekday() < 5:
            days.append(d)
        d += timedelta(days=1)
    return days


def _closes(seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """A stock's daily closes (1 % a day) and volumes, the split day's move set to ``DAY_MOVE``."""
    rng = np.random.default_rng(seed)
    r = rng.normal(0.0003, 0.01, DAYS)
    r[SPLIT_AT] = np.log1p(DAY_MOVE)
    return 100 * np.exp(np.cumsum(r)), rng.integers(1_000_000, 3_000_000, DAYS).astype(float)


def _write(path: Path, close: np.ndarray, volume: np.ndarray, adj_close: np.ndarray | None = None) -> Path:
    """``Date,Open,High,Low,Close[,Adj Close],Volume`` as a download writes it (closes to the cent)."""
    adj = adj_close is not None
    lines = ["Date,Open,High,Low,Close" + (",Adj Close" if adj else "") + ",Volume"]
    for i, d in enumerate(_trading_days(DAYS)):
        c = close[i]
        extra = f",{adj_close[i]:.4f}" if adj_close is not None else ""
        lines.append(f"{d},{c:.2f},{c * 1.01:.2f},{c * 0.99:.2f},{c:.2f}{extra},{int(volume[i])}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for k, v in tiny_cli_environ(tmp_path).items():
        monkeypatch.setenv(k, v)
    return tmp_path


@pytest.mark.parametrize(("ratio", "text", "done"), [
    (2.0, "2:1", "divided by 2 and the volumes multiplied by 2"),
    (3.0, "3:1", "divided by 3 and the volumes multiplied by 3"),
    (4.0, "4:1", "divided by 4 and the volumes multiplied by 4"),
    (1.5, "3:2", "divided by 1.5 and the volumes multiplied by 1.5"),
    (10.0, "10:1", "divided by 10 and the volumes multiplied by 10"),
    (0.1, "1:10", "multiplied by 10 and the volumes divided by 10"),
])
def test_a_split_is_taken_out_of_the_prices_and_noted(env: Path, capsys: pytest.CaptureFixture[str], ratio: float,
                                                     text: str, done: str) -> None:
    close, volume = _closes()
    raw = close.copy()
    raw[SPLIT_AT:] /= ratio  # as traded: the split a fall (or, reverse, a rise) of its ratio
    traded_volume = volume.copy()
    traded_volume[SPLIT_AT:] *= ratio
    path = _write(env / "XYZ.csv", raw, traded_volume)

    (m,) = load_csv_files([path], adjust_splits=True).markets
    moves = np.diff(np.log(m.price))
    assert np.max(np.abs(moves)) < 0.06  # no step left: the split day moves its own +0.3 %
    assert moves[SPLIT_AT - 1] == pytest.approx(np.log1p(DAY_MOVE), abs=0.002)
    np.testing.assert_allclose(m.price[SPLIT_AT:], np.round(raw[SPLIT_AT:], 2))  # later prices as written
    np.testing.assert_allclose(m.volume[:SPLIT_AT], np.floor(volume[:SPLIT_AT]) * ratio, rtol=1e-6)

    assert main(["inspect-data", "XYZ.csv", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (split,) = out["stock_splits"]
    assert split["market"] == "XYZ" and split["ratio"] == text
    assert split["time"] == f"{_trading_days(DAYS)[SPLIT_AT]}T00:00:00Z"
    note = split["note"]
    assert note in out["notes"]
    assert f"matches a {text} {'reverse ' if ratio < 1 else ''}split" in note and done in note
    assert "training.adjust_splits = false" in note and "--no-split-adjust" in note
    assert out["markets"][0]["checks"] == []  # the move is gone, so no data check tells it

    # turned off: every price as written, the move told by the data check as before
    assert main(["inspect-data", "XYZ.csv", "--json", "--no-split-adjust"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["stock_splits"] == [] and not any("split (" in n for n in off["notes"])
    assert "an unadjusted split" in off["markets"][0]["checks"][0]
    (m_off,) = load_csv_files([path]).markets
    np.testing.assert_allclose(m_off.price, np.round(raw, 2))


def test_a_crash_that_matches_no_split_ratio_is_left_as_it_is(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    close, volume = _closes()
    for fall in (0.34, 0.205, 0.52, 0.70):  # -34 %: 1 % off 3:2; -20.5 % off 5:4; -52 % off 2:1; -70 % off 3:1
        crashed = close.copy()
        crashed[SPLIT_AT:] *= (1 - fall) / (1 + DAY_MOVE)
        path = _write(env / "CRASH.csv", crashed, volume)
        (m,) = load_csv_files([path], adjust_splits=True).markets
        np.testing.assert_allclose(m.price, np.round(crashed, 2))
        assert main(["inspect-data", "CRASH.csv", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["stock_splits"] == []
        assert out["markets"][0]["checks"][0].startswith(f"a move of {-fall * 100:+.1f}%")


def test_a_move_that_matches_a_ratio_without_shares_to_split_is_left(tmp_path: Path) -> None:
    close, volume = _closes()
    fell = close.copy()
    fell[SPLIT_AT:] *= 0.666 / (1 + DAY_MOVE)  # -33.4 %, 0.1 % off 3:2, as WTI fell on 1991-01-17
    # a series without volumes (FRED's DCOILWTICO, an index level): no shares, no split
    days = _trading_days(DAYS)
    (tmp_path / "DCOILWTICO.csv").write_text("observation_date,DCOILWTICO\n"
                                             + "".join(f"{d},{p:.2f}\n" for d, p in zip(days, fell, strict=True)))
    data = load_csv_files([tmp_path / "DCOILWTICO.csv"], adjust_splits=True)
    assert data.stock_splits == []
    np.testing.assert_allclose(data.markets[0].price, np.round(fell, 2))
    # volumes that rise 3 times after a "reverse split": a jump on news
    rose = close.copy()
    rose[SPLIT_AT:] *= 2 * (1 + DAY_MOVE)  # +100 % on news, as a 1:2 reverse split would read, volumes up 3 times
    more = volume.copy()
    more[SPLIT_AT:] *= 3
    assert load_csv_files([_write(tmp_path / "R.csv", rose, more)], adjust_splits=True).stock_splits == []
    # the same moves with volumes are splits: volumes as traded (1.5 times as many shares after the split, half as
    # many after the reverse split), or already adjusted by the vendor (as many)
    split = volume.copy()
    split[SPLIT_AT:] *= 1.5
    for vol in (split, volume):
        assert [s["ratio"] for s in load_csv_files([_write(tmp_path / "S.csv", fell, vol)],
                                                   adjust_splits=True).stock_splits] == ["3:2"]
    reverse = volume.copy()
    reverse[SPLIT_AT:] /= 2
    for vol in (reverse, volume):
        assert [s["ratio"] for s in load_csv_files([_write(tmp_path / "S.csv", rose, vol)],
                                                   adjust_splits=True).stock_splits] == ["1:2"]


def test_a_split_in_prices_beside_volumes_the_vendor_adjusted(tmp_path: Path) -> None:
    """AAPL's 7:1 split of 2014-06-09 as a file of closes as traded and volumes adjusted writes it: 645.57 -> 93.70,
    +1.6 % besides the split, about as many shares a day before as after."""
    text = ("day,open,high,low,close,volume\n"
            + "".join(f"2014-05-{d:02d},640,650,630,{640 + d % 3},{80_000_000 + d * 10_000}\n" for d in range(1, 31))
            + "2014-06-02,630,640,625,628.65,92337700\n2014-06-03,628.46,638.74,628.25,637.54,73177300\n"
            "2014-06-04,637.44,647.89,636.11,644.82,83870500\n2014-06-05,646.2,649.37,642.61,647.35,75951400\n"
            "2014-06-06,649.9,651.26,644.47,645.57,87484600\n2014-06-09,92.7,93.88,91.75,93.7,75415000\n"
            "2014-06-10,94.73,95.05,93.57,94.25,62777000\n2014-06-11,94.13,94.76,93.47,93.86,45681000\n"
            "2014-06-12,94.04,94.12,91.9,92.29,54749000\n2014-06-13,92.2,92.44,90.88,91.28,54525000\n")
    (tmp_path / "AAPL.csv").write_text(text)
    data = load_csv_files([tmp_path / "AAPL.csv"], adjust_splits=True)
    assert [(s["time"], s["ratio"]) for s in data.stock_splits] == [("2014-06-09T00:00:00Z", "7:1")]
    note = data.stock_splits[0]["note"]
    assert "(with a move of +1.60% besides): read as the split, the prices before it divided by 7 (the volumes," \
           " about as many shares a day before it as after, were left: adjusted already)" in note
    assert data.markets[0].price[-6] == pytest.approx(645.57 / 7)
    assert data.markets[0].volume[-6] == 87484600  # as written


def test_a_bad_print_and_an_intraday_fall_are_no_splits(tmp_path: Path) -> None:
    close, volume = _closes()
    printed = close.copy()
    printed[SPLIT_AT] *= 10  # one tick at 10 times the price, then back: no 1:10 then 10:1
    (m,) = load_csv_files([_write(tmp_path / "P.csv", printed, volume)], adjust_splits=True).markets
    np.testing.assert_allclose(m.price, np.round(printed, 2))
    # minute bars of one day that halve within the day: a split never takes effect within a session
    start = 1_700_000_000_000 - 1_700_000_000_000 % 86_400_000 + 14 * 3_600_000
    price = 100 * np.exp(np.cumsum(np.random.default_rng(1).normal(0, 0.0005, 400)))
    price[200:] /= 2
    rows = "".join(f"{start + i * 60_000},{p:.4f},5\n" for i, p in enumerate(price))
    (tmp_path / "M.csv").write_text("timestamp,price,volume\n" + rows)
    (m,) = load_csv_files([tmp_path / "M.csv"], adjust_splits=True).markets
    np.testing.assert_allclose(m.price, np.round(price, 4))


def test_a_close_beside_an_adjusted_close_and_a_split_ratio_column(env: Path) -> None:
    close, volume = _closes()
    raw = close.copy()
    raw[SPLIT_AT:] /= 2
    volume[SPLIT_AT:] *= 2
    # Close as traded beside an Adj Close (no split ratio column): Close is read, and its split taken out
    path = _write(env / "A.csv", raw, volume, adj_close=close / 2)
    data = load_csv_files([path], adjust_splits=True)
    assert [s["ratio"] for s in data.stock_splits] == ["2:1"]
    np.testing.assert_allclose(data.markets[0].price, close / 2, rtol=0.002)
    # with a split ratio column the adjusted close is read: there is no split left to find
    lines = path.read_text().splitlines()
    body = [f"{line},{2.0 if i == SPLIT_AT else 1.0}" for i, line in enumerate(lines[1:])]
    (env / "B.csv").write_text("\n".join([lines[0] + ",Split Ratio", *body]) + "\n")
    data = load_csv_files([env / "B.csv"], adjust_splits=True)
    assert data.stock_splits == [] and any("price from 'Adj Close'" in n for n in data.notes)
    np.testing.assert_allclose(data.markets[0].price, close / 2, rtol=1e-4)


def test_train_and_evaluate_say_what_was_done(env: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CEREBELLAR_NORSE_NEURAL__WARMUP_TICKS", "20")
    monkeypatch.setenv("CEREBELLAR_NORSE_TRAINING__VOLATILITY_WINDOW", "20")
    close, volume = _closes()
    raw = close.copy()
    raw[SPLIT_AT:] /= 4
    volume[SPLIT_AT:] *= 4
    _write(env / "XYZ.csv", raw, volume)
    assert main(["train", "XYZ.csv", "--epochs", "1", "--activate", "--json"]) == 0
    captured = capsys.readouterr()
    trained = json.loads(captured.out.strip().splitlines()[-1])
    (split,) = trained["stock_splits"]
    assert split["ratio"] == "4:1" and split["note"] in captured.err
    report = env / "report.html"
    assert main(["evaluate", "XYZ.csv", "--json", "--bootstrap", "0", "--report", str(report)]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["stock_splits"] == [split] and f"note: {split['note']}" in captured.err
    assert "prices adjusted for stock splits" in report.read_text() and "matches a 4:1 split" in report.read_text()
    assert not summary["data_checks"]  # the -75 % day is not scored as a move


def test_a_training_job_can_read_every_price_as_written(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from cerebellar_norse.config import load_config
    from cerebellar_norse.training.jobs import TrainingRequest, job_config

    cfg = load_config(None, environ={})
    assert cfg.training.adjust_splits
    assert not job_config(cfg, TrainingRequest(files=["x.csv"], adjust_splits=False)).training.adjust_splits
    assert job_config(cfg, TrainingRequest(files=["x.csv"])).training.adjust_splits
    with pytest.raises(ValidationError, match="adjust_splits"):
        TrainingRequest.model_validate({"files": ["x.csv"], "adjust_splits": "no"})
