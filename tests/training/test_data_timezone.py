"""The zone of tick files' times written without an offset: ``training.data_timezone``, ``--timezone``, and the
``data_timezone`` of ``POST /training``. Only such times move; numbers since the epoch and times with their own offset
or zone are exact."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from training_helpers import FILE_COMMANDS, training_seen

from cerebellar_norse.cli import main
from cerebellar_norse.config import load_config
from cerebellar_norse.errors import ConfigError
from cerebellar_norse.timezones import parse_zone, zone_name
from cerebellar_norse.training.data import TickData, load_csv_files, parse_time_ms
from cerebellar_norse.training.jobs import TrainingRequest, job_config

NEW_YORK = parse_zone("America/New_York")
HOUR_MS = 3_600_000
# HistData's ASCII bars: local time in EST (UTC-05:00 all year), fields separated by ';'
HISTDATA = ("Date;Open;High;Low;Close;Volume\n"
            "20200102 170000;1.12100;1.12110;1.12090;1.12100;0\n"
            "20200102 170100;1.12100;1.12120;1.12100;1.12110;0\n")


def ms(text: str) -> int:
    """ms since the epoch of an ISO 8601 time with an offset."""
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def load(tmp_path: Path, text: str, zone: Any = UTC, name: str = "ticks.csv", bad: float = 0.0) -> TickData:
    path = tmp_path / name
    path.write_text(text)
    return load_csv_files([path], bad, zone)


def times(data: TickData) -> list[int]:
    (market,) = data.markets
    return [int(t) for t in market.timestamp]


def zone_notes(data: TickData) -> list[str]:
    return [n for n in data.notes if "times without an offset" in n]


# --------------------------------------------------------------------------------------
# Reading files in a zone
# --------------------------------------------------------------------------------------


def test_a_histdata_file_read_at_minus_five_lands_five_hours_later(tmp_path: Path) -> None:
    as_utc = load(tmp_path, HISTDATA)
    as_est = load(tmp_path, HISTDATA, parse_zone("-05:00"))
    assert times(as_utc) == [ms("2020-01-02T17:00:00+00:00"), ms("2020-01-02T17:01:00+00:00")]
    assert times(as_est) == [t + 5 * HOUR_MS for t in times(as_utc)]
    assert zone_notes(as_est) == [f"{tmp_path / 'ticks.csv'}: times without an offset read in UTC-05:00"]
    assert zone_notes(as_utc) == []


def test_a_us_eastern_file_follows_daylight_saving_time(tmp_path: Path) -> None:
    # FirstRate Data style: US/Eastern local times, EST (-05:00) before 2024-03-10 02:00, EDT (-04:00) after
    data = load(tmp_path, "timestamp,close\n2024-03-09 16:00:00,1\n2024-03-10 01:59:00,2\n2024-03-10 03:00:00,3\n"
                          "2024-03-11,4\n", NEW_YORK)
    assert times(data) == [ms("2024-03-09T16:00:00-05:00"), ms("2024-03-10T01:59:00-05:00"),
                           ms("2024-03-10T03:00:00-04:00"), ms("2024-03-11T00:00:00-04:00")]  # a date: local midnight


def test_a_local_time_the_clocks_skip_is_a_bad_row_naming_the_gap(tmp_path: Path) -> None:
    data = load(tmp_path, "timestamp,close\n2024-03-10 01:30,1\n2024-03-10 02:30,2\n2024-03-10 03:30,3\n", NEW_YORK,
                bad=0.5)
    assert times(data) == [ms("2024-03-10T01:30:00-05:00"), ms("2024-03-10T03:30:00-04:00")]
    assert data.report == [f"{tmp_path / 'ticks.csv'}:3: timestamp '2024-03-10 02:30' does not exist in America/New_York:"
                           " the clocks go forward by 1:00:00 over it (when daylight saving time starts)"]


def test_a_compact_local_time_the_clocks_skip_is_a_bad_row_too(tmp_path: Path) -> None:
    data = load(tmp_path, "timestamp,close\n202403100130,1\n202403100230,2\n202403100330,3\n", NEW_YORK, bad=0.5)
    assert len(times(data)) == 2
    assert data.report == [f"{tmp_path / 'ticks.csv'}:3: timestamp '202403100230' does not exist in America/New_York:"
                           " the clocks go forward by 1:00:00 over it (when daylight saving time starts)"]


def test_the_repeated_hour_is_read_as_its_second_run_where_the_first_would_go_back(tmp_path: Path) -> None:
    # 2024-11-03: 01:00-01:59 comes twice in New York (EDT, then EST); a MetaTrader-style date and time column pair
    data = load(tmp_path, "<DATE>,<TIME>,<CLOSE>\n2024.11.03,01:10,1\n2024.11.03,01:50,2\n2024.11.03,01:10,3\n"
                          "2024.11.03,02:10,4\n", NEW_YORK)
    assert times(data) == [ms("2024-11-03T01:10:00-04:00"), ms("2024-11-03T01:50:00-04:00"),
                           ms("2024-11-03T01:10:00-05:00"), ms("2024-11-03T02:10:00-05:00")]
    assert data.report == []
    assert any("1 row in the hour that the time zone repeats" in n for n in data.notes)


def test_without_a_zone_of_daylight_saving_time_going_back_is_still_a_bad_row(tmp_path: Path) -> None:
    text = "timestamp,close\n2024-11-03 01:10,1\n2024-11-03 01:50,2\n2024-11-03 01:10,3\n"
    data = load(tmp_path, text, parse_zone("-05:00"), bad=0.5)
    assert len(times(data)) == 2 and "time goes backwards" in data.report[0]


@pytest.mark.parametrize("zone", ["America/New_York", "+02:00", "UTC-05:00"])
def test_epoch_numbers_and_times_with_their_own_offset_or_zone_do_not_move(tmp_path: Path, zone: str) -> None:
    files = {
        "ms.csv": "timestamp,close\n1704186000000,1\n1704186060000,2\n",
        "seconds.csv": "timestamp,close\n1704186000,1\n1704186060,2\n",
        "iso.csv": "timestamp,close\n2024-01-02T09:00:00Z,1\n2024-01-02T10:01:00+01:00,2\n2024-01-02T04:02:00-05:00,3\n",
        "dukascopy.csv": "Gmt time,Close\n02.01.2024 10:00:00.000 GMT+0100,1\n02.01.2024 10:01:00.000 GMT+0100,2\n",
        "ib.csv": "date,close\n20240102 04:00:00 US/Eastern,1\n20240102 04:01:00 US/Eastern,2\n",
        # its own zone, the very one the file is read in (ZoneInfo keeps one object per name): no note either
        "ib_new_york.csv": "date,close\n20240102 04:00:00 America/New_York,1\n20240102 04:01:00 America/New_York,2\n",
    }
    for name, text in files.items():
        assert times(load(tmp_path, text, parse_zone(zone), name=name)) == times(load(tmp_path, text, name=name)), name
        assert zone_notes(load(tmp_path, text, parse_zone(zone), name=name)) == [], name


def test_the_default_zone_reads_as_before_without_a_note(tmp_path: Path) -> None:
    text = "timestamp,close\n2020-01-02,1\n2020-01-02 15:30,2\n"
    data = load(tmp_path, text)
    assert times(data) == [ms("2020-01-02T00:00:00+00:00"), ms("2020-01-02T15:30:00+00:00")]
    assert times(load(tmp_path, text, parse_zone("UTC"))) == times(data)
    assert zone_notes(data) == []


def test_a_date_written_yyyymmdd_is_midnight_in_the_zone(tmp_path: Path) -> None:
    data = load(tmp_path, "date,close\n20200102,1\n20200103,2\n", parse_zone("+02:00"))
    assert times(data) == [ms("2020-01-01T22:00:00+00:00"), ms("2020-01-02T22:00:00+00:00")]


def test_since_without_an_offset_is_read_in_the_zone() -> None:
    assert parse_time_ms("2020-01-02T17:00", "--since", parse_zone("-05:00")) == ms("2020-01-02T22:00:00+00:00")
    assert parse_time_ms("2020-01-02T17:00Z", "--since", parse_zone("-05:00")) == ms("2020-01-02T17:00:00+00:00")


# --------------------------------------------------------------------------------------
# How a zone is written
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "offset"), [("+02:00", 2), ("-05:00", -5), ("UTC-05:00", -5), ("utc+2", 2),
                                              ("GMT-0500", -5), ("-05", -5), (" +05:30 ", 5.5), ("-00:00", 0)])
def test_a_fixed_offset_may_be_written_many_ways(text: str, offset: float) -> None:
    zone = parse_zone(text)
    assert zone.utcoffset(None) == timedelta(hours=offset)
    assert zone_name(zone) == ("UTC" if offset == 0 else str(timezone(timedelta(hours=offset))))


def test_utc_and_iana_names() -> None:
    assert parse_zone("UTC") is UTC and parse_zone("utc") is UTC
    assert zone_name(parse_zone("Europe/London")) == "Europe/London"


@pytest.mark.parametrize(("text", "why"), [("America/NewYork", "time zone database"), ("", "is not a time zone"),
                                           ("+15:00", "at most 14:00"), ("+02:75", "00 to 59"), ("5", "is not a time zone"),
                                           ("../etc/passwd", "time zone database"), ("America", "time zone database")])
def test_a_bad_zone_is_refused_naming_it(text: str, why: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_zone(text)
    assert repr(text) in str(info.value) and why in str(info.value)


# --------------------------------------------------------------------------------------
# Config, command line, HTTP request
# --------------------------------------------------------------------------------------


def test_the_config_key_is_checked_at_load() -> None:
    assert load_config(environ={}).training.data_timezone == "UTC"
    cfg = load_config(environ={"CEREBELLAR_NORSE_TRAINING__DATA_TIMEZONE": '"America/New_York"'})
    assert cfg.training.data_zone is NEW_YORK
    with pytest.raises(ConfigError) as info:
        load_config(environ={"CEREBELLAR_NORSE_TRAINING__DATA_TIMEZONE": '"Mars/Olympus"'})
    (problem,) = info.value.problems
    assert problem.key == "training.data_timezone" and "'Mars/Olympus' is not a time zone" in str(problem)


def test_validate_config_names_a_bad_zone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[training]\ndata_timezone = "EST-5"\n')
    assert main(["--config", str(path), "--validate-config"]) == 1
    err = capsys.readouterr().err
    assert "training.data_timezone: 'EST-5' is not a time zone" in err and "Traceback" not in err


@pytest.fixture
def cli_env(cli_dirs: Path) -> Path:
    (cli_dirs / "EURUSD.csv").write_text(HISTDATA)
    return cli_dirs


@pytest.mark.parametrize("argv", [["train", "EURUSD.csv"], ["evaluate", "EURUSD.csv"], ["inspect-data", "EURUSD.csv"],
                                  ["replay", "EURUSD.csv"]])
def test_a_bad_timezone_option_is_a_usage_error(argv: list[str], cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--timezone", "Mars/Olympus"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--timezone: 'Mars/Olympus' is not a time zone" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("name", "command"), FILE_COMMANDS)
def test_the_timezone_option_overrides_the_config_key(name: str, command: str, cli_env: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CEREBELLAR_NORSE_TRAINING__DATA_TIMEZONE", '"Europe/London"')
    argv = [name, "EURUSD.csv"]
    seen = training_seen(monkeypatch, command, "data_timezone",
                         [*argv, "--timezone", "-05:00"], argv)  # a value starting with '-' is no option
    assert seen == ["-05:00", "Europe/London"]


def test_inspect_data_reads_in_the_timezone_given(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect-data", "EURUSD.csv", "--timezone", "-05:00"]) == 0
    out = capsys.readouterr().out
    assert "2020-01-02T22:00:00Z" in out and "times without an offset read in UTC-05:00" in out


def test_a_training_request_overrides_the_zone_and_refuses_a_bad_one(tmp_path: Path) -> None:
    cfg = load_config(environ={})
    req = TrainingRequest.model_validate({"files": ["a.csv"], "data_timezone": "America/New_York"})
    assert job_config(cfg, req).training.data_zone is NEW_YORK
    assert job_config(cfg, TrainingRequest.model_validate({"files": ["a.csv"]})).training.data_timezone == "UTC"
    with pytest.raises(ValidationError) as info:
        TrainingRequest.model_validate({"files": ["a.csv"], "data_timezone": "Mars/Olympus"})
    (error,) = info.value.errors()
    assert error["loc"] == ("data_timezone",) and "'Mars/Olympus' is not a time zone" in error["msg"]


@pytest.mark.parametrize("zone", ["UTC", "utc", "-05:00", "+0530", "UTC+02:00", "GMT-3", "+14:00", "America/New_York",
                                  " UTC", "UTC +02:00", "+14:30", "-05:60", "", "america/new_york", "Mars/Olympus",
                                  "localtime", "Factory"])
def test_a_training_request_takes_exactly_the_zones_its_schema_describes(zone: str) -> None:
    """A client built from the OpenAPI schema (or a fuzzer) and the service agree on every zone: accepted when it
    matches the schema's pattern or is in its list of names, refused (naming the field) otherwise."""
    import re

    schema = TrainingRequest.model_json_schema()["properties"]["data_timezone"]["anyOf"]
    names = next(s["enum"] for s in schema if "enum" in s)
    pattern = next(s["pattern"] for s in schema if "pattern" in s)
    described = zone in names or re.search(pattern, zone) is not None
    try:
        TrainingRequest.model_validate({"files": ["a.csv"], "data_timezone": zone})
        accepted = True
    except ValidationError as exc:
        accepted = False
        assert exc.errors()[0]["loc"] == ("data_timezone",)
    assert accepted == described
    assert accepted == (zone in ("UTC", "utc", "-05:00", "+0530", "UTC+02:00", "GMT-3", "+14:00", "America/New_York"))


@pytest.mark.parametrize("zone", ["+05", "-09", "UTC+05", "utc-00", "GMT+09", "GMT-07"])
def test_a_request_takes_hours_alone_with_two_digits_as_the_config_does(zone: str) -> None:
    """``UTC+10`` was accepted but ``UTC+05`` refused (and missing from the schema's pattern), though the config,
    ``--timezone`` and the module's own rule ("hours alone") read both."""
    import re

    pattern = next(s["pattern"] for s in TrainingRequest.model_json_schema()["properties"]["data_timezone"]["anyOf"]
                   if "pattern" in s)
    assert re.search(pattern, zone) is not None
    req = TrainingRequest.model_validate({"files": ["a.csv"], "data_timezone": zone})
    assert job_config(load_config(environ={}), req).training.data_zone == parse_zone(zone)


def test_a_refused_zone_is_not_echoed_back_whole() -> None:
    """A 1 MB value of data_timezone: the 422 names it in at most a few hundred characters (as every other refused
    value), not the whole megabyte."""
    from cerebellar_norse.api.errors import validation_response

    with pytest.raises(ValidationError) as info:
        TrainingRequest.model_validate({"files": ["a.csv"], "data_timezone": "x" * 1_000_000})
    status, body = validation_response(info.value.errors())
    assert status == 422 and body["error"]["field"] == "data_timezone"
    message = body["error"]["message"]
    assert len(message) < 1200 and "(1000000 characters)" in message and "is not a time zone" in message


@pytest.mark.parametrize(("zone", "words"), [("posix/America/New_York", "is not a time zone of the system's"),
                                              ("UTC +02:00", "has blanks"), ("America/New_York\n", "has blanks")])
def test_a_zone_refused_only_by_the_request_says_why(zone: str, words: str) -> None:
    with pytest.raises(ValidationError) as info:
        TrainingRequest.model_validate({"files": ["a.csv"], "data_timezone": zone})
    assert words in info.value.errors()[0]["msg"]


@pytest.mark.parametrize("name", ["localtime", "Factory", "posixrules", "posix/America/New_York", "right/UTC"])
def test_database_files_that_name_no_place_are_no_zone(name: str) -> None:
    """Debian's ``localtime`` (the host's own setting: a file would be read differently on each host), tzdata's
    placeholders and its posix/ and right/ copies are refused in the config and on the command line too, as the
    request's schema refuses them: one list of zones for all three."""
    from cerebellar_norse.timezones import parse_zone

    with pytest.raises(ValueError, match="is not a time zone of the system's time zone database"):
        parse_zone(name)
