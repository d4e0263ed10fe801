"""Recording while writes fail (a full disk), then succeed again.

A full disk is stood in for by the process's file size limit (``RLIMIT_FSIZE`` of 0:
every write that would grow a file fails, as on a full file system, while files can
still be created, read, renamed and removed), so the test needs no mount.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import T0

from cerebellar_norse.engine.recorder import TickRecorder
from cerebellar_norse.engine.recording import read_recording, verify_recordings
from cerebellar_norse.engine.recording_format import checksum_path
from cerebellar_norse.ticks import Tick


@contextlib.contextmanager
def writes_failing() -> Iterator[None]:
    """Every write that would grow a file fails (EFBIG) until the block ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the error, not the signal's default (exit)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def step(rec: TickRecorder, ticks: list[Tick]) -> None:
    rec.record(ticks, np.tile([0.25, 0.5, 0.25], (len(ticks), 1)), "v1")
    assert rec.flush()


def ticks_from(start: int, n: int = 3) -> list[Tick]:
    return [Tick(100.0 + i, 1.0, T0 + start + i, "A") for i in range(n)]


def test_a_full_disk_leaves_no_empty_recordings_and_every_file_checksummed_once_writes_work(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rec = TickRecorder(tmp_path)
    step(rec, ticks_from(0))
    (first,) = sorted(tmp_path.glob("ticks-*.csv"))
    with caplog.at_level(logging.INFO, logger="cerebellar_norse.engine.recorder"), writes_failing():
        for k in range(1, 6):  # the file being written fails, then each step's new file fails at its header
            step(rec, ticks_from(10 * k))
    assert sorted(tmp_path.glob("ticks-*")) == [first]  # no empty file per failed step, no checksum yet
    assert [r.getMessage() for r in caplog.records if "not checksummed" in r.getMessage()] == [
        f"recording {first} not checksummed: [Errno 27] File too large: '{checksum_path(first)}'; "
        "retried when a write succeeds again"]

    step(rec, ticks_from(100))  # writes work again
    rec.close()
    first_again, second = sorted(tmp_path.glob("ticks-*.csv"))
    assert first_again == first and checksum_path(first).exists() and checksum_path(second).exists()
    assert verify_recordings(tmp_path).problems == []
    assert read_recording(first).ticks == ticks_from(0)
    assert read_recording(second).ticks == ticks_from(100)
    assert rec.dropped == 15 and rec.written == 6
