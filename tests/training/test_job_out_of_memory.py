"""A training job that runs out of memory: its error names the cause and a fix, even when its report is lost."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest
from training_helpers import ConfigFactory

from cerebellar_norse.training import jobs


class Reports:
    """The job's report pipe: what was put, and whether it was closed before the process exits."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.closed = False

    def put(self, item: tuple[str, dict[str, Any]]) -> None:
        assert not self.closed, "put after close"
        self.sent.append(item)

    def close(self) -> None:
        self.closed = True


class StopFlag:
    """The job's stop flag, never set."""

    def is_set(self) -> bool:
        return False


def torch_cannot_allocate(*_a: Any, **_k: Any) -> NoReturn:
    """torch's CPU allocator failing, for real: 1 EiB is beyond any address space (overcommit or not)."""
    import torch

    torch.empty(1 << 60, dtype=torch.uint8)
    raise AssertionError("torch allocated 1 EiB")


def memory_error(*_a: Any, **_k: Any) -> NoReturn:
    raise MemoryError


@pytest.mark.parametrize("no_memory", [memory_error, torch_cannot_allocate], ids=["MemoryError", "torch allocator"])
def test_a_memory_error_in_training_is_reported_as_out_of_memory_and_exits_with_its_code(
        make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch, no_memory: Any) -> None:
    """A MemoryError, or torch's CPU allocator failing (a RuntimeError: ``DefaultCPUAllocator: can't allocate
    memory``, which the job reported as an unexplained failure), ends the job as out of memory, naming the fix."""

    def exit_(code: int) -> NoReturn:
        raise SystemExit(code)

    monkeypatch.setattr(jobs, "run_training", no_memory)
    monkeypatch.setattr(jobs, "lower_priority", lambda: None)  # a job process's own priority: not pytest's
    # and its own thread limits: set in pytest's process, NUMBA_NUM_THREADS would make numba refuse every later compile
    monkeypatch.setattr(jobs, "limit_threads", lambda n: None)
    monkeypatch.setattr(jobs.os, "_exit", exit_)
    out = Reports()
    with pytest.raises(SystemExit) as ended:
        jobs._job_main(out, StopFlag(), make_config().model_dump_json(), [], None)
    assert ended.value.code == jobs.EXIT_OUT_OF_MEMORY  # what the service reads when the report below was lost
    assert out.sent == [("failed", {"error": jobs.OUT_OF_MEMORY})]
    assert "ran out of memory" in jobs.OUT_OF_MEMORY and "raise the limit" in jobs.OUT_OF_MEMORY
    assert out.closed  # sent and the pipe closed before the exit, which skips every cleanup


def test_a_job_process_that_exited_out_of_memory_without_a_report_names_the_cause() -> None:
    assert jobs.exit_error(jobs.EXIT_OUT_OF_MEMORY) == jobs.OUT_OF_MEMORY
    assert jobs.exit_error(1) == "training process exited with code 1"
