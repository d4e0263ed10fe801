"""What the error answers log: an engine failure once per answer, except the journal's failure (logged once)."""

from __future__ import annotations

import logging

import pytest
import torch

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


@pytest.mark.parametrize("failure", [RuntimeError("can't start new thread"), BlockingIOError(11, "Resource temporarily "
                                     "unavailable"), MemoryError(), InterruptedError(4, "Interrupted system call"),
                                     torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")],
                         ids=["no thread", "EAGAIN", "no memory", "EINTR", "no GPU memory"])
def test_a_request_the_host_has_no_thread_or_memory_for_is_503_capacity_said_once(
        caplog: pytest.LogCaptureFixture, failure: Exception) -> None:
    """A thread or process the host cannot start (its task limit), or memory it cannot give: 503 capacity with
    Retry-After and one WARNING line, not 500 internal with a traceback for each request."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from cerebellar_norse.api import errors as api_errors

    app = FastAPI()
    api_errors.install_error_handlers(app, lambda kind: None)

    @app.get("/work")
    async def work() -> None:
        raise failure

    api_errors._shortage_said[0] = -api_errors.HOST_SHORTAGE_LOG_S
    with caplog.at_level(logging.DEBUG, logger="cerebellar_norse.api"), TestClient(app, raise_server_exceptions=False) as c:
        answers = [c.get("/work") for _ in range(3)]
    for r in answers:
        assert r.status_code == 503 and r.json()["error"]["type"] == "capacity", r.text
        assert int(r.headers["Retry-After"]) >= 1 and "try again" in r.json()["error"]["message"]
    ours = [r for r in caplog.records if r.name == api_errors.log.name]  # the test client logs its requests too
    assert [r.levelno for r in ours] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert not any(r.exc_info for r in ours)
