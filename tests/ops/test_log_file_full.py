"""A log file that cannot be written (full or read-only disk): one line on stderr, not a traceback per log line."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from cerebellar_norse.config import LoggingConfig
from cerebellar_norse.observability.logging import JsonFormatter, file_handler


class FullDisk:
    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        pass

    def seek(self, *args: object) -> int:
        return 0

    def tell(self) -> int:
        return 0

    def close(self) -> None:
        pass


def test_a_full_log_disk_is_said_once_then_its_recovery(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h = file_handler(LoggingConfig(file=str(tmp_path / "app.log")))
    assert h is not None
    h.setFormatter(JsonFormatter())
    good = h.stream  # type: ignore[attr-defined]
    h.stream = FullDisk()  # type: ignore[attr-defined]
    rec = logging.LogRecord("cerebellar_norse.test", logging.INFO, __file__, 1, "line", None, None)
    for _ in range(5):
        h.handle(rec)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err
    assert err.count("cannot write the log file") == 1 and "No space left on device (errno 28)" in err
    h.stream = good  # type: ignore[attr-defined]
    h.handle(rec)
    assert "is written again" in capsys.readouterr().err
    h.close()
    assert (tmp_path / "app.log").read_text().count('"message": "line"') == 1


def test_an_output_file_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from cerebellar_norse import cli, storage

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert cli.main(["make-data", "--output", str(blocker / "ticks.csv"), "--ticks", "100"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("cerebellar-norse: cannot write ") and str(blocker) in err

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.MonkeyPatch.context() as mp:  # a write that fails half way names the file it was writing
        mp.setattr(storage.os, "fsync", full)
        with pytest.raises(OSError) as exc:
            storage.atomic_write_bytes(tmp_path / "out.bin", b"x" * 10)
    assert exc.value.filename == str(tmp_path / "out.bin") and not (tmp_path / "out.bin").exists()


def test_a_bad_log_call_is_not_called_a_failing_disk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import logging as _logging

    from cerebellar_norse.observability.logging import LogFileHandler

    h = LogFileHandler(tmp_path / "x.log", maxBytes=10_000, backupCount=1, encoding="utf-8")
    rec = _logging.LogRecord("t", _logging.INFO, __file__, 1, "bad %d", ("str",), None)
    h.handle(rec)
    h.handle(_logging.LogRecord("t", _logging.INFO, __file__, 1, "good", (), None))
    h.close()
    err = capsys.readouterr().err
    assert "cannot write the log file" not in err and "is written again" not in err, err
    assert "good" in (tmp_path / "x.log").read_text()


def test_a_failed_rename_names_the_target_not_the_temporary_file(tmp_path: Path) -> None:
    from cerebellar_norse import storage

    target = tmp_path / "ACTIVE"
    target.mkdir()  # a directory where the file should be: the rename fails
    with pytest.raises(OSError) as exc:
        storage.atomic_write_bytes(target, b"v\n")
    assert exc.value.filename == str(target), exc.value
    assert not list(tmp_path.glob(".ACTIVE.*.tmp"))
