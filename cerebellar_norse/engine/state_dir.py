"""The state dir's identity file (``state-id``) and its lock (``.lock``): one service per state dir.

The identity is a random id written atomically and checksummed at the state dir's first
start; every checkpoint and journal segment header carries it, so files copied in from
another service's state dir are told apart (:mod:`.journal`, :mod:`.persistence`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
import time
from pathlib import Path

from ..errors import CheckpointError, StorageError, quoted
from ..storage import read_checksummed, read_file, read_state_file, unseal, what_is_at, write_checksummed
from .persistence import is_state_id, quarantine

log = logging.getLogger("cerebellar_norse.engine")

LOCK_FILE = ".lock"
STATE_ID_FILE = "state-id"  # the state dir's identity (not a dot file: ``cp -r backup/* <state_dir>/`` copies it too)


def read_state_id(state_dir: Path) -> str | None:
    """The identity in ``<state_dir>/state-id``, or None when there is no such file.

    Raises:
        CheckpointError: the file is damaged (checksum, not ours, no id in it).
        StorageError: the file is there but cannot be read (permissions): fix it, lose nothing.
    """
    path = Path(state_dir) / STATE_ID_FILE
    if not path.exists() and not path.is_symlink():
        return None
    data = read_state_file(path, "the state dir identity")
    payload = read_checksummed(path) if data is None else unseal(data, str(path))  # (unreadable: damaged)
    try:
        sid = json.loads(payload)["state_id"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"not a state dir identity ({type(exc).__name__}: {exc})", str(path)) from None
    if not is_state_id(sid):
        raise CheckpointError(f"not a state dir identity ({quoted(sid, 80) if isinstance(sid, str) else repr(sid)})",
                              str(path))
    return sid


def write_state_id(state_dir: Path, state_id: str) -> None:
    """Write ``<state_dir>/state-id`` atomically (temporary file, fsync, rename), checksummed.

    Raises:
        OSError: it could not be written.
    """
    meta = {"state_id": state_id, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_checksummed(Path(state_dir) / STATE_ID_FILE, (json.dumps(meta, sort_keys=True) + "\n").encode())


class StateDirLock:
    """An exclusive ``flock`` on the state dir itself, with this process's pid in ``<state_dir>/.lock``: one service
    per state dir.

    The lock is on the directory, not on the pid file, so deleting or replacing ``.lock``
    does not let a second process in. The kernel releases it when the process ends,
    however it ends.
    """

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / LOCK_FILE
        self.fd: int | None = None
        self._identity: tuple[int, int] | None = None  # (device, inode) of the directory locked

    def acquire(self) -> StateDirLock:
        """Take the lock, or raise StorageError naming the process that holds it."""
        try:
            fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise StorageError.from_os_error("state dir cannot be opened:", self.dir, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            try:
                other = read_file(self.path).decode("ascii", errors="replace").strip()[:32] or "?"
            except OSError:
                other = "?"
            raise StorageError(f"state dir {self.dir} is in use by another cerebellar-norse process (pid {other}); "
                               "one service per state dir", str(self.path)) from None
        try:
            self._misplaced_pid_file_aside()
            pid_fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
            try:
                os.write(pid_fd, f"{os.getpid()}\n".encode())
            finally:
                os.close(pid_fd)
        except OSError as exc:
            os.close(fd)
            raise StorageError.from_os_error("state dir is not writable:", self.path, exc) from None
        st = os.fstat(fd)
        self.fd, self._identity = fd, (st.st_dev, st.st_ino)
        return self

    def _misplaced_pid_file_aside(self) -> None:
        """Move aside (``.lock.misplaced-<UTC time>``, WARNING) what stands where the pid file goes and is no regular
        file: a FIFO made the start wait for a reader for ever, without a line; a symbolic link would have the pid
        written wherever it points. It holds no state (the lock is on the directory), so nothing is lost."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode):
            return
        what = what_is_at(self.path, follow_links=False)
        moved = quarantine(self.path, "misplaced")
        log.warning("%s is not a regular file (%s): moved aside to %s; the pid file is written anew", self.path,
                    what, moved)

    def moved(self) -> str | None:
        """Why the state dir's path no longer names the directory locked ("no longer exists", "now names another
        directory": it was moved or replaced while held), or None while it does (or the lock is not held)."""
        if self._identity is None:
            return None
        try:
            st = os.stat(self.dir)
        except FileNotFoundError:
            return "no longer exists"
        except OSError:  # unreadable now: the write that follows says why
            return None
        return None if (st.st_dev, st.st_ino) == self._identity else "now names another directory"

    def release(self) -> None:
        """Release the lock (closing the descriptor releases it)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            self._identity = None
