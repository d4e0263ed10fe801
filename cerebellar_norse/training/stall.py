"""Whether a running training job's process still makes progress (a stopped, frozen or hung process does not).

A job reports progress after every training step; between two reports (an epoch's validation pass, reading a large
file, storing the model) it may be silent for minutes while it computes. So a job counts as stalled only when it has
neither reported progress nor used any CPU time (``/proc/<pid>/stat``: user + system time, all its threads) for
``training.stall_warning_s``: a process stopped by SIGSTOP or a debugger, frozen in a cgroup, or hung in an
uninterruptible wait (D state, a dead network mount) uses none, a working one always some.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

log = logging.getLogger("cerebellar_norse.training")

STATE_WORDS = {"R": "running", "S": "sleeping", "D": "in an uninterruptible wait (D state: I/O, a dead mount)",
               "T": "stopped (SIGSTOP, a cgroup freezer)", "t": "stopped by a debugger (traced)", "Z": "a zombie"}
CHECK_EVERY_S = 1.0  # how often the process's CPU time is read (s)


def state_words(seen: tuple[float, str] | None) -> str:
    """The process state of a :func:`process_activity` reading in words (``"unknown"`` where none was read)."""
    return "unknown" if seen is None else STATE_WORDS.get(seen[1], seen[1])


def process_activity(pid: int) -> tuple[float, str] | None:
    """CPU time used so far by process ``pid`` (user + system, s) and its state letter (``R``, ``S``, ``D``, ``T``,
    …), from ``/proc/<pid>/stat``; None where it cannot be read (no /proc, the process gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces and parentheses
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    except (IndexError, ValueError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK"), fields[0]


@dataclass
class StallWatch:
    """The stall state of one running job.

    Attributes:
        job_id: the job.
        last_active: ``time.monotonic()`` (s) when the job last reported progress or was seen using CPU time.
        cpu_s: its process's CPU time (s) at the last check.
        checked: ``time.monotonic()`` of the last check.
        stalled_since: ``time.monotonic()`` of the start of the stall it is in (``last_active``), None when none.
    """

    job_id: str
    last_active: float
    cpu_s: float | None = None
    checked: float = -1e9
    stalled_since: float | None = None

    def reported(self, now: float) -> float | None:
        """The job reported progress at ``now``: the seconds its stall had lasted, if it was stalled (said at INFO)."""
        self.last_active = now
        return self._resumed(now)

    def check(self, pid: int | None, now: float, limit_s: float) -> float | None:
        """Read the process's CPU time (at most every :data:`CHECK_EVERY_S`) and return the seconds the job has been
        inactive (no progress, no CPU time) once that is at least ``limit_s``, else None. Logs one WARNING when a
        stall begins and one INFO when it ends."""
        if now - self.checked >= CHECK_EVERY_S and pid is not None:
            self.checked = now
            seen = process_activity(pid)
            if seen is not None:
                if self.cpu_s is not None and seen[0] > self.cpu_s:
                    self.last_active = now
                    self._resumed(now)
                self.cpu_s = seen[0]
            idle = now - self.last_active
            if idle >= limit_s and self.stalled_since is None:
                self.stalled_since = self.last_active
                state = state_words(seen)
                log.warning("training job %s is stalled: no progress and no CPU time for %.0f s (its process %s is %s); "
                            "every new job is refused (409) while it runs: continue it (kill -CONT, thaw its cgroup, "
                            "restore the mount) or end it with DELETE /training/%s", self.job_id, idle, pid, state,
                            self.job_id, extra={"fields": {"job_id": self.job_id, "pid": pid, "stalled_s": round(idle, 1),
                                                           "process_state": seen[1] if seen is not None else None}})
        idle = now - self.last_active
        return idle if self.stalled_since is not None and idle >= limit_s else None

    def _resumed(self, now: float) -> float | None:
        if self.stalled_since is None:
            return None
        lasted = now - self.stalled_since
        self.stalled_since = None
        log.info("training job %s makes progress again after %.0f s stalled", self.job_id, lasted,
                 extra={"fields": {"job_id": self.job_id, "stalled_s": round(lasted, 1)}})
        return lasted
