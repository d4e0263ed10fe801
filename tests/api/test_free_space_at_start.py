"""A state dir that cannot hold the next checkpoint is refused at start, not after the first tick."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api import lifecycle
from cerebellar_norse.api.server import build_service
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.engine.persistence import STATE_FILE
from cerebellar_norse.errors import StorageError


def _free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    real = shutil.disk_usage

    def disk_usage(path: Any) -> Any:
        u = real(path)
        return type(u)(u.total, u.total - free, free)

    monkeypatch.setattr(lifecycle.shutil, "disk_usage", disk_usage)


def _state(tmp_path: Path) -> Any:
    env = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path), "CEREBELLAR_NORSE_PERFORMANCE__JOURNAL_SEGMENT_SIZE": "1MB",
           **NO_BOOTSTRAP}
    return build_service(load_checked_config(None, environ=env))


def _start(tmp_path: Path) -> None:
    """Prepare a service's state as a start does, then stop it (releasing the state dir)."""
    state = _state(tmp_path)
    try:
        lifecycle.prepare_state(state)
    finally:
        if state.durability is not None:
            state.durability.close(save=False)


def test_less_free_space_than_a_checkpoint_refuses_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _start(tmp_path)  # a first start writes the state dir's checkpoint
    size = (tmp_path / STATE_FILE).stat().st_size
    assert size > 0
    _free(monkeypatch, size - 1)
    with pytest.raises(StorageError, match=rf"has {size - 1} bytes free, less than the {size} bytes its next checkpoint"):
        _start(tmp_path)


def test_room_for_a_checkpoint_but_not_a_journal_file_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    _start(tmp_path)
    size = (tmp_path / STATE_FILE).stat().st_size
    _free(monkeypatch, size + 1000)  # far less than the 1 MB journal file
    with caplog.at_level(logging.WARNING):
        _start(tmp_path)
    assert "the journal's next file (performance.journal_segment_size = 1000000 bytes) does not" in caplog.text
    _free(monkeypatch, size + 2_000_000)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _start(tmp_path)
    assert "bytes free" not in caplog.text


def test_a_file_system_that_reports_no_figures_is_not_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ramfs, tmpfs mounted without a size and FUSE file systems without statfs report 0 bytes of 0: the free space
    is unknown there, not 0 (they take writes), so the start goes ahead."""
    _start(tmp_path)
    monkeypatch.setattr(lifecycle.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(0, 0, 0))
    _start(tmp_path)
