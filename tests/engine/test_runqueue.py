"""``runqueue``: the host's count of runnable tasks, read as busy polling reads it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cerebellar_norse.engine import runqueue


@pytest.mark.parametrize(("text", "count"), [
    (b"0.12 0.30 0.41 3/812 4711\n", 3),
    (b"12.00 8.10 4.02 117/2048 99\n", 117),
    (b"", None),
    (b"0.12 0.30 0.41\n", None),
    (b"0.12 0.30 0.41 3 4711\n", None),
    (b"0.12 0.30 0.41 x/812 4711\n", None),
    (b"0.12 0.30 0.41 /812 4711\n", None),
])
def test_runnable_tasks_reads_the_fourth_field(text: bytes, count: int | None) -> None:
    assert runqueue.runnable_tasks(text) == count


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The module opens its file again on the next call (and the test's descriptor is closed after it)."""
    monkeypatch.setattr(runqueue, "_opened", False)
    monkeypatch.setattr(runqueue, "_fd", None)
    yield
    if runqueue._fd is not None:
        os.close(runqueue._fd)


@pytest.mark.usefixtures("fresh")
def test_nothing_is_waiting_where_the_count_cannot_be_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runqueue, "LOADAVG", str(tmp_path / "absent"))
    assert runqueue.cpu_wanted() is False
    garbled = tmp_path / "loadavg"
    garbled.write_bytes(b"not a load average\n")
    monkeypatch.setattr(runqueue, "_opened", False)
    monkeypatch.setattr(runqueue, "LOADAVG", str(garbled))
    assert runqueue.cpu_wanted() is False


@pytest.mark.usefixtures("fresh")
def test_a_count_above_the_cpus_this_process_may_use_is_a_task_waiting(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cpus = len(os.sched_getaffinity(0))
    fake = tmp_path / "loadavg"
    monkeypatch.setattr(runqueue, "LOADAVG", str(fake))
    fake.write_bytes(f"0.00 0.00 0.00 {cpus}/100 1\n".encode())
    assert runqueue.cpu_wanted() is False
    fake.write_bytes(f"0.00 0.00 0.00 {cpus + 1}/100 1\n".encode())  # read again through the descriptor kept open
    assert runqueue.cpu_wanted() is True


@pytest.mark.skipif(not Path(runqueue.LOADAVG).exists(), reason="no /proc/loadavg (not Linux)")
@pytest.mark.usefixtures("fresh")
def test_busy_processes_beyond_the_cpus_are_seen_waiting() -> None:
    """The real file: one busy process more than this process's CPUs makes a task wait."""
    cpus = len(os.sched_getaffinity(0))
    spin = "import os, time\nos.sched_setaffinity(0, %r)\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass\n"
    busy = [subprocess.Popen([sys.executable, "-c", spin % (sorted(os.sched_getaffinity(0)),)]) for _ in range(cpus + 1)]
    try:
        deadline = time.monotonic() + 10.0
        seen = False
        while not seen and time.monotonic() < deadline:
            seen = runqueue.cpu_wanted()
            time.sleep(0.01)
        assert seen
    finally:
        for p in busy:
            p.kill()
            p.wait()
