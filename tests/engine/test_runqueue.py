"""``runqueue``: the host's count of runnable tasks and the polling thread's involuntary switches, read as busy
polling reads them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

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
    assert runqueue.host_short() is False
    garbled = tmp_path / "loadavg"
    garbled.write_bytes(b"not a load average\n")
    monkeypatch.setattr(runqueue, "_opened", False)
    monkeypatch.setattr(runqueue, "LOADAVG", str(garbled))
    assert runqueue.host_short() is False


@pytest.mark.usefixtures("fresh")
def test_a_count_above_the_hosts_cpus_is_a_task_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host-wide count is compared with the host's CPUs, however few of them this process may use."""
    cpus = runqueue.host_cpus()
    assert cpus >= len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # confined to one CPU: the threshold stays the host's
    fake = tmp_path / "loadavg"
    monkeypatch.setattr(runqueue, "LOADAVG", str(fake))
    fake.write_bytes(f"0.00 0.00 0.00 {cpus}/100 1\n".encode())
    assert runqueue.host_short() is False
    fake.write_bytes(f"0.00 0.00 0.00 {cpus + 1}/100 1\n".encode())  # read again through the descriptor kept open
    assert runqueue.host_short() is True


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The involuntary switches ``getrusage`` reports, set by the test; no call of ``switched_out`` made yet."""
    count = [0]
    monkeypatch.setattr(runqueue, "_switches", -1)
    monkeypatch.setattr(runqueue, "_RUSAGE_THREAD", 1)
    monkeypatch.setattr(runqueue.resource, "getrusage",
                        lambda who: SimpleNamespace(ru_nivcsw=count[0]) if who == 1 else pytest.fail("not the thread"))
    return count


def test_a_switch_since_the_previous_call_is_a_task_wanting_this_cpu(counted: list[int]) -> None:
    counted[0] = 7
    assert runqueue.switched_out() is False  # the first call only takes the count
    assert runqueue.switched_out() is False
    counted[0] = 8
    assert runqueue.switched_out() is True
    assert runqueue.switched_out() is False  # counted since the previous call, not since the first


@pytest.mark.usefixtures("fresh")
def test_cpu_wanted_is_either_sign_and_reads_both_each_time(counted: list[int], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "loadavg"
    monkeypatch.setattr(runqueue, "LOADAVG", str(fake))
    fake.write_bytes(f"0.00 0.00 0.00 {runqueue.host_cpus() + 1}/100 1\n".encode())
    assert runqueue.cpu_wanted() is True  # host short (the switch count taken meanwhile)
    counted[0] = 3
    fake.write_bytes(b"0.00 0.00 0.00 1/100 1\n")
    assert runqueue.cpu_wanted() is True  # switched out since the previous call
    assert runqueue.cpu_wanted() is False


def test_no_thread_count_is_no_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runqueue, "_RUSAGE_THREAD", None)
    monkeypatch.setattr(runqueue, "_switches", -1)
    assert runqueue.switched_out() is False
    assert runqueue.switched_out() is False


SHARE_A_CPU = """
import os, subprocess, sys, time
from cerebellar_norse.engine import runqueue
cpu = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})
runqueue.switched_out()
spin = subprocess.Popen([sys.executable, "-c",
    "import os, time\\nos.sched_setaffinity(0, {%d})\\nend = time.monotonic() + 20\\nwhile time.monotonic() < end: pass" % cpu])
try:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if runqueue.switched_out():
            print("switched out")
            break
finally:
    spin.kill()
    spin.wait()
"""


@pytest.mark.skipif(runqueue._RUSAGE_THREAD is None, reason="no per-thread resource usage (not Linux)")
def test_a_task_on_the_same_cpu_switches_the_poller_out() -> None:
    """The real count: a busy process confined to the CPU of a thread that keeps it busy takes turns with it."""
    done = subprocess.run([sys.executable, "-c", SHARE_A_CPU], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "switched out"


@pytest.mark.skipif(not Path(runqueue.LOADAVG).exists(), reason="no /proc/loadavg (not Linux)")
@pytest.mark.skipif(runqueue.host_cpus() > 32, reason="too many CPUs to fill with busy processes")
@pytest.mark.usefixtures("fresh")
def test_busy_processes_beyond_the_hosts_cpus_are_seen_waiting() -> None:
    """The real file: one busy process more than the host's CPUs makes a task wait."""
    spin = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass\n"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(runqueue.host_cpus() + 1)]
    try:
        deadline = time.monotonic() + 10.0
        seen = False
        while not seen and time.monotonic() < deadline:
            seen = runqueue.host_short()
            time.sleep(0.01)
        assert seen
    finally:
        for p in busy:
            p.kill()
            p.wait()
