"""The state dir's lock: a ``.lock`` that is no regular file is moved aside, never waited on or written through."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from cerebellar_norse.engine.state_dir import StateDirLock
from cerebellar_norse.errors import StorageError


@pytest.mark.parametrize("what", ["FIFO", "directory", "link to /dev/null"])
def test_a_pid_file_that_is_no_regular_file_is_moved_aside_not_waited_on(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture,
                                                                         what: str) -> None:
    """A FIFO as ``.lock`` made the start wait for a reader for ever, without a line (opening it to write the pid);
    a link would have had the pid written wherever it pointed."""
    pid_file = tmp_path / ".lock"
    if what == "FIFO":
        os.mkfifo(pid_file)
    elif what == "directory":
        pid_file.mkdir()
    else:
        pid_file.symlink_to("/dev/null")
    got: list[object] = []

    def take() -> None:
        try:
            got.append(StateDirLock(tmp_path).acquire())
        except BaseException as exc:  # handed back to the test
            got.append(exc)

    with caplog.at_level(logging.WARNING):
        t = threading.Thread(target=take, daemon=True)
        t.start()
        t.join(10)
    assert got, "still taking the lock after 10 s"
    held = got[0]
    assert isinstance(held, StateDirLock), held
    try:
        assert pid_file.read_text() == f"{os.getpid()}\n" and not pid_file.is_symlink()
        (moved,) = tmp_path.glob(".lock.misplaced-*")
        assert f"moved aside to {moved}" in caplog.text
        os.rename(moved, tmp_path / "kept")  # a FIFO where the pid file goes while the lock is held: said, not read
        pid_file.unlink()
        os.mkfifo(pid_file)
        with pytest.raises(StorageError, match=r"in use by another cerebellar-norse process \(pid \?\)"):
            StateDirLock(tmp_path).acquire()
    finally:
        held.release()
