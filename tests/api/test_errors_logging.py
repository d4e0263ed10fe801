"""What the error answers log: an engine failure once per answer, except the journal's failure (logged once)."""

from __future__ import annotations

import logging

import pytest

from cerebellar_norse.api.errors import service_error
from cerebellar_norse.errors import EngineFatalError, StorageError


def test_a_reported_storage_failure_is_not_logged_again_per_answer(caplog: pytest.LogCaptureFixture) -> None:
    failed = StorageError("cannot create journal file /x: No space left on device (errno 28 ENOSPC)", "/x", 28)
    with caplog.at_level(logging.ERROR):
        first = service_error(failed)
    assert first.status == 503 and first.kind == "engine" and "ENOSPC" in first.message
    assert len(caplog.records) == 1  # not yet reported where it happened: the answer logs it
    failed.reported = True  # as the journal does when it fails
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        for _ in range(20):
            assert service_error(failed).status == 503
        service_error(EngineFatalError("device lost"))
    assert [r.getMessage() for r in caplog.records] == ["engine error: device lost"]
