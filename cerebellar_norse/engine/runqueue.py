"""Whether a task is waiting for a CPU, from the kernel's count of runnable tasks.

Busy polling (``performance.busy_poll_us``) keeps a CPU busy so that the next tick finds
it awake. That is free while a CPU is idle for everything else, and costly when it is
not: a client woken by its answer can then be queued on the polling CPU and wait for the
window to run out (docs/benchmarks.md, "Polling only while a CPU is free"). The
engine stops polling as soon as the host has more runnable tasks than this process
may use CPUs.

The count is the fourth field of ``/proc/loadavg`` (``running/total``): the tasks
running or ready to run on any CPU at the moment it is read, the reader included. One
``pread`` of a descriptor kept open, about a microsecond. Where the file cannot be read
(not Linux), nothing is ever reported waiting.
"""

from __future__ import annotations

import os

LOADAVG = "/proc/loadavg"

_fd: int | None = None
_opened = False
_cpus = 0


def _open() -> int | None:
    global _fd, _opened, _cpus
    _opened = True
    try:
        _cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        _cpus = os.cpu_count() or 1
    try:
        _fd = os.open(LOADAVG, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        _fd = None
    return _fd


def runnable_tasks(data: bytes) -> int | None:
    """The count of runnable tasks in ``/proc/loadavg``'s text (``0.12 0.30 0.41 3/812 4711``); None if malformed."""
    fields = data.split()
    if len(fields) < 4:
        return None
    running, slash, _ = fields[3].partition(b"/")
    return int(running) if slash and running.isdigit() else None


def cpu_wanted() -> bool:
    """True while more tasks are runnable on the host than this process may use CPUs (its affinity mask)."""
    fd = _fd if _opened else _open()
    if fd is None:
        return False
    try:
        running = runnable_tasks(os.pread(fd, 128, 0))
    except OSError:
        return False
    return running is not None and running > _cpus
