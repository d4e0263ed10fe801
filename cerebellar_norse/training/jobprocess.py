"""A training job's process, and the two pipes between it and the service.

The process is started with :mod:`subprocess` (the service's Python, its ``sys.path``), not with
:mod:`multiprocessing`: a ``spawn`` process, a ``multiprocessing.Queue`` and ``Event`` start multiprocessing's
resource tracker (a second process, for their named semaphores), which outlived the service's main process at every
stop after a job, and systemd killed it with SIGKILL (``Killing process N (python) with signal SIGKILL`` in the
journal). Here nothing but the job process itself is started, and it holds no named semaphore:

- reports (progress, the result) go to the service over one pipe, each a pickled message (:class:`Reports` writes,
  :class:`ReportReader` reads); the service holds no write end of it, so its read ends (``EOFError``) when the
  process does, however it dies, even in the middle of a message;
- the stop request goes to the process over another pipe (:class:`StopSender` sets it, :class:`StopFlag` reads it):
  a byte written, or the service's end closed (the service gone) both read as "stop".

The job's arguments reach the process on its standard input (pickled builtins only), never in its command line,
where ``ps`` would show the config (its ``api_token``) to every user of the host.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import pickle
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_S = 0.5  # how often the job process looks whether the service is still its parent (s)

# What the job process runs: first ask the kernel to kill it when the service ends (before anything is imported: a
# process stopped while importing the training code, a second or more, would otherwise outlive a killed service,
# stopped), then read its arguments from stdin (plain builtins, so unpickling imports nothing), then take the
# service's sys.path before importing the package. child_main then looks whether the service ended before the request.
_BOOT = ("import sys\n"
         "if sys.platform.startswith('linux'):\n"
         "    try:\n"
         f"        import ctypes; ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG}, {int(signal.SIGKILL)}, 0, 0, 0)\n"
         "    except Exception:\n"
         "        pass\n"
         "import pickle; d = pickle.load(sys.stdin.buffer); sys.path[:] = d['path']\n"
         "from cerebellar_norse.training.jobprocess import child_main; child_main(d)\n")
CLOSE_WAIT_S = 1.0  # how long closing a reader waits for a read under way before leaving the close to that read
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def package_fingerprint(root: Path = PACKAGE_DIR) -> str:
    """What identifies the installed package's code on disk: its number of ``.py`` files and their latest
    modification time (ns), ``"<count>:<mtime_ns>"``; ``""`` when it cannot be read. An upgrade (``pip install``)
    replaces the files, so the fingerprint changes."""
    try:
        times = [p.stat().st_mtime_ns for p in root.rglob("*.py")]
    except OSError:
        return ""
    return f"{len(times)}:{max(times, default=0)}"


@functools.cache
def package_at_start() -> str:
    """:func:`package_fingerprint` as it was when this process first asked (the service: when it built its job
    manager, at start), to tell a job process whether the code on disk is still the code the service runs."""
    return package_fingerprint()


PACKAGE_CHANGED = ("the installed cerebellar-norse changed on disk since the service started (an upgrade without a "
                   "restart): a job runs the code on disk, which may not fit the running service; restart the service "
                   "(systemctl restart cerebellar-norse), then start the job again")


class Reports:
    """The job process's end of the report pipe: ``put(item)`` sends one picklable item (blocking while the pipe is
    full, until the service reads), written when it returns."""

    def __init__(self, fd: int) -> None:
        self._conn: Connection | None = Connection(fd, readable=False)

    def put(self, item: Any) -> None:
        """Send ``item``; nothing once closed."""
        if self._conn is not None:
            self._conn.send(item)

    def close(self) -> None:
        """Close the pipe (the service reads its end)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class StopFlag:
    """The job process's end of the stop pipe: set once the service wrote to it, or closed its end (it is gone)."""

    def __init__(self, fd: int) -> None:
        self._poll = select.poll()  # (not select.select: the fd may lie above FD_SETSIZE)
        self._poll.register(fd, select.POLLIN)

    def is_set(self) -> bool:
        """Whether the service asked the job to stop (or can no longer ask anything)."""
        return bool(self._poll.poll(0))


class ReportReader:
    """The service's end of the report pipe: ``get(block, timeout)`` as ``multiprocessing.Queue.get`` (``queue.Empty``
    when nothing came within ``timeout`` s, ``EOFError`` once the process's end is closed and everything was read)."""

    def __init__(self, fd: int) -> None:
        self._conn: Connection | None = Connection(fd, writable=False)
        self._lock = threading.Lock()  # a read (in an executor thread) and the close never use the fd at once
        self._close_pending = False

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next report; ``queue.Empty`` after ``timeout`` s (at once when not ``block``) without one."""
        with self._lock:
            try:
                if self._conn is None:
                    raise EOFError("the report pipe is closed")
                if not self._conn.poll(timeout if block else 0.0):
                    raise queue.Empty
                return self._conn.recv()
            finally:
                if self._close_pending:
                    self._close()

    def close(self) -> None:
        """Close the pipe: now, or when the read under way ends (one blocked on a process that cannot die: the
        close must not wait for it)."""
        if self._lock.acquire(timeout=CLOSE_WAIT_S):
            try:
                self._close()
            finally:
                self._lock.release()
        else:
            self._close_pending = True

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class StopSender:
    """The service's end of the stop pipe: :meth:`set` asks the process to stop (at its next step)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self._set = False

    def set(self) -> None:
        """Ask the job to stop (once; a process already gone is no error)."""
        if self._fd is not None and not self._set:
            self._set = True
            with contextlib.suppress(OSError):  # (EPIPE: the process ended)
                os.write(self._fd, b"\x01")

    def close(self) -> None:
        """Close the service's end (the process reads that as a stop too)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class JobProcess:
    """A started job process, with ``multiprocessing.Process``'s interface as far as the service uses it (``pid``,
    ``exitcode``: negative for the signal that ended it, ``is_alive``, ``terminate``, ``kill``, ``join``)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid

    @property
    def exitcode(self) -> int | None:
        """The exit status once ended (``-N``: signal N), else None."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        """Whether the process runs (an ended one is reaped)."""
        return self._popen.poll() is None

    def terminate(self) -> None:
        """SIGTERM (nothing when it has ended)."""
        if self.is_alive():
            self._popen.terminate()

    def kill(self) -> None:
        """SIGKILL (nothing when it has ended)."""
        if self.is_alive():
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` s (for good: None) for it to end."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)


def start_job_process(target: str, args: tuple[Any, ...], package: str = "") -> tuple[JobProcess, ReportReader, StopSender]:
    """Start ``target`` (``"module:function"``) in a new process of this Python as ``function(reports, stop, *args)``
    (``reports``: :class:`Reports`, ``stop``: :class:`StopFlag`); ``args`` are builtins (str, int, list, ...).
    ``package``: the :func:`package_fingerprint` the caller runs; the process reports :data:`PACKAGE_CHANGED` as its
    failure instead when the package on disk has another ("": not checked).

    Returns the process and the service's ends of its pipes. OSError (no process, memory or descriptor: EAGAIN,
    ENOMEM, EMFILE) leaves nothing open.
    """
    opened: list[int] = []
    try:
        out_r, out_w = os.pipe()
        opened += [out_r, out_w]
        stop_r, stop_w = os.pipe()
        opened += [stop_r, stop_w]
        popen = subprocess.Popen([sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, pass_fds=(out_w, stop_r),
                                 close_fds=True)
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    # the process holds its own ends now: the report pipe ends when the process does, the stop pipe when we close it
    os.close(out_w)
    os.close(stop_r)
    payload = {"path": list(sys.path), "target": target, "args": args, "reports": out_w, "stop": stop_r,
               "package": package, "parent": os.getpid()}
    assert popen.stdin is not None
    try:
        with popen.stdin:
            popen.stdin.write(pickle.dumps(payload))
    except OSError:  # it died at once (BrokenPipe): its exit code says why, and the report pipe reads EOF
        pass
    return JobProcess(popen), ReportReader(out_r), StopSender(stop_w)


def die_with_parent(parent_pid: int) -> None:
    """Make this process end when ``parent_pid`` (the service) does, however it ends (kill -9 included).

    Linux: the kernel sends SIGKILL when the parent dies (``prctl(PR_SET_PDEATHSIG)``, asked for by :data:`_BOOT`
    before anything is imported). Everywhere: a daemon thread polls the parent pid every :data:`PARENT_POLL_S` s and
    exits the process without cleanup (``os._exit``) once the parent is gone. A parent already gone (before the
    request took effect) exits now.
    """

    def gone() -> bool:
        return os.getppid() != parent_pid

    if gone():
        os._exit(1)

    def watch() -> None:
        while not gone():
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def child_main(payload: dict[str, Any]) -> None:
    """The job process's entry (see :data:`_BOOT`): run the target with its pipes, ending with the process that
    started it (``payload["parent"]``, :func:`die_with_parent`) from before the target's module is imported."""
    if payload.get("parent") is not None:
        die_with_parent(int(payload["parent"]))
    devnull = os.open(os.devnull, os.O_RDONLY)  # stdin was the arguments' pipe: nothing more comes from it
    os.dup2(devnull, 0)
    os.close(devnull)
    reports = Reports(payload["reports"])
    try:
        started_with = payload.get("package", "")
        if started_with and package_fingerprint() not in ("", started_with):
            reports.put(("failed", {"error": PACKAGE_CHANGED}))
            os._exit(1)
        module, _, name = payload["target"].partition(":")
        func = getattr(importlib.import_module(module), name)
        func(reports, StopFlag(payload["stop"]), *payload["args"])
    finally:
        reports.close()
    # Everything the job wrote is on disk (atomic, fsynced) and its result sent: the interpreter's teardown (about 2 s
    # with torch and numba loaded) would only delay a stop of the service that waits for this process.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)
