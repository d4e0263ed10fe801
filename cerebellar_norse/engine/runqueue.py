"""Whether a task is waiting for a CPU that busy polling keeps busy.

Busy polling (``performance.busy_poll_us``) keeps a CPU busy so that the next tick finds
it awake. That is free while a CPU is idle for everything else, and costly when it is
not: a client woken by its answer can then be queued on the polling CPU and wait for the
window to run out (docs/benchmarks.md, "Polling only while a CPU is free"). The
engine stops polling as soon as either of two signs says a task wants a CPU:

* **The host is short of CPUs.** The fourth field of ``/proc/loadavg`` (``running/total``)
  counts the tasks running or ready to run on any CPU at the moment it is read, the
  reader included. Above the host's online CPUs, some task is waiting. One ``pread`` of
  a descriptor kept open, about a microsecond. The count is the host's, so it is
  compared with the host's CPUs, not with the service's own: a service confined to one
  CPU (``CPUAffinity=``, a cpuset) beside a client running on another would otherwise see
  the client as waiting and never poll (docs/benchmarks.md, "Polling on a confined
  service").
* **A task took the polling thread's CPU.** The thread's count of involuntary context
  switches (``getrusage(RUSAGE_THREAD).ru_nivcsw``, about 0.3 µs) rises when the
  scheduler switched it out for a task that was runnable on its CPU: a task waiting for
  that CPU, wherever the host-wide count stands. One of the service's CPUs can be
  wanted while the host as a whole has CPUs free, which only this sign sees.

Where ``/proc/loadavg`` cannot be read or ``RUSAGE_THREAD`` does not exist (not Linux),
that sign never reports a task waiting.
"""

from __future__ import annotations

import os
import resource

LOADAVG = "/proc/loadavg"
_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)

_fd: int | None = None
_opened = False
_cpus = 0
_switches = -1  # the calling thread's involuntary switches at the previous call; -1: no call yet


def host_cpus() -> int:
    """The host's online CPUs (at least 1), the count ``/proc/loadavg``'s runnable tasks are compared with."""
    try:
        online = os.sysconf("SC_NPROCESSORS_ONLN")
    except (AttributeError, ValueError, OSError):
        online = -1
    return online if online > 0 else (os.cpu_count() or 1)


def _open() -> int | None:
    global _fd, _opened, _cpus
    _opened = True
    _cpus = host_cpus()
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


def host_short() -> bool:
    """True while more tasks are runnable on the host than it has CPUs online (a task is waiting somewhere)."""
    fd = _fd if _opened else _open()
    if fd is None:
        return False
    try:
        running = runnable_tasks(os.pread(fd, 128, 0))
    except OSError:
        return False
    return running is not None and running > _cpus


def switched_out() -> bool:
    """True if the calling thread was switched out involuntarily since its previous call (False at the first).

    The count is per thread: only one thread (the event loop's) may call this.
    """
    global _switches
    if _RUSAGE_THREAD is None:
        return False
    now = resource.getrusage(_RUSAGE_THREAD).ru_nivcsw
    before, _switches = _switches, now
    return before >= 0 and now != before


def cpu_wanted() -> bool:
    """True while a task waits for a CPU: the host short of CPUs, or this thread's CPU taken by another task.

    Both signs are read at every call, so that the switch count is always measured since the previous round.
    """
    short = host_short()
    return switched_out() or short
