"""numba's cache of compiled kernels (``NUMBA_CACHE_DIR``): a write of it that fails is no error.

numba compiles a kernel at its first call, registers the compiled code, then saves it to the cache directory; a
save that fails (a full disk, ENOSPC; a quota used up, EDQUOT; an I/O error) was raised out of that first call. At
start the service then refused every stored model as one that "cannot be served", and stopped with
``cannot start: writing failed at <state dir>: No space left on device``, naming a directory that was not full. The
cache only saves compiling again at the next start: a save that fails is said once at WARNING (the directory, the
errno) and the kernel runs as compiled. The cache's files are written to a temporary file and renamed, so a failed
save leaves no damaged entry.

Where no directory can hold the cache at all (``NUMBA_CACHE_DIR``, the package's ``__pycache__`` and the user's
``~/.cache`` all unwritable: a command run as the service's user, ``sudo -u cerebellar cerebellar-norse …``, on an
install under ``/opt`` before the service first created its home), numba raised ``RuntimeError: cannot cache
function …: no locator available`` at import, a traceback instead of the command's answer; such a kernel is now
compiled without a cache, said once at WARNING.

Importing this module installs the guard (once per process); each module defining kernels with ``cache=True``
imports it, so it is in place before any of them compiles.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from numba.core import caching, config, dispatcher

from .errors import StorageError

log = logging.getLogger("cerebellar_norse.kernels")

_lock = threading.Lock()
_said = False


def _first() -> bool:
    """True the first time in this process: the cache's trouble is said once, whatever it is."""
    global _said
    with _lock:
        if _said:
            return False
        _said = True
        return True


def _failed_save(cache: Any, exc: OSError) -> None:
    """Say (once per process) that the compiled kernels' cache cannot be written."""
    if not _first():
        return
    where = getattr(cache, "_cache_path", None) or exc.filename or "NUMBA_CACHE_DIR"
    log.warning("cannot write the compiled kernels' cache %s: %s; the kernels run as compiled, without it (the next "
                "start compiles them again, which takes longer): free space there, or set NUMBA_CACHE_DIR to a "
                "writable directory; said once", where, StorageError.os_reason(exc),
                extra={"fields": {"path": str(where), "errno": exc.errno}})


def _no_cache_dir(exc: RuntimeError) -> None:
    """Say (once per process) that no directory can hold the compiled kernels' cache."""
    if not _first():
        return
    where = getattr(config, "CACHE_DIR", "") or "NUMBA_CACHE_DIR"
    log.warning("no writable directory for the compiled kernels' cache (%s, the package's __pycache__ and ~/.cache "
                "cannot be written): the kernels run as compiled, without it (each run compiles them again, which "
                "takes longer): set NUMBA_CACHE_DIR to a writable directory; said once", where,
                extra={"fields": {"path": str(where), "reason": str(exc)}})


def install() -> None:
    """Make numba keep a kernel whose cache cannot be written, or has no directory to go to (idempotent)."""
    enable = dispatcher.Dispatcher.enable_caching
    if not getattr(enable, "_cerebellar_norse_guard", False):

        def enable_caching(self: Any) -> None:
            try:
                enable(self)
            except RuntimeError as exc:
                if "no locator available" not in str(exc):
                    raise
                _no_cache_dir(exc)  # self._cache stays the dispatcher's NullCache: compiled, never saved

        enable_caching._cerebellar_norse_guard = True  # type: ignore[attr-defined]
        dispatcher.Dispatcher.enable_caching = enable_caching  # type: ignore[method-assign]
    save = caching.Cache.save_overload
    if getattr(save, "_cerebellar_norse_guard", False):
        return

    def save_overload(self: Any, sig: Any, data: Any) -> None:
        try:
            save(self, sig, data)
        except OSError as exc:
            _failed_save(self, exc)

    save_overload._cerebellar_norse_guard = True  # type: ignore[attr-defined]
    caching.Cache.save_overload = save_overload  # type: ignore[method-assign]


install()
