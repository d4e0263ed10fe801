"""JSON log lines (journald) and rotation of the optional log file."""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
from pathlib import Path

import pytest

from cerebellar_norse.config import LoggingConfig
from cerebellar_norse.observability.context import request_id_var
from cerebellar_norse.observability.logging import effective_level, setup_logging


def _lines(buf: io.StringIO) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(x) for x in buf.getvalue().splitlines() if x.strip()]


def test_json_line_has_operator_fields() -> None:
    buf = io.StringIO()
    setup_logging(LoggingConfig(level="DEBUG"), stream=buf)
    token = request_id_var.set("req-123")
    try:
        logging.getLogger("cerebellar_norse.test").info("tick processed", extra={"fields": {"processing_time_ns": 4200, "market_id": "TEST"}})
    finally:
        request_id_var.reset(token)
    (line,) = [x for x in _lines(buf) if x["message"] == "tick processed"]
    assert line["level"] == "INFO" and line["logger"] == "cerebellar_norse.test"
    assert line["request_id"] == "req-123"
    assert line["fields"]["processing_time_ns"] == 4200
    assert line["ts"].endswith("Z")


def test_level_filters_and_env_override() -> None:
    buf = io.StringIO()
    setup_logging(LoggingConfig(level="WARNING"), stream=buf)
    logging.getLogger("x").info("hidden")
    logging.getLogger("x").warning("shown")
    assert [x["message"] for x in _lines(buf)] == ["shown"]
    assert effective_level(LoggingConfig(level="INFO"), {"CEREBELLAR_NORSE_LOG": "debug"}) == "DEBUG"
    assert effective_level(LoggingConfig(level="INFO"), {"CEREBELLAR_NORSE_LOG": "bogus"}) == "INFO"


def test_an_invalid_level_in_the_environment_is_said_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """CEREBELLAR_NORSE_LOG=trace was ignored without a word (the file's level applied, nothing logged)."""
    root_level = logging.getLogger().level
    try:
        buf = io.StringIO()
        monkeypatch.setenv("CEREBELLAR_NORSE_LOG", "trace")
        setup_logging(LoggingConfig(level="ERROR"), stream=buf)
        (line,) = _lines(buf)
        assert line["level"] == "WARNING" and "CEREBELLAR_NORSE_LOG='trace' is not a log level" in line["message"]
        assert "the level is ERROR" in line["message"] and logging.getLogger().level == logging.ERROR
        for good in ("debug", ""):
            buf = io.StringIO()
            monkeypatch.setenv("CEREBELLAR_NORSE_LOG", good)
            setup_logging(LoggingConfig(level="ERROR"), stream=buf)
            assert not _lines(buf)
    finally:
        logging.getLogger().setLevel(root_level)


def test_exceptions_are_one_json_line() -> None:
    buf = io.StringIO()
    setup_logging(LoggingConfig(level="INFO"), stream=buf)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("x").exception("failed")
    (line,) = _lines(buf)
    assert "ValueError: boom" in line["exception"]


def test_file_rotation_with_gzip(tmp_path: Path) -> None:
    log_file = tmp_path / "application.log"
    setup_logging(LoggingConfig(level="INFO", file=log_file, max_size=2000, max_files=3, compression="gzip"), stream=io.StringIO())
    log = logging.getLogger("rot")
    for k in range(200):
        log.info("line %d %s", k, "x" * 50)
    rotated = sorted(tmp_path.glob("application.log.*.gz"))
    assert 1 <= len(rotated) <= 3, rotated
    with gzip.open(rotated[0], "rt") as fh:
        first = json.loads(fh.readline())
    assert first["logger"] == "rot"
    assert log_file.stat().st_size <= 2000 + 200
    setup_logging(LoggingConfig(level="INFO"), stream=io.StringIO())  # detach the file handler


def test_a_log_file_that_cannot_be_written_is_a_config_error(tmp_path: Path) -> None:
    """A directory (or an unwritable path) as logging.file: one line naming the key at start, not a traceback."""
    import subprocess
    import sys

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[logging]\nfile = "{tmp_path}"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n'
                   "[training]\nbootstrap_on_first_run = false\n")
    proc = subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "--config", str(cfg), "--port", "9"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "logging.file: cannot write the log file" in proc.stderr and "Is a directory" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "state").exists()  # refused before the state dir was touched


def test_lines_to_journald_carry_their_syslog_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On journald's stream (JOURNAL_STREAM names it) each line starts with <N>, which journald takes as the
    priority and strips (`journalctl -p err`); the file and any other stream get the bare JSON."""
    log_file = tmp_path / "application.log"
    with open(tmp_path / "stdout", "w+", encoding="utf-8") as out:
        st = os.fstat(out.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        setup_logging(LoggingConfig(level="DEBUG", file=log_file), stream=out)
        for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL):
            logging.getLogger("x").log(level, "at %s", logging.getLevelName(level))
        out.flush()
        out.seek(0)
        lines = out.read().splitlines()
    setup_logging(LoggingConfig(level="INFO"), stream=io.StringIO())  # detach the file handler
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>", "<2>"]
    assert [json.loads(line[3:])["level"] for line in lines] == ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    assert all(line.startswith("{") for line in log_file.read_text().splitlines())
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")  # another stream: no prefix
    buf = io.StringIO()
    setup_logging(LoggingConfig(level="INFO"), stream=buf)
    logging.getLogger("x").error("plain")
    assert buf.getvalue().startswith("{")


@pytest.mark.asyncio
async def test_every_figure_of_the_processing_summary_covers_the_same_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A quiet minute after a cold tick reported the cold tick's time as its p99: ticks covered the minute, the times
    the last 4096 batches. Every figure of a line now covers the minute since the previous one."""
    import asyncio
    from types import SimpleNamespace

    import numpy as np

    from cerebellar_norse.api import lifecycle
    from cerebellar_norse.api.server import build_service
    from cerebellar_norse.config import load_checked_config
    from cerebellar_norse.engine.records import BatchRecord

    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"),
               "CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN": "false"}
    state = build_service(load_checked_config(None, environ=environ))

    def batches(per_tick_ns: int, n: int) -> None:
        """``n`` one-tick batches of ``per_tick_ns`` each, as the engine counts and reports them."""
        for _ in range(n):
            state.engine.stats.ticks += 1
            state.metrics.on_batch(BatchRecord(1, per_tick_ns, np.zeros(1), np.zeros((3, 1)), np.zeros((1, 3))))

    intervals = [lambda: batches(5_000_000, 1),  # a cold tick of 5 ms
                 lambda: batches(9_000, 10),  # a quiet minute of 9 us ticks
                 lambda: None]  # no tick: no line

    async def one_interval(_seconds: float) -> None:
        if not intervals:
            raise asyncio.CancelledError
        intervals.pop(0)()

    monkeypatch.setattr(lifecycle, "asyncio", SimpleNamespace(sleep=one_interval))
    with caplog.at_level(logging.INFO, logger="cerebellar_norse.lifecycle"), pytest.raises(asyncio.CancelledError):
        await lifecycle.periodic_summary(state, 60.0)
    cold, quiet = [r.fields for r in caplog.records if r.getMessage() == "processing summary"]  # type: ignore[attr-defined]
    assert cold["ticks"] == 1 and cold["processing_time_ns"] == cold["processing_time_ns_p99"] == 5_000_000
    assert quiet["ticks"] == 10 and quiet["ticks_per_second"] == round(10 / 60, 1)
    assert quiet["processing_time_ns"] == quiet["processing_time_ns_p99"] == 9_000  # exact, the minute's own ticks


def test_a_failed_start_on_journalds_stream_is_an_error_line(tmp_path: Path) -> None:
    """Under systemd a start that fails says why in one stderr line: on journald's stream it carries priority err
    (``<3>``), so ``journalctl -u cerebellar-norse -p err`` shows it; on any other stream it is the bare line."""
    import subprocess
    import sys

    state = tmp_path / "state"
    state.mkdir()
    (state / "models").write_text("")  # not a directory: the start is refused with one line
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{state}"\n[training]\nbootstrap_on_first_run = false\n')
    argv = [sys.executable, "-m", "cerebellar_norse.cli", "--config", str(cfg), "--port", "9"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEREBELLAR_NORSE_")}
    with open(tmp_path / "stderr", "w+", encoding="utf-8") as err:
        st = os.fstat(err.fileno())
        proc = subprocess.run(argv, stderr=err, stdout=subprocess.DEVNULL, timeout=120,
                              env={**env, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        err.seek(0)
        journal_lines = err.read().splitlines()
    assert proc.returncode == 1, journal_lines
    assert journal_lines and journal_lines[-1].startswith(f"<3>cerebellar-norse: {state / 'models'}: not a directory")
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**env, "JOURNAL_STREAM": "1:2"})
    assert plain.returncode == 1
    assert plain.stderr.splitlines()[-1].startswith(f"cerebellar-norse: {state / 'models'}: not a directory")


def test_a_misspelt_variable_of_the_prefix_is_said_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """CEREBELLAR_NORSE_LOG_LEVEL=debug (meant: CEREBELLAR_NORSE_LOG) was ignored without a word: no config key (no
    ``__``), not a variable the service reads. A WARNING names it; the variables the service reads get none."""
    root_level = logging.getLogger().level
    try:
        for k in [k for k in os.environ if k.startswith("CEREBELLAR_NORSE_")]:
            monkeypatch.delenv(k)
        monkeypatch.setenv("CEREBELLAR_NORSE_LOG_LEVEL", "debug")
        monkeypatch.setenv("CEREBELLAR_NORSE_LOG", "info")
        monkeypatch.setenv("CEREBELLAR_NORSE_NUMBA_CACHE_BASE", "/tmp/x")
        monkeypatch.setenv("CEREBELLAR_NORSE_SERVER__PORT", "9090")
        buf = io.StringIO()
        setup_logging(LoggingConfig(level="ERROR"), stream=buf)
        (line,) = _lines(buf)
        assert line["level"] == "WARNING"
        assert line["message"].startswith("environment variable CEREBELLAR_NORSE_LOG_LEVEL is not one the service reads")
        assert "CEREBELLAR_NORSE_<SECTION>__<KEY>" in line["message"] and "CEREBELLAR_NORSE_LOG)" in line["message"]
    finally:
        logging.getLogger().setLevel(root_level)
