"""`cerebellar-norse inspect-data`: how tick files are read, in text and JSON, and a refused load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cerebellar_norse.cli import main
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training.data import write_csv

QUOTE_SITE = ('"Date","Price","Open","High","Low","Vol.","Change %"\n'
              '"01/15/2020","3,289.29","3,282.27","3,298.66","3,280.69","1.23M","0.19%"\n'
              '"01/14/2020","3,283.15","3,285.35","3,294.25","3,277.19","-","-0.15%"\n'
              '"01/10/2020","3,265.35","3,281.81","3,282.99","3,260.86","2B","-0.29%"\n')
TICKS = ("timestamp,symbol,price,size\n1700000000000,S0,25.01,29\n1700000000500,S0,25.02,3\n"
         "1700000000600,S1,180.02,9\nnot-a-time,S1,180.03,9\n1700000001600,S1,180.04,1\n")


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CEREBELLAR_NORSE_TRAINING__MAX_BAD_ROW_FRACTION", "0.5")
    (tmp_path / "SPX.csv").write_text(QUOTE_SITE)
    (tmp_path / "ticks.csv").write_text(TICKS)
    return tmp_path


def test_text_says_how_each_file_was_read(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect-data", "SPX.csv", "ticks.csv"]) == 0  # names relative to paths.data_dir
    out = capsys.readouterr().out.splitlines()
    spx, ticks = data_dir / "SPX.csv", data_dir / "ticks.csv"
    assert out[:4] == [
        f"{spx}: separator ',', 1 header line, rows newest first (read in reverse)",
        "  time 'Date' (month/day/year), price 'Price', volume 'Vol.', market 'SPX' for every row",
        f"{ticks}: separator ',', 1 header line, rows oldest first",
        "  time 'timestamp', price 'price', volume 'size', market 'symbol'",
    ]
    assert out[4] == "rows 8, bad 1, ticks 7 in 3 markets"
    assert out[5:7] == ["bad rows:", f"  {ticks}:5: timestamp 'not-a-time' is not a time (ms since epoch or ISO 8601)"]
    assert f"  {spx}: 1 row without a volume (Vol. empty or '-'); volume 0 used" in out
    table = out[out.index(next(line for line in out if line.startswith("market "))):]
    assert table[1].split() == ["S0", "2", "2023-11-14T22:13:20Z", "2023-11-14T22:13:20.500Z", "00:00:00.500"]
    assert table[2].split() == ["S1", "2", "2023-11-14T22:13:20.600Z", "2023-11-14T22:13:21.600Z", "00:00:01"]
    assert table[3].split() == ["SPX", "3", "2020-01-10T00:00:00Z", "2020-01-15T00:00:00Z", "2d", "12:00:00"]


def test_json_holds_the_formats_markets_and_report(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect-data", "SPX.csv", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    (f,) = d["files"]
    assert f == {"path": str(data_dir / "SPX.csv"), "separator": ",", "header_lines": 1, "time": "Date", "time_unit": None,
                 "dates": "month/day/year", "price": "Price", "ask": None, "volume": "Vol.", "ask_volume": None,
                 "market": None, "default_market": "SPX", "newest_first": True, "decimal_comma": False}
    assert (d["rows"], d["bad_rows"], d["ticks"], d["report"]) == (3, 0, 3, [])
    assert d["markets"] == [{"market_id": "SPX", "ticks": 3, "first": "2020-01-10T00:00:00Z", "last": "2020-01-15T00:00:00Z",
                             "median_gap_ms": 216_000_000.0, "checks": []}]
    assert d["training"] == {"refused": "no market has enough ticks (need at least 38 per market)"}


def test_quotes_with_times_in_seconds(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (data_dir / "quotes.csv").write_text("time,sym,bid,ask,bid size,ask size\n1700000000.5,X,1,2,3,4\n1700000001,X,2,3,1,0\n")
    assert main(["inspect-data", "quotes.csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "  time 'time' (seconds), price 'bid' and 'ask' (mid), volume 'bid size' + 'ask size', market 'sym'"
    assert out[out.index("notes:") + 1:out.index("notes:") + 4] == [
        f"  {data_dir / 'quotes.csv'}: price is the mid of 'bid' and 'ask'",
        f"  {data_dir / 'quotes.csv'}: volume is 'bid size' + 'ask size'",
        f"  {data_dir / 'quotes.csv'}: time read as seconds since the epoch (the first, 1700000000.5, is 2023-11-14 22:13:20 UTC)"]
    assert main(["inspect-data", "quotes.csv", "--json"]) == 0
    f = json.loads(capsys.readouterr().out)["files"][0]
    assert (f["time_unit"], f["price"], f["ask"], f["volume"], f["ask_volume"]) == ("s", "bid", "ask", "bid size", "ask size")


def test_the_labels_training_would_see(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_csv(data_dir / "gen.csv", generate_ticks(6000, 2, seed=4))
    assert main(["inspect-data", "gen.csv", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)["training"]
    assert t["labels"] == "horizon 10 ticks, flat band 0.43 x volatility"
    counts = [sum(t[split][c] for c in ("down", "flat", "up")) for split in ("train", "validation", "test")]
    assert counts[0] > counts[1] > 0 and counts[2] > 0 and sum(counts) < 6000  # warm-up, embargo and horizon take some
    assert t["warnings"] == [f"class {c} has {t['train'][c] + t['validation'][c]} samples, fewer than the recommended 10000"
                             for c in ("down", "flat", "up")]
    assert main(["inspect-data", "gen.csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    i = out.index("labels for training (horizon 10 ticks, flat band 0.43 x volatility; down / flat / up):")
    assert out[i + 1].split() == ["train", str(t["train"]["down"]), "/", str(t["train"]["flat"]), "/", str(t["train"]["up"])]


def test_a_load_that_fails_exits_1_naming_the_problem(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (data_dir / "bad.csv").write_text("Symbol,Close\nA,1\n")
    assert main(["inspect-data", "bad.csv"]) == 1
    err = capsys.readouterr().err
    assert "bad.csv:1: no time column (expected one of timestamp" in err and "header is Symbol,Close" in err
    assert main(["inspect-data", "missing.csv"]) == 1
    assert "'missing.csv' does not exist in the data dir" in capsys.readouterr().err


def test_a_reader_that_stops_early_ends_the_command_quietly(data_dir: Path) -> None:
    """``inspect-data … | head``: the command stops with 141 (as a shell reports SIGPIPE), without a traceback."""
    rows = "".join(f"{1_700_000_000_000 + k},M{k:05d},{1 + k % 7},1\n" for k in range(4000))
    (data_dir / "many.csv").write_text("timestamp,market_id,price,volume\n" + rows)
    proc = subprocess.Popen([sys.executable, "-m", "cerebellar_norse.cli", "inspect-data", "many.csv"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().decode().startswith(f"{data_dir / 'many.csv'}: separator ','")
    proc.stdout.close()  # the reader goes away with 4,000 market lines (over 64 KiB) still to come
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_data_checks_name_repeats_gaps_and_outsized_moves(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    day = 86_400_000
    start = 1_577_836_800_000  # 2020-01-01
    rows = [(start + i * day, 100.0 * (1.001 if i % 2 else 0.999), 10.0) for i in range(60)]
    rows.insert(10, rows[9])  # the same tick twice
    rows = [*rows[:40], *((t + 365 * day, p, v) for t, p, v in rows[40:])]  # a year missing
    t50, _, v50 = rows[50]
    rows[50] = (t50, 10_000.0, v50)  # a price 100 times the others for one tick
    (data_dir / "Q.csv").write_text("timestamp,price,volume\n" + "".join(f"{t},{p},{v}\n" for t, p, v in rows))
    assert main(["inspect-data", "Q.csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    checks = out[out.index("data checks:") + 1:]
    assert checks[0] == "  Q: 1 tick repeats the previous one exactly (same time, price and volume): a file read twice, or a feed that resent?"
    assert checks[1].startswith("  Q: a gap of 366d 00:00:00 before 2021-02-08T00:00:00Z, 366 times the median gap (1d 00:00:00)")
    assert checks[2] == ("  Q: a move of +9910.0% at 2021-02-18T00:00:00Z (99.9 -> 10000), 2303 times the median move:"
                         " a bad print, an unadjusted split or a futures roll?")
    assert main(["inspect-data", "Q.csv", "--json"]) == 0
    (m,) = json.loads(capsys.readouterr().out)["markets"]
    assert [c.split(" ")[:3] for c in m["checks"]] == [["1", "tick", "repeats"], ["a", "gap", "of"], ["a", "move", "of"]]
    # an ordinary series says nothing
    (data_dir / "OK.csv").write_text("timestamp,price,volume\n" + "".join(f"{t},{p},{v}\n" for t, p, v in rows[11:40]))
    assert main(["inspect-data", "OK.csv"]) == 0
    assert "data checks:" not in capsys.readouterr().out


def test_a_headerless_binance_file_says_it_has_no_header_line(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    klines = "".join(f"{1704067200000 + k * 60_000},1.0,1.2,0.9,{1 + k / 100},5.0,{1704067259999 + k * 60_000},5.0,3,2.5,2.5,0\n"
                     for k in range(3))
    (data_dir / "BTCUSDT-1m-2024-01-01.csv").write_text(klines)
    assert main(["inspect-data", "BTCUSDT-1m-2024-01-01.csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [f"{data_dir / 'BTCUSDT-1m-2024-01-01.csv'}: separator ',', no header line, rows oldest first",
                       "  time 'open_time', price 'close', volume 'volume', market 'BTCUSDT-1m' for every row"]
    assert out[2] == "rows 3, bad 0, ticks 3 in 1 market"


MBP1 = ("ts_recv,ts_event,rtype,publisher_id,instrument_id,action,side,depth,price,size,flags,ts_in_delta,sequence,"
        "bid_px_00,ask_px_00,bid_sz_00,ask_sz_00,bid_ct_00,ask_ct_00,symbol\n"
        "1701302400000000000,1701302400000000000,1,1,5482,R,N,0,,0,8,0,0,,,0,0,0,0,ESZ3\n"
        "1701302401000000000,1701302401000000000,1,1,5482,A,B,0,4108.25,5,128,0,1,4108.25,4108.75,5,7,1,1,ESZ3\n"
        "1701302402000000000,1701302402000000000,1,1,5482,T,A,0,4108.25,3,0,0,2,4108.25,4108.75,2,7,1,1,ESZ3\n")


def test_a_databento_order_book_is_shown_read_at_its_mid(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (data_dir / "ESZ3-mbp-1.csv").write_text(MBP1)
    assert main(["inspect-data", "ESZ3-mbp-1.csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    path = data_dir / "ESZ3-mbp-1.csv"
    assert out[1] == "  time 'ts_recv' (ns), price 'bid_px_00' and 'ask_px_00' (mid), volume 'size', market 'symbol'"
    assert out[2] == "rows 3, bad 0, skipped 1, ticks 2 in 1 market"
    assert (f"  {path}: Databento order-book events (action A, R): price is the mid of bid_px_00 and ask_px_00 after"
            " each event, volume the size of trades (T, F) only; a row whose book lacks a side is skipped") in out
    assert main(["inspect-data", "ESZ3-mbp-1.csv", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["rows"], d["bad_rows"], d["skipped_rows"], d["ticks"]) == (3, 0, 1, 2)
    assert [(m["market_id"], m["ticks"]) for m in d["markets"]] == [("ESZ3", 2)]


def test_label_counts_are_training_s_without_encoding_the_ticks(data_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """inspect-data reports the classes per split that training would see, without encoding every tick into the
    network's inputs (192 bytes a tick it never read: ~1 GB for 5 million ticks)."""
    from cerebellar_norse.config import load_config
    from cerebellar_norse.training import trainer
    from cerebellar_norse.training.data import load_csv_files

    write_csv(data_dir / "gen.csv", generate_ticks(3000, 2, 4))
    prep = trainer.prepare(load_config(None), load_csv_files([data_dir / "gen.csv"], 0.5))
    expected = {name: dict(zip(("down", "flat", "up"), map(int, n), strict=True)) for name, n in
                (("train", prep.train_counts), ("validation", prep.val_counts), ("test", prep.test_counts))}

    def no_encoding(*args: object) -> None:
        raise AssertionError("inspect-data encoded the ticks")

    monkeypatch.setattr(trainer, "_encode_series", no_encoding)
    assert main(["inspect-data", "gen.csv", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["training"]
    assert {name: got[name] for name in expected} == expected and got["warnings"] == prep.warnings


@pytest.mark.parametrize("command", ["inspect-data", "train"])
def test_a_link_to_nothing_is_named_as_given_not_by_its_target(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              command: str) -> None:
    """A dangling symbolic link given by its path was named by its target alone (`/mnt/ticks/es.csv: cannot open: No
    such file or directory`), a path the user never typed."""
    link = tmp_path / "es.csv"
    link.symlink_to(tmp_path / "unmounted" / "es.csv")
    assert main([command, str(link)]) == 1
    err = capsys.readouterr().err
    assert f"{link}: cannot open: a symbolic link to '{tmp_path / 'unmounted' / 'es.csv'}', which does not exist" in err
    assert "Traceback" not in err
